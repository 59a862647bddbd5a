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

Every row runs with 64-byte-aligned buffers and with buffers 16 bytes off
(names ending /off:16/threads:N): the table gives the ratio for both and each
library's speed off16 / aligned.  --bind both (the default with --bench) runs
the binary twice, OpenMP threads pinned and unpinned, and gives the ratios of
both; with --json, pass one file per binding.  Decode rows get their K/V read
rate as a share of the read-bandwidth probe (BM_read_bandwidth, the same
bytes and threads, same run); the tiny calls and S=20 rows a table of
per-call times (the fixed cost).

    python3 scripts/bench_table.py --bench build/bench/headsum_bench \\
        --repetitions 5 --plot bench.png --save-json run.json
    python3 scripts/bench_table.py --json run.pinned.json run.unpinned.json --markdown

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
PINNED, UNPINNED = "pinned", "unpinned"
ALIGNED = 0  # bytes past a 64-byte boundary; /off:16 rows are OFFSET
OFFSET = 16


def bind_of(doc: dict) -> str:
    """'pinned' when the run had OMP_PROC_BIND set to bind threads."""
    value = str(doc.get("context", {}).get("OMP_PROC_BIND", "(unset)")).lower()
    return UNPINNED if value in ("", "(unset)", "false") else PINNED


@dataclass
class Row:
    """The median of one benchmark (one kernel, implementation, shape, thread
    count, buffer offset and thread binding)."""

    kernel: str
    impl: str
    params: dict[str, int]  # in name order: B, H, Hkv, Sq, Skv, L, causal, threads...
    off: int = ALIGNED
    bind: str = PINNED
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

    def micros(self) -> float:
        scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}.get(self.time_unit, math.nan)
        return self.real_time * scale


@dataclass
class Pair:
    kernel: str
    params: dict[str, int]
    rows: dict[tuple[str, str, int], Row] = field(default_factory=dict)  # (impl, bind, off)

    def get(self, impl: str, bind: str, off: int) -> Row | None:
        return self.rows.get((impl, bind, off))

    def ratio(self, bind: str, off: int) -> float:
        """oneDNN time / headsum time: > 1 when headsum is faster."""
        return speedup(self.get(ONEDNN, bind, off), self.get(HEADSUM, bind, off))


def speedup(slow: Row | None, fast: Row | None) -> float:
    """slow's time / fast's time, NaN unless both ran."""
    if not slow or not fast or slow.error or fast.error or not fast.real_time > 0:
        return math.nan
    return slow.micros() / fast.micros()


@dataclass
class Extras:
    """Rows that are not kernel pairs: the read-bandwidth probe (GB/s by
    bind, bytes, threads) and the fixed costs (microseconds by name, bind)."""

    probe: dict[tuple[str, int, int], float] = field(default_factory=dict)
    fixed: dict[tuple[str, str, int], float] = field(default_factory=dict)


# --------------------------------------------------------------------------
# Running and parsing


def bind_env(bind: str) -> dict:
    env = dict(os.environ)
    if bind == PINNED:
        env["OMP_PROC_BIND"] = "true"  # pin OpenMP threads: steadier numbers
        env.setdefault("OMP_PLACES", "cores")
    else:
        env["OMP_PROC_BIND"] = "false"  # the OS moves threads, as in most applications
        env.pop("OMP_PLACES", None)
    return env


def run_bench(binary: str, repetitions: int, extra: list[str], bind: str) -> dict:
    cmd = [
        binary,
        "--benchmark_format=json",
        f"--benchmark_repetitions={repetitions}",
        "--benchmark_report_aggregates_only=true",
        *extra,
    ]
    env = bind_env(bind)
    print(f"running ({bind}: OMP_PROC_BIND={env['OMP_PROC_BIND']}):", " ".join(cmd),
          file=sys.stderr)
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, check=False)
    if done.returncode != 0:
        sys.exit(f"{binary} exited with status {done.returncode}")
    return json.loads(done.stdout)


def parse_name(run_name: str) -> tuple[str, str, dict[str, int]] | None:
    """'BM_k/impl/a:1/b:2/real_time' -> ('k', 'impl', {'a': 1, 'b': 2})."""
    parts = run_name.split("/")
    if len(parts) < 2 or not parts[0].startswith("BM_"):
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


def medians_by_name(doc: dict) -> tuple[list[str], dict[str, list[dict]]]:
    """Each benchmark's median aggregate, or its runs when the JSON holds no
    aggregates (a single repetition); names in order of appearance."""
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
    return order, {n: [medians[n]] if n in medians else runs.get(n, []) for n in order}


