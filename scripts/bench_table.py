#!/usr/bin/env python3
"""Pairs every headsum kernel with its oneDNN twin and prints a table.

Runs headsum_bench (or reads the JSON it wrote) with

    --benchmark_format=json --benchmark_repetitions=N
    --benchmark_report_aggregates_only=true

and, for each benchmark name such as

    BM_attention/headsum/B:1/H:8/Hkv:8/Sq:512/Skv:512/L:64/causal:1/threads:2

finds the row whose second field is "onednn" instead, then prints kernel,
shape, threads, GFLOP/s of both, the ratio oneDNN time / headsum time (> 1:
headsum is faster) and the share of the measured peak (threads x the
single-core FMA peak the benchmark probes at start-up).  Medians throughout.

    OMP_PROC_BIND=true python3 scripts/bench_table.py \\
        --bench build/bench/headsum_bench --repetitions 5 --plot bench.png
    python3 scripts/bench_table.py --json results.json --markdown

--plot draws GFLOP/s against sequence length per kernel, headsum and oneDNN,
with matplotlib when it imports, else as an SVG written by hand.
Python 3.11 standard library only (matplotlib optional).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

HEADSUM = "headsum"
ONEDNN = "onednn"
IMPLS = (HEADSUM, ONEDNN)
LOWER_PREFIX = "at_"  # headsum forced onto a lower target: BM_k/at_AVX2/...


@dataclass
class Row:
    """The median of one benchmark (one kernel, implementation, shape, thread count)."""

    kernel: str
    impl: str
    params: dict[str, int]  # in name order: B, H, Hkv, Sq, Skv, L, causal, threads...
    real_time: float = math.nan  # in time_unit
    time_unit: str = "us"
    gflops: float = math.nan
    visible_gflops: float = math.nan
    pct_peak: float = math.nan
    error: str = ""

    @property
    def threads(self) -> int:
        return self.params.get("threads", 1)

    def key(self) -> tuple:
        return (self.kernel, tuple(self.params.items()))


@dataclass
class Pair:
    kernel: str
    params: dict[str, int]
    rows: dict[str, Row] = field(default_factory=dict)  # impl -> row

    def ratio(self) -> float:
        """oneDNN time / headsum time: > 1 when headsum is faster."""
        h, o = self.rows.get(HEADSUM), self.rows.get(ONEDNN)
        if not h or not o or h.error or o.error or not h.real_time > 0:
            return math.nan
        return o.real_time / h.real_time


# --------------------------------------------------------------------------
# Running and parsing


def run_bench(binary: str, repetitions: int, extra: list[str]) -> dict:
    cmd = [
        binary,
        "--benchmark_format=json",
        f"--benchmark_repetitions={repetitions}",
        "--benchmark_report_aggregates_only=true",
        *extra,
    ]
    env = dict(os.environ)
    env.setdefault("OMP_PROC_BIND", "true")  # pin OpenMP threads: steadier numbers
    print("running:", " ".join(cmd), file=sys.stderr)
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, check=False)
    if done.returncode != 0:
        sys.exit(f"{binary} exited with status {done.returncode}")
    return json.loads(done.stdout)


def parse_name(run_name: str) -> tuple[str, str, dict[str, int]] | None:
    """'BM_k/impl/a:1/b:2/real_time' -> ('k', 'impl', {'a': 1, 'b': 2})."""
    parts = run_name.split("/")
    if len(parts) < 2 or not parts[0].startswith("BM_") or not (
            parts[1] in IMPLS or parts[1].startswith(LOWER_PREFIX)):
        return None
    params: dict[str, int] = {}
    for part in parts[2:]:
        key, sep, value = part.partition(":")
        if not sep:
            continue  # real_time, repeats and other suffixes Google Benchmark adds
        try:
            params[key] = int(value)
        except ValueError:
            continue
    return parts[0][3:], parts[1], params


def collect_rows(doc: dict) -> list[Row]:
    """One Row per benchmark: its median aggregate, or the median of its runs
    when the JSON holds no aggregates (a single repetition)."""
    runs: dict[str, list[dict]] = {}
    medians: dict[str, dict] = {}
    order: list[str] = []
    for b in doc.get("benchmarks", []):
        name = b.get("run_name", b["name"])
        if name not in runs and name not in medians:
            order.append(name)
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                medians[name] = b
        else:
            runs.setdefault(name, []).append(b)

    rows = []
    for name in order:
        parsed = parse_name(name)
        if parsed is None:
            continue
        kernel, impl, params = parsed
        row = Row(kernel, impl, params)
        source = medians.get(name)
        candidates = [source] if source else runs.get(name, [])
        errors = [c for c in candidates if c.get("error_occurred")]
        if errors or not candidates:
            row.error = errors[0].get("error_message", "error") if errors else "no result"
            rows.append(row)
            continue

        def med(key: str) -> float:
            values = [c[key] for c in candidates if key in c]
            return statistics.median(values) if values else math.nan

        row.real_time = med("real_time")
        row.time_unit = candidates[0].get("time_unit", "us")
        row.gflops = med("GFLOP/s")
        row.visible_gflops = med("visible_GFLOP/s")
        row.pct_peak = med("pct_peak")
        rows.append(row)
    return rows


PACKED_SUFFIX = "_packed"  # a headsum variant timed against its base kernel's oneDNN row


def pair_rows(rows: list[Row]) -> list[Pair]:
    pairs: dict[tuple, Pair] = {}
    for row in rows:
        pair = pairs.setdefault(row.key(), Pair(row.kernel, row.params))
        pair.rows[row.impl] = row
    # BM_project_heads_sum_packed/headsum/... has no oneDNN run of its own: it
    # is compared with project_heads_sum's oneDNN row of the same shape.
    by_key = {(p.kernel, tuple(sorted(p.params.items()))): p for p in pairs.values()}
    for p in pairs.values():
        if p.kernel.endswith(PACKED_SUFFIX) and ONEDNN not in p.rows:
            base = by_key.get((p.kernel[: -len(PACKED_SUFFIX)], tuple(sorted(p.params.items()))))
            if base is not None and ONEDNN in base.rows:
                p.rows[ONEDNN] = base.rows[ONEDNN]
    return list(pairs.values())


# --------------------------------------------------------------------------
# Table


def common_params(pairs: list[Pair]) -> dict[str, int]:
    """Parameters that take one value wherever they appear (shown once, above
    the table): B, H, L for all kernels, Hkv for attention, D for projection."""
    values: dict[str, set[int]] = {}
    for p in pairs:
        for key, value in p.params.items():
            values.setdefault(key, set()).add(value)
    return {
        key: next(iter(vals))
        for key, vals in values.items()
        if len(vals) == 1 and key not in ("threads", "causal", "Sq", "Skv", "S")
    }


def drop_mha_kv_heads(params: dict[str, int]) -> dict[str, int]:
    """Hkv only where it differs from H (GQA, MQA): Hkv = H is the default."""
    if params.get("Hkv") is not None and params.get("Hkv") == params.get("H"):
        return {k: v for k, v in params.items() if k != "Hkv"}
    return params


def shape_text(params: dict[str, int], common: dict[str, int]) -> str:
    params = drop_mha_kv_heads(params)
    rest = {k: v for k, v in params.items() if k not in common and k != "threads"}
    causal = rest.pop("causal", None)
    if "Sq" in rest and rest.get("Sq") == rest.get("Skv"):
        rest = {"S": rest.pop("Sq"), **{k: v for k, v in rest.items() if k != "Skv"}}
    text = " ".join(f"{k}={v}" for k, v in rest.items())
    if causal:
        text += " causal"
    return text


def fmt(value: float, digits: int = 1) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def table_lines(pairs: list[Pair], markdown: bool) -> list[str]:
    common = common_params(pairs)
    mha_default = "Hkv" not in common and any("Hkv" in p.params for p in pairs)
    header = [
        "kernel",
        "shape",
        "threads",
        "headsum GFLOP/s",
        "oneDNN GFLOP/s",
        "ratio",
        "headsum %peak",
        "oneDNN %peak",
        "headsum visible GFLOP/s",
    ]
    body = []
    for p in pairs:
        h = p.rows.get(HEADSUM) or Row(p.kernel, HEADSUM, p.params, error="missing")
        o = p.rows.get(ONEDNN) or Row(p.kernel, ONEDNN, p.params, error="missing")
        body.append(
            [
                p.kernel,
                shape_text(p.params, common),
                str(p.params.get("threads", "")),
                "error" if h.error else fmt(h.gflops),
                "error" if o.error else fmt(o.gflops),
                fmt(p.ratio(), 2),
                fmt(h.pct_peak),
                fmt(o.pct_peak),
                fmt(h.visible_gflops),
            ]
        )
    numeric = [False, False] + [True] * (len(header) - 2)
    lines = []
    if common:
        lines.append(
            "shapes: "
            + " ".join(f"{k}={v}" for k, v in common.items())
            + (" (Hkv = H unless shown)" if mha_default else "")
        )
        lines.append("")
    if markdown:
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "|".join("---:" if n else "---" for n in numeric) + "|")
        lines += ["| " + " | ".join(r) + " |" for r in body]
    else:
        widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]

        def line(cells: list[str]) -> str:
            return "  ".join(
                c.rjust(w) if n else c.ljust(w) for c, w, n in zip(cells, widths, numeric)
            ).rstrip()

        lines.append(line(header))
        lines.append("  ".join("-" * w for w in widths))
        lines += [line(r) for r in body]
    errors = [
        f"{r.kernel}/{r.impl} {shape_text(r.params, {})} threads={r.threads}: {r.error}"
        for p in pairs
        for r in p.rows.values()
        if r.error
    ]
    if errors:
        lines.append("")
        lines += ["error: " + e for e in errors]
    return lines


def context_lines(doc: dict) -> list[str]:
    ctx = doc.get("context", {})
    lines = []
    if "peak_gflops_per_core" in ctx:
        lines.append(
            f"peak: {ctx['peak_gflops_per_core']} GFLOP/s per core "
            f"(FMA probe at {ctx.get('peak_probe_target', '?')}); "
            "%peak = GFLOP/s / (threads x peak)"
        )
    if "headsum_target" in ctx:
        lines.append(
            f"headsum {ctx.get('headsum_version', '?')} on {ctx['headsum_target']} "
            f"(compiled: {ctx.get('headsum_compiled_targets', '?')})"
        )
    for key in sorted(k for k in ctx if k.startswith("onednn_impls")):
        lines.append(f"{key}: {ctx[key]}")
    lines.append(
        f"host: {ctx.get('host_name', '?')}, {ctx.get('num_cpus', '?')} cpus, "
        f"OMP_PROC_BIND={ctx.get('OMP_PROC_BIND', '?')}, {ctx.get('date', '')}"
    )
    lines.append("ratio = oneDNN time / headsum time (> 1: headsum faster); medians")
    return lines


# --------------------------------------------------------------------------
# Plot: GFLOP/s vs sequence length, one panel per kernel (and causal flag)


@dataclass
class Series:
    label: str
    impl: str
    threads: int
    points: list[tuple[int, float]]


def plot_panels(pairs: list[Pair]) -> list[tuple[str, list[Series]]]:
    """Panels of prefill shapes (Sq = Skv, or S for the projection); decode
    steps have no sequence-length axis and are left out."""
    panels: dict[str, dict[tuple[str, int], list[tuple[int, float]]]] = {}
    for p in pairs:
        seq = p.params.get("S")
        if seq is None:
            if p.params.get("Sq") != p.params.get("Skv"):
                continue
            seq = p.params.get("Sq")
        if seq is None:
            continue
        title = p.kernel + (" causal" if p.params.get("causal") else "")
        for impl, row in p.rows.items():
            if row.error or math.isnan(row.gflops) or impl.startswith(LOWER_PREFIX):
                continue  # lower-target rows have their own table, not a line
            series = panels.setdefault(title, {}).setdefault((impl, row.threads), [])
            series.append((seq, row.gflops))
    result = []
    for title, by_series in panels.items():
        series = [
            Series(f"{'oneDNN' if impl == ONEDNN else 'headsum'} {t}T", impl, t, sorted(points))
            for (impl, t), points in sorted(by_series.items())
        ]
        result.append((title, series))
    return result


def series_style(s: Series) -> tuple[str, str]:
    """(colour, dash): headsum blue, oneDNN orange; 1 thread solid, more dashed."""
    colour = "#1f77b4" if s.impl == HEADSUM else "#ff7f0e"
    return colour, ("" if s.threads == 1 else "6,4")


def plot_matplotlib(panels, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, (name, series) in zip(axes.flat, panels):
        for s in series:
            colour, dash = series_style(s)
            xs, ys = zip(*s.points)
            ax.plot(xs, ys, marker="o", color=colour, linestyle="-" if not dash else "--",
                    label=s.label)
        ax.set_xscale("log", base=2)
        ticks = sorted({x for s in series for x, _ in s.points})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_title(name)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("GFLOP/s")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_svg(panels, path: Path, title: str) -> None:
    pw, ph = 420, 300  # panel size
    ml, mr, mt, mb = 60, 20, 36, 44  # margins inside a panel
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    width, height = cols * pw, rows * ph + 40
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="24" text-anchor="middle" font-size="15">{esc(title)}</text>',
    ]
    for index, (name, series) in enumerate(panels):
        ox, oy = (index % cols) * pw, 40 + (index // cols) * ph
        x0, x1 = ox + ml, ox + pw - mr
        y0, y1 = oy + ph - mb, oy + mt  # y0: bottom
        xs = sorted({x for s in series for x, _ in s.points})
        ymax = nice_ceiling(max((y for s in series for _, y in s.points), default=1.0))
        lx = [math.log2(x) for x in xs]
        lo, hi = (min(lx), max(lx)) if lx else (0.0, 1.0)
        pad = 0.05 * ((hi - lo) or 1.0)  # keep markers off the frame
        lo, hi = lo - pad, hi + pad
        span = hi - lo

        def sx(x: float) -> float:
            return x0 + (math.log2(x) - lo) / span * (x1 - x0)

        def sy(y: float) -> float:
            return y0 - y / ymax * (y0 - y1)

        out.append(f'<text x="{(x0 + x1) / 2}" y="{oy + 20}" text-anchor="middle" '
                   f'font-size="13">{esc(name)}</text>')
        for i in range(5):  # y grid and labels
            y = ymax * i / 4
            out.append(f'<line x1="{x0}" y1="{sy(y):.1f}" x2="{x1}" y2="{sy(y):.1f}" '
                       'stroke="#ddd"/>')
            out.append(f'<text x="{x0 - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
        for x in xs:  # x ticks at the measured lengths
            out.append(f'<line x1="{sx(x):.1f}" y1="{y0}" x2="{sx(x):.1f}" y2="{y1}" '
                       'stroke="#eee"/>')
            out.append(f'<text x="{sx(x):.1f}" y="{y0 + 16}" text-anchor="middle">{x}</text>')
        out.append(f'<rect x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}" '
                   'fill="none" stroke="#444"/>')
        out.append(f'<text x="{(x0 + x1) / 2}" y="{y0 + 34}" text-anchor="middle">'
                   "sequence length</text>")
        out.append(f'<text x="{ox + 14}" y="{(y0 + y1) / 2}" text-anchor="middle" '
                   f'transform="rotate(-90 {ox + 14} {(y0 + y1) / 2})">GFLOP/s</text>')
        for k, s in enumerate(series):
            colour, dash = series_style(s)
            pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s.points)
            dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
            out.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" '
                       f'stroke-width="2"{dash_attr}/>')
            out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{colour}"/>'
                    for x, y in s.points]
            ly = y1 + 14 + 14 * k  # legend, top left
            out.append(f'<line x1="{x0 + 8}" y1="{ly - 4}" x2="{x0 + 30}" y2="{ly - 4}" '
                       f'stroke="{colour}" stroke-width="2"{dash_attr}/>')
            out.append(f'<text x="{x0 + 36}" y="{ly}">{esc(s.label)}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")


def nice_ceiling(value: float) -> float:
    """The next of 1, 2, 2.5, 5 x 10^k at or above value."""
    if value <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * exp >= value:
            return step * exp
    return 10 * exp


def esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def plot(pairs: list[Pair], path: Path, title: str) -> Path:
    panels = plot_panels(pairs)
    if not panels:
        print("plot: no prefill shapes to plot", file=sys.stderr)
        return path
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if path.suffix.lower() != ".svg":
            path = path.with_suffix(".svg")
            print(f"plot: matplotlib not available, writing SVG to {path}", file=sys.stderr)
        plot_svg(panels, path, title)
        return path
    plot_matplotlib(panels, path, title)
    return path


# --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--bench", help="path of headsum_bench to run")
    source.add_argument("--json", help="read this headsum_bench JSON output instead")
    parser.add_argument("--repetitions", type=int, default=5, help="with --bench (default 5)")
    parser.add_argument("--filter", help="--benchmark_filter regex, with --bench")
    parser.add_argument("--min-time", type=float, help="--benchmark_min_time, with --bench")
    parser.add_argument("--save-json", help="with --bench: also write the raw JSON here")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--plot", help="write GFLOP/s vs sequence length to this .png/.svg")
    args = parser.parse_args(argv)

    if args.bench:
        extra = []
        if args.filter:
            extra.append(f"--benchmark_filter={args.filter}")
        if args.min_time is not None:
            extra.append(f"--benchmark_min_time={args.min_time}")
        doc = run_bench(args.bench, args.repetitions, extra)
        if args.save_json:
            Path(args.save_json).write_text(json.dumps(doc, indent=1) + "\n")
    else:
        with open(args.json, encoding="utf-8") as f:
            doc = json.load(f)

    pairs = pair_rows(collect_rows(doc))
    if not pairs:
        print("no headsum/oneDNN benchmarks found", file=sys.stderr)
        return 1
    print("\n".join(context_lines(doc)))
    print()
    print("\n".join(table_lines(pairs, args.markdown)))
    lower = [r for p in pairs for impl, r in sorted(p.rows.items()) if impl.startswith(LOWER_PREFIX)]
    if lower:
        print("\nheadsum forced onto lower targets (1 thread; % of that target's own peak)\n")
        print(f"{'kernel':<18} {'shape':<22} {'target':<8} {'GFLOP/s':>8} {'% own peak':>11}")
        for r in lower:
            shape = shape_text(r.params, common_params(pairs))
            print(f"{r.kernel:<18} {shape:<22} {r.impl[len(LOWER_PREFIX):]:<8} "
                  f"{fmt(r.gflops):>8} {fmt(r.pct_peak):>11}")
    if args.plot:
        ctx = doc.get("context", {})
        title = (f"headsum vs oneDNN, {ctx.get('headsum_target', '?')}, "
                 f"peak {ctx.get('peak_gflops_per_core', '?')} GFLOP/s/core")
        written = plot(pairs, Path(args.plot), title)
        print(f"\nplot: {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