def collect_rows(doc: dict, extras: Extras, clock: str = "real") -> list[Row]:
    """One Row per kernel benchmark; the probe and fixed-cost rows go to extras.
    clock "cpu": one-thread rows are timed by the benchmark thread's CPU time
    instead of the wall clock (all their work runs on that thread), and their
    rates scaled to match: on a shared machine, time spent waiting for a core
    then does not count.  Rows of more threads keep the wall clock."""
    bind = bind_of(doc)
    order, candidates_of = medians_by_name(doc)
    rows = []
    for name in order:
        parsed = parse_name(name)
        if parsed is None:
            continue
        kernel, impl, params = parsed
        candidates = candidates_of[name]
        errors = [c for c in candidates if c.get("error_occurred")]

        def med(key: str) -> float:
            values = [c[key] for c in candidates if key in c]
            return statistics.median(values) if values else math.nan

        # real time / the time the table uses (> 1 when CPU time replaces
        # the wall clock of a preempted one-thread row).
        use_cpu = clock == "cpu" and params.get("threads", 1) == 1 and med("cpu_time") > 0
        stretch = med("real_time") / med("cpu_time") if use_cpu else 1.0
        time_key = "cpu_time" if use_cpu else "real_time"
        if kernel == "read_bandwidth":
            if not errors and candidates:
                extras.probe[(bind, params.get("bytes", 0), params.get("threads", 1))] = (
                    med("GB/s") * stretch)
            continue
        if kernel == "fixed_cost":
            if not errors and candidates:
                unit = {"ns": 1e-3, "us": 1.0, "ms": 1e3}.get(candidates[0].get("time_unit"), 1.0)
                extras.fixed[(impl, bind, params.get("threads", 1))] = med(time_key) * unit
            continue
        if not (impl in IMPLS or impl.startswith(LOWER_PREFIX)):
            continue
        off = params.pop("off", ALIGNED)
        row = Row(kernel, impl, params, off=off, bind=bind)
        if errors or not candidates:
            row.error = errors[0].get("error_message", "error") if errors else "no result"
            rows.append(row)
            continue
        row.real_time = med(time_key)
        row.time_unit = candidates[0].get("time_unit", "us")
        row.gflops = med("GFLOP/s") * stretch
        row.visible_gflops = med("visible_GFLOP/s") * stretch
        row.pct_peak = med("pct_peak") * stretch
        rows.append(row)
    return rows


PACKED_SUFFIX = "_packed"  # a headsum variant timed against its base kernel's oneDNN row


def pair_rows(rows: list[Row]) -> list[Pair]:
    pairs: dict[tuple, Pair] = {}
    for row in rows:
        pair = pairs.setdefault(row.key(), Pair(row.kernel, row.params))
        pair.rows[(row.impl, row.bind, row.off)] = row
    # BM_project_heads_sum_packed/headsum/... has no oneDNN run of its own: it
    # is compared with project_heads_sum's oneDNN row of the same shape.
    by_key = {(p.kernel, tuple(sorted(p.params.items()))): p for p in pairs.values()}
    for p in pairs.values():
        if p.kernel.endswith(PACKED_SUFFIX):
            base = by_key.get((p.kernel[: -len(PACKED_SUFFIX)], tuple(sorted(p.params.items()))))
            if base is None:
                continue
            for (impl, bind, off), row in base.rows.items():
                if impl == ONEDNN:
                    p.rows.setdefault((impl, bind, off), row)
    return sorted(pairs.values(), key=pair_order)


KERNEL_ORDER = ("qk_scores", "softmax_v", "attention", "project_heads_sum")


def pair_order(p: Pair) -> tuple:
    """The registration order, whatever order the rows ran in (random with
    --interleave): kernel; prefill by S then causal, then decode steps, then
    the tiny calls; threads; the packed projection after the plain one."""
    base = p.kernel[: -len(PACKED_SUFFIX)] if p.kernel.endswith(PACKED_SUFFIX) else p.kernel
    rank = KERNEL_ORDER.index(base) if base in KERNEL_ORDER else len(KERNEL_ORDER)
    params = p.params
    seq = params.get("S", params.get("Sq", 0))
    tiny = is_tiny(params)
    decode = is_decode(params)
    return (rank, base, tiny, decode, params.get("H", 0), -params.get("Hkv", 0),
            params.get("Skv", seq), seq, params.get("causal", 0), params.get("threads", 1),
            p.kernel != base)


# --------------------------------------------------------------------------
# Table

NOT_COMMON = ("threads", "causal", "Sq", "Skv", "S")


def common_params(pairs: list[Pair]) -> dict[str, int]:
    """The value each parameter takes most often (the seed's B=1 H=8 L=64,
    Hkv for attention, D=512 for the projection): shown once above the table;
    rows that differ (the long-cache decode, the tiny fixed-cost calls) show
    theirs."""
    counts: dict[str, dict[int, int]] = {}
    for p in pairs:
        for key, value in p.params.items():
            if key not in NOT_COMMON:
                counts.setdefault(key, {}).setdefault(value, 0)
                counts[key][value] += 1
    return {key: max(vals, key=vals.get) for key, vals in counts.items()}


def drop_mha_kv_heads(params: dict[str, int]) -> dict[str, int]:
    """Hkv only where it differs from H (GQA, MQA): Hkv = H is the default."""
    if params.get("Hkv") is not None and params.get("Hkv") == params.get("H"):
        return {k: v for k, v in params.items() if k != "Hkv"}
    return params


def shape_text(params: dict[str, int], common: dict[str, int]) -> str:
    params = drop_mha_kv_heads(params)
    rest = {k: v for k, v in params.items()
            if k != "threads" and (k in NOT_COMMON or common.get(k) != v)}
    causal = rest.pop("causal", None)
    if "Sq" in rest and rest.get("Sq") == rest.get("Skv"):
        rest = {"S": rest.pop("Sq"), **{k: v for k, v in rest.items() if k != "Skv"}}
    text = " ".join(f"{k}={v}" for k, v in rest.items())
    if causal:
        text += " causal"
    return text


def fmt(value: float, digits: int = 1) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def is_decode(params: dict[str, int]) -> bool:
    return params.get("Sq") == 1 and params.get("Skv", 1) > 1


def kv_bytes(params: dict[str, int]) -> int:
    """K+V bytes (f32) a decode row reads."""
    hkv = params.get("Hkv") or params.get("H", 0)
    return 2 * params.get("B", 1) * hkv * params.get("Skv", 0) * params.get("L", 0) * 4


def bw_share(row: Row | None, params: dict[str, int], extras: Extras) -> float:
    """A decode row's K/V read rate as a percentage of the probe's GB/s for
    the same bytes, threads and binding (in the same run)."""
    if not row or row.error or not is_decode(params) or not row.real_time > 0:
        return math.nan
    probe = extras.probe.get((row.bind, kv_bytes(params), row.threads))
    if not probe:
        return math.nan
    return 100.0 * kv_bytes(params) / (row.micros() * 1e-6) * 1e-9 / probe


def cell(row: Row | None, value: float, digits: int = 1) -> str:
    if row is None:
        return "-"
    if row.error:
        return "skip" if row.error.startswith("skipped") else "error"
    return fmt(value, digits)


def table_lines(pairs: list[Pair], markdown: bool, binds: list[str], extras: Extras) -> list[str]:
    """One line per kernel, shape and thread count.  The first binding's
    aligned run gives GFLOP/s and %peak; ratios for both offsets and every
    binding; 'off/al' is a library's speed with 16-byte-offset buffers over
    its speed with aligned ones (1.00: no loss)."""
    common = common_params(pairs)
    main = binds[0]
    others = binds[1:]
    has_decode = any(is_decode(p.params) for p in pairs)
    header = ["kernel", "shape", "threads", "headsum GFLOP/s", "oneDNN GFLOP/s",
              "ratio", "ratio off16", "headsum off/al", "oneDNN off/al",
              "headsum %peak", "oneDNN %peak"]
    for b in others:
        header += [f"ratio {b}", f"ratio {b} off16"]
    header.append("headsum visible GFLOP/s")
    if has_decode:
        header += ["headsum %bw", "headsum %bw off16", "oneDNN %bw"]
    body = []
    for p in pairs:
        h = p.get(HEADSUM, main, ALIGNED)
        o = p.get(ONEDNN, main, ALIGNED)
        ho = p.get(HEADSUM, main, OFFSET)
        oo = p.get(ONEDNN, main, OFFSET)
        if h is None and o is None:
            continue  # lower-target rows: their own table
        line = [
            p.kernel,
            shape_text(p.params, common),
            str(p.params.get("threads", "")),
            cell(h, h.gflops if h else math.nan),
            cell(o, o.gflops if o else math.nan),
            fmt(p.ratio(main, ALIGNED), 2),
            fmt(p.ratio(main, OFFSET), 2),
            fmt(speedup(h, ho), 2),
            fmt(speedup(o, oo), 2),
            cell(h, h.pct_peak if h else math.nan),
            cell(o, o.pct_peak if o else math.nan),
        ]
        for b in others:
            line += [fmt(p.ratio(b, ALIGNED), 2), fmt(p.ratio(b, OFFSET), 2)]
        line.append(fmt(h.visible_gflops) if h and not h.error else "-")
        if has_decode:
            line += [fmt(bw_share(h, p.params, extras)), fmt(bw_share(ho, p.params, extras)),
                     fmt(bw_share(o, p.params, extras))]
        body.append(line)
    numeric = [False, False] + [True] * (len(header) - 2)
    lines = []
    if common:
        lines.append(
            "shapes: "
            + " ".join(f"{k}={v}" for k, v in common.items())
            + " unless shown (Hkv = H unless shown)"
        )
        lines.append(
            f"threads {main} (OMP_PROC_BIND); GFLOP/s and %peak: aligned buffers; "
            "off16: every buffer 16 bytes past a 64-byte boundary; off/al: speed off16 / "
            "speed aligned")
        if has_decode:
            lines.append("%bw (decode): K+V bytes / time, as % of the read-bandwidth probe's "
                         "GB/s for the same bytes and threads in the same run")
        lines.append("")
    lines += render(header, body, numeric, markdown)
    errors = [
        f"{r.kernel}/{r.impl} {shape_text(r.params, {})}{' off16' if r.off else ''} "
        f"threads={r.threads} {r.bind}: {r.error}"
        for p in pairs
        for r in p.rows.values()
        if r.error and r.kernel == p.kernel
    ]
    if errors:
        lines.append("")
        lines += ["skipped/error: " + e for e in dict.fromkeys(errors)]
    return lines


def render(header: list[str], body: list[list[str]], numeric: list[bool],
           markdown: bool) -> list[str]:
    if markdown:
        lines = ["| " + " | ".join(header) + " |",
                 "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
        return lines + ["| " + " | ".join(r) + " |" for r in body]
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if n else c.ljust(w) for c, w, n in zip(cells, widths, numeric)
        ).rstrip()

    return [line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in body]


def is_tiny(params: dict[str, int]) -> bool:
    return params.get("S") == 1 or (params.get("Sq") == 1 and params.get("Skv") == 1)


def fixed_cost_lines(pairs: list[Pair], binds: list[str], extras: Extras,
                     markdown: bool) -> list[str]:
    """Per-call times of the tiny calls (all fixed cost: threads woken,
    scratch, dispatch, validation) beside the seed's S=20 rows."""
    common = common_params(pairs)
    header = ["kernel", "shape", "threads"]
    for b in binds:
        header += [f"headsum us {b}", f"oneDNN us {b}"]
    body = []
    for p in pairs:
        seed20 = p.params.get("S") == 20 or (p.params.get("Sq") == 20 and p.params.get("Skv") == 20)
        if not (is_tiny(p.params) or (seed20 and p.kernel in ("attention", "project_heads_sum")
                                      and not p.params.get("causal"))):
            continue
        line = [p.kernel, shape_text(p.params, common), str(p.params.get("threads", ""))]
        for b in binds:
            h, o = p.get(HEADSUM, b, ALIGNED), p.get(ONEDNN, b, ALIGNED)
            line += [cell(h, h.micros() if h else math.nan, 2),
                     cell(o, o.micros() if o else math.nan, 2)]
        body.append(line)
    for (name, bind, threads), micros in sorted(extras.fixed.items()):
        if bind != binds[0]:
            continue
        line = ["(" + name + ")", "empty parallel region", str(threads)]
        for b in binds:
            t = extras.fixed.get((name, b, threads), math.nan)
            line += [fmt(t, 2), "-"]
        body.append(line)
    if not body:
        return []
    return (["", "Fixed per-call cost: the tiny calls (B=1 H=1 Sq=Skv=1 L=64 attention, "
             "S=1 H=1 L=64 D=64 projection) are all overhead; medians, microseconds, "
             "aligned buffers", ""]
            + render(header, body, [False, False] + [True] * (len(header) - 2), markdown))


def probe_lines(extras: Extras, binds: list[str], markdown: bool) -> list[str]:
    if not extras.probe:
        return []
    keys = sorted({(nbytes, threads) for (_, nbytes, threads) in extras.probe})
    header = ["buffer MB", "threads"] + [f"GB/s {b}" for b in binds]
    body = [[f"{nbytes / 1e6:.1f}", str(threads)]
            + [fmt(extras.probe.get((b, nbytes, threads), math.nan)) for b in binds]
            for nbytes, threads in keys]
    return (["", "Read-bandwidth probe: the sum of a buffer of a decode row's K+V size, "
             "repeated (16.8 MB: MHA decode Skv=4096; 4.2 MB: its GQA Hkv=2; 1073.7 MB: "
             "H=32 L=128 Skv=32768 f32; 536.9 MB: the same in 16 bits)", ""]
            + render(header, body, [True] * len(header), markdown))


def context_lines(docs: list[dict]) -> list[str]:
    ctx = docs[0].get("context", {})
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
    for doc in docs:
        c = doc.get("context", {})
        load = c.get("load_avg")
        lines.append(
            f"host: {c.get('host_name', '?')}, {c.get('num_cpus', '?')} cpus, "
            f"OMP_PROC_BIND={c.get('OMP_PROC_BIND', '?')}, {c.get('date', '')}"
            + (f", load average at start {' '.join(f'{x:.2f}' for x in load)}" if load else "")
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
    off: int
    points: list[tuple[int, float]]


def plot_panels(pairs: list[Pair], bind: str) -> list[tuple[str, list[Series]]]:
    """Panels of prefill shapes (Sq = Skv, or S for the projection) of the
    seed's layer, one binding, both offsets; decode steps have no
    sequence-length axis and the tiny calls are no layer: both left out."""
    common = common_params(pairs)
    panels: dict[str, dict[tuple[str, int, int], list[tuple[int, float]]]] = {}
    for p in pairs:
        if any(common.get(k) != v for k, v in p.params.items() if k not in NOT_COMMON):
            continue
        seq = p.params.get("S")
        if seq is None:
            if p.params.get("Sq") != p.params.get("Skv"):
                continue
            seq = p.params.get("Sq")
        if seq is None or seq <= 1:
            continue
        title = p.kernel + (" causal" if p.params.get("causal") else "")
        for (impl, row_bind, off), row in p.rows.items():
            if row_bind != bind or row.kernel != p.kernel:
                continue  # the packed rows' borrowed oneDNN row is plotted with its own kernel
            if row.error or math.isnan(row.gflops) or impl.startswith(LOWER_PREFIX):
                continue  # lower-target rows have their own table, not a line
            series = panels.setdefault(title, {}).setdefault((impl, row.threads, off), [])
            series.append((seq, row.gflops))
    result = []
    for title, by_series in panels.items():
        series = [
            Series(f"{'oneDNN' if impl == ONEDNN else 'headsum'} {t}T"
                   + (" off16" if off else ""), impl, t, off, sorted(points))
            for (impl, t, off), points in sorted(by_series.items())
        ]
        result.append((title, series))
    return result


def series_style(s: Series) -> tuple[str, str]:
    """(colour, dash): headsum blue, oneDNN orange (lighter with offset
    buffers); 1 thread solid, more dashed."""
    colours = {(HEADSUM, 0): "#1f77b4", (HEADSUM, 1): "#7fb8e0",
               (ONEDNN, 0): "#ff7f0e", (ONEDNN, 1): "#ffbb78"}
    colour = colours[(HEADSUM if s.impl == HEADSUM else ONEDNN, 1 if s.off else 0)]
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
            ax.plot(xs, ys, marker="x" if s.off else "o", color=colour,
                    linestyle="-" if not dash else "--", label=s.label)
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


def plot(pairs: list[Pair], path: Path, title: str, bind: str) -> Path:
    panels = plot_panels(pairs, bind)
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
    source.add_argument("--json", nargs="+",
                        help="read these headsum_bench JSON outputs instead (one per binding)")
    parser.add_argument("--repetitions", type=int, default=5, help="with --bench (default 5)")
    parser.add_argument("--filter", help="--benchmark_filter regex, with --bench")
    parser.add_argument("--min-time", type=float, help="--benchmark_min_time, with --bench")
    parser.add_argument("--bind", choices=(PINNED, UNPINNED, "both"), default="both",
                        help="with --bench: run with OpenMP threads pinned (OMP_PROC_BIND=true "
                             "OMP_PLACES=cores), unpinned (OMP_PROC_BIND=false), or both, one "
                             "run after the other (default both)")
    parser.add_argument("--interleave", action="store_true",
                        help="with --bench: --benchmark_enable_random_interleaving=true (the "
                             "repetitions of all rows in random order, so that a slow spell "
                             "of a shared machine hits both libraries alike)")
    parser.add_argument("--save-json",
                        help="with --bench: also write the raw JSON here (with two bindings, "
                             "NAME.pinned.json and NAME.unpinned.json)")
    parser.add_argument("--clock", choices=("real", "cpu"), default="real",
                        help="cpu: time one-thread rows by the benchmark thread's CPU time "
                             "(for a shared, busy machine; rows of more threads keep the wall "
                             "clock, and say so); default real")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    parser.add_argument("--plot", help="write GFLOP/s vs sequence length to this .png/.svg")
    parser.add_argument("--require-png", action="store_true",
                        help="with --plot NAME.png: fail rather than fall back to an SVG when "
                             "matplotlib does not import")
    args = parser.parse_args(argv)

    if args.require_png and args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            sys.exit(f"--require-png: {sys.executable} has no matplotlib")

    docs = []
    if args.bench:
        extra = []
        if args.filter:
            extra.append(f"--benchmark_filter={args.filter}")
        if args.min_time is not None:
            extra.append(f"--benchmark_min_time={args.min_time}")
        if args.interleave:
            extra.append("--benchmark_enable_random_interleaving=true")
        binds = [PINNED, UNPINNED] if args.bind == "both" else [args.bind]
        for bind in binds:
            doc = run_bench(args.bench, args.repetitions, extra, bind)
            docs.append(doc)
            if args.save_json:
                path = Path(args.save_json)
                if len(binds) > 1:
                    path = path.with_name(f"{path.stem}.{bind}{path.suffix or '.json'}")
                path.write_text(json.dumps(doc, indent=1) + "\n")
    else:
        for name in args.json:
            with open(name, encoding="utf-8") as f:
                docs.append(json.load(f))

    extras = Extras()
    rows = [r for doc in docs for r in collect_rows(doc, extras, args.clock)]
    binds = list(dict.fromkeys(bind_of(doc) for doc in docs))
    pairs = pair_rows(rows)
    if not pairs:
        print("no headsum/oneDNN benchmarks found", file=sys.stderr)
        return 1
    print("\n".join(context_lines(docs)))
    if args.clock == "cpu":
        print("--clock cpu: one-thread rows timed by CPU time (time waiting for a core "
              "excluded); rows of 2 threads by the wall clock")
    print()
    print("\n".join(table_lines(pairs, args.markdown, binds, extras)))
    print("\n".join(fixed_cost_lines(pairs, binds, extras, args.markdown)))
    print("\n".join(probe_lines(extras, binds, args.markdown)))
    lower = [(p, impl) for p in pairs for impl in sorted({i for (i, b, o) in p.rows
                                                        if i.startswith(LOWER_PREFIX)})]
    if lower:
        print(f"\nheadsum forced onto lower targets (1 thread, threads {binds[0]}; GFLOP/s "
              "aligned and off16, % of that target's own peak)\n")
        print(f"{'kernel':<18} {'shape':<22} {'target':<8} {'GFLOP/s':>8} {'off16':>8} "
              f"{'off/al':>7} {'% own peak':>11}")
        for p, impl in lower:
            r, ro = p.get(impl, binds[0], ALIGNED), p.get(impl, binds[0], OFFSET)
            shape = shape_text(p.params, common_params(pairs))
            print(f"{p.kernel:<18} {shape:<22} {impl[len(LOWER_PREFIX):]:<8} "
                  f"{cell(r, r.gflops if r else math.nan):>8} "
                  f"{cell(ro, ro.gflops if ro else math.nan):>8} "
                  f"{fmt(speedup(r, ro), 2):>7} {cell(r, r.pct_peak if r else math.nan):>11}")
    if args.plot:
        ctx = docs[0].get("context", {})
        title = (f"headsum vs oneDNN, {ctx.get('headsum_target', '?')}, "
                 f"peak {ctx.get('peak_gflops_per_core', '?')} GFLOP/s/core, "
                 f"threads {binds[0]}")
        written = plot(pairs, Path(args.plot), title, binds[0])
        print(f"\nplot: {written}")
        if args.require_png and written.suffix.lower() != ".png":
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
