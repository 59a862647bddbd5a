#!/usr/bin/env python3
"""headsum's benchmark driver: runs a benchmark binary, or reads the JSON it
wrote, and prints its tables.

    python3 scripts/bench.py kernels --bench build/bench/headsum_bench --plot bench.png
    python3 scripts/bench.py tensor t.json
    python3 scripts/bench.py per-head --bench build/bench/headsum_per_head_bench

`bench.py SUBCOMMAND --help` lists a subcommand's options.

Every subcommand takes --bench BINARY (run it: --benchmark_format=json,
--repetitions N with aggregates only, --filter, --min-time, --save-json) or
--json FILE (read what it wrote), and --clock wall|cpu.  Medians throughout:
a benchmark's median aggregate, or the median over its runs where the JSON
has no aggregates.  Python 3.11 standard library only (matplotlib optional,
for kernels --plot).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

# --------------------------------------------------------------------------
# Shared: running a benchmark, its JSON, medians, names, the clock, tables


def run_bench(binary: str, repetitions: int, extra: list[str], env: dict | None = None,
              note: str = "") -> dict:
    """Runs a Google Benchmark binary and returns the JSON it printed:
    medians (and the other aggregates) of `repetitions` runs of each row."""
    cmd = [
        binary,
        "--benchmark_format=json",
        f"--benchmark_repetitions={repetitions}",
        "--benchmark_report_aggregates_only=true",
        *extra,
    ]
    print(f"running{f' ({note})' if note else ''}:", " ".join(cmd), file=sys.stderr)
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, check=False)
    if done.returncode != 0:
        sys.exit(f"{binary} exited with status {done.returncode}")
    return json.loads(done.stdout)


def bench_flags(args: argparse.Namespace) -> list[str]:
    """The benchmark flags of --filter and --min-time."""
    extra = []
    if args.filter:
        extra.append(f"--benchmark_filter={args.filter}")
    if args.min_time:
        extra.append(f"--benchmark_min_time={args.min_time}")
    return extra


def load_json(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def save_json(doc: dict, path: Path) -> None:
    path.write_text(json.dumps(doc, indent=1) + "\n")


def median_rows(doc: dict) -> dict[str, dict | None]:
    """Each benchmark's median, by run name in order of appearance: its
    median aggregate; where the JSON has no aggregates of it (one
    repetition), the median of each number over its runs, failed if any run
    failed (with the first failure's message); None where it has aggregates
    but no median."""
    runs: dict[str, list[dict]] = {}
    medians: dict[str, dict] = {}
    order: dict[str, None] = {}
    for b in doc.get("benchmarks", []):
        name = b.get("run_name", b["name"])
        order.setdefault(name)
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                medians[name] = b
        else:
            runs.setdefault(name, []).append(b)
    return {name: medians[name] if name in medians else median_of_runs(runs.get(name, []))
            for name in order}


def median_of_runs(runs: list[dict]) -> dict | None:
    if not runs:
        return None
    row: dict = {}
    for key in dict.fromkeys(k for r in runs for k in r):
        values = [r[key] for r in runs if key in r]
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        row[key] = statistics.median(values) if numbers else values[0]
    failed = [r for r in runs if r.get("error_occurred")]
    if failed:
        row["error_occurred"] = True
        row["error_message"] = failed[0].get("error_message", "error")
    return row


def parse_name(run_name: str, labels: int = 1) -> tuple[str, list[str], dict[str, int]] | None:
    """'BM_k/impl/a:1/b:2/real_time' -> ('k', ['impl'], {'a': 1, 'b': 2}): the
    first `labels` fields after the name as they are, then the whole-number
    parameters of the rest."""
    parts = run_name.split("/")
    if len(parts) < 1 + labels or not parts[0].startswith("BM_"):
        return None
    params: dict[str, int] = {}
    for part in parts[1 + labels:]:
        key, sep, value = part.partition(":")
        if not sep:
            continue  # real_time, repeats and other suffixes Google Benchmark adds
        try:
            params[key] = int(value)
        except ValueError:
            continue
    return parts[0][3:], parts[1:1 + labels], params


WALL, CPU = "wall", "cpu"


def clock_option(parser: argparse.ArgumentParser, rows: str) -> None:
    parser.add_argument("--clock", choices=(WALL, "real", CPU), default=WALL,
                        help="cpu: the benchmark thread's CPU time instead of the wall clock, "
                             "for a shared, busy machine (time spent waiting for a core does "
                             f"not count), {rows}; wall or real: the wall clock (default)")


def time_key(clock: str, threads: int = 1) -> str:
    """The JSON field a row's time is read from: cpu_time under --clock cpu
    for a row of one thread (all its work runs on the thread the benchmark
    times), real_time otherwise."""
    return "cpu_time" if clock == CPU and threads == 1 else "real_time"


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def render(header: list[str], body: list[list[str]], numeric: list[bool],
           markdown: bool) -> list[str]:
    """A Markdown table, or a plain one: columns padded, numbers right-aligned."""
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


def source_options(parser: argparse.ArgumentParser, binary: str, json_help: str,
                   many: bool = False, required: bool = True) -> None:
    """--bench BINARY or --json FILE, and the options of a run."""
    source = parser.add_mutually_exclusive_group(required=required)
    source.add_argument("--bench", help=f"path of {binary} to run")
    source.add_argument("--json", nargs="+" if many else None, help=json_help)
    parser.add_argument("--repetitions", type=int, default=5, help="with --bench (default 5)")
    parser.add_argument("--filter", help="--benchmark_filter regex, with --bench")
    parser.add_argument("--min-time", help="--benchmark_min_time, with --bench")
    parser.add_argument("--save-json", help="with --bench: also write the raw JSON here")


def subcommand(subparsers, name: str, summary: str, doc: str) -> argparse.ArgumentParser:
    return subparsers.add_parser(name, help=summary, description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)


# --------------------------------------------------------------------------
# kernels: headsum_bench, every kernel beside its oneDNN twin

KERNELS_DOC = """Pairs every headsum kernel with its oneDNN twin and prints a table.

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

    python3 scripts/bench.py kernels --bench build/bench/headsum_bench \\
        --repetitions 5 --plot bench.png --save-json run.json
    python3 scripts/bench.py kernels --json run.pinned.json run.unpinned.json --markdown

--plot draws GFLOP/s against sequence length per kernel, headsum and oneDNN,
with matplotlib when it imports, else as an SVG written by hand.
"""

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




def bind_env(bind: str) -> dict:
    env = dict(os.environ)
    if bind == PINNED:
        env["OMP_PROC_BIND"] = "true"  # pin OpenMP threads: steadier numbers
        env.setdefault("OMP_PLACES", "cores")
    else:
        env["OMP_PROC_BIND"] = "false"  # the OS moves threads, as in most applications
        env.pop("OMP_PLACES", None)
    return env


def collect_rows(doc: dict, extras: Extras, clock: str = WALL) -> list[Row]:
    """One Row per kernel benchmark; the probe and fixed-cost rows go to extras.
    clock "cpu": one-thread rows are timed by the benchmark thread's CPU time
    instead of the wall clock (all their work runs on that thread), and their
    rates scaled to match: on a shared machine, time spent waiting for a core
    then does not count.  Rows of more threads keep the wall clock."""
    bind = bind_of(doc)
    rows = []
    for name, median in median_rows(doc).items():
        parsed = parse_name(name)
        if parsed is None:
            continue
        kernel, (impl,), params = parsed
        if median is None:
            error = "no result"
        else:
            error = median.get("error_message", "error") if median.get("error_occurred") else ""

        def med(key: str) -> float:
            return median.get(key, math.nan) if median else math.nan

        # real time / the time the table uses (> 1 when CPU time replaces
        # the wall clock of a preempted one-thread row).
        use_cpu = time_key(clock, params.get("threads", 1)) == "cpu_time" and med("cpu_time") > 0
        stretch = med("real_time") / med("cpu_time") if use_cpu else 1.0
        time_field = "cpu_time" if use_cpu else "real_time"
        if kernel == "read_bandwidth":
            if not error:
                extras.probe[(bind, params.get("bytes", 0), params.get("threads", 1))] = (
                    med("GB/s") * stretch)
            continue
        if kernel == "fixed_cost":
            if not error:
                unit = {"ns": 1e-3, "us": 1.0, "ms": 1e3}.get(median.get("time_unit"), 1.0)
                extras.fixed[(impl, bind, params.get("threads", 1))] = med(time_field) * unit
            continue
        if not (impl in IMPLS or impl.startswith(LOWER_PREFIX)):
            continue
        off = params.pop("off", ALIGNED)
        row = Row(kernel, impl, params, off=off, bind=bind)
        if error:
            row.error = error
            rows.append(row)
            continue
        row.real_time = med(time_field)
        row.time_unit = median.get("time_unit", "us")
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




def kernels_options(p: argparse.ArgumentParser) -> None:
    source_options(p, "headsum_bench", "read these headsum_bench JSON outputs instead "
                   "(one per binding)", many=True)
    p.add_argument("--bind", choices=(PINNED, UNPINNED, "both"), default="both",
                   help="with --bench: run with OpenMP threads pinned (OMP_PROC_BIND=true "
                        "OMP_PLACES=cores), unpinned (OMP_PROC_BIND=false), or both, one "
                        "run after the other (default both; --save-json NAME.json then "
                        "writes NAME.pinned.json and NAME.unpinned.json)")
    p.add_argument("--interleave", action="store_true",
                   help="with --bench: --benchmark_enable_random_interleaving=true (the "
                        "repetitions of all rows in random order, so that a slow spell "
                        "of a shared machine hits both libraries alike)")
    clock_option(p, "for the rows of one thread (rows of more threads keep the wall "
                      "clock, and the table says so)")
    p.add_argument("--markdown", action="store_true", help="print Markdown tables")
    p.add_argument("--plot", help="write GFLOP/s vs sequence length to this .png/.svg")
    p.add_argument("--require-png", action="store_true",
                   help="with --plot NAME.png: fail rather than fall back to an SVG when "
                        "matplotlib does not import")


def kernels_main(args: argparse.Namespace) -> int:
    if args.require_png and args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            sys.exit(f"--require-png: {sys.executable} has no matplotlib")

    docs = []
    if args.bench:
        extra = bench_flags(args)
        if args.interleave:
            extra.append("--benchmark_enable_random_interleaving=true")
        binds = [PINNED, UNPINNED] if args.bind == "both" else [args.bind]
        for bind in binds:
            env = bind_env(bind)
            doc = run_bench(args.bench, args.repetitions, extra, env,
                            f"{bind}: OMP_PROC_BIND={env['OMP_PROC_BIND']}")
            docs.append(doc)
            if args.save_json:
                path = Path(args.save_json)
                if len(binds) > 1:
                    path = path.with_name(f"{path.stem}.{bind}{path.suffix or '.json'}")
                save_json(doc, path)
    else:
        docs = [load_json(name) for name in args.json]

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




# --------------------------------------------------------------------------
# tensor: headsum_tensor_bench, the tensor API's ratios

TENSOR_DOC = """The tensor issue's goals from one run of headsum_tensor_bench.

    build/bench/headsum_tensor_bench --benchmark_format=json > t.json
    python3 scripts/bench.py tensor [--clock cpu|wall] t.json
    python3 scripts/bench.py tensor --bench build/bench/headsum_tensor_bench

Reads the median rows and prints, per thread count, every ratio the goals
name: 16-bit over f32 K/V decode (and the share of the read probe's
bandwidth over the same bytes: the faster of the one-stream probe and the
two-stream one, which reads two halves side by side as a decode reads K
and V), headsum bf16 decode over oneDNN's composed
bf16 attention, token-major over contiguous, 16-bit over f32 K/V prefill,
bf16 over f32 Wo projection (Wo cache-resident, and Wo from memory).

Column "paired": the same ratio from the BM_paired_* rows, whose calls are
alternated inside one benchmark (each iteration times every call once; the
counter is the median over iterations of the ratio within an iteration;
the cell shows the median over repetitions): this VM's speed drifts by
10-25% over minutes, and a ratio of two separately timed medians moved by
up to 0.3 between runs.  "-" where the run has no paired rows.

With --bench the binary runs with random interleaving (its default).
"""


class TensorRows:
    """The median rows of a tensor bench run by name, without the
    /iterations:N and /real_time suffixes; times from one clock."""

    def __init__(self, doc: dict, clock: str):
        self.rows = {re.sub(r"(/iterations:\d+)?/real_time$", "", name): b
                     for name, b in median_rows(doc).items() if b is not None}
        # Every row, of any thread count: the main thread's CPU time.
        self.key = time_key(clock)

    def time(self, name: str) -> float | None:
        b = self.rows.get(name)
        return None if b is None else b[self.key]

    def counter(self, name: str, key: str) -> float | None:
        b = self.rows.get(name)
        return None if b is None else b.get(key)

    def gbs(self, name: str) -> float | None:
        return self.counter(name, "GB/s")


def tensor_lines(doc: dict, clock: str) -> list[str]:
    ctx = doc.get("context", {})
    rows = TensorRows(doc, clock)
    t, counter, gbs = rows.time, rows.counter, rows.gbs
    lines = [
        f"times: {rows.key} (--clock cpu: the main thread's CPU time, for 1-thread rows "
        "on a loaded machine)",
        f"host {ctx.get('host_name', '?')}, {ctx.get('num_cpus', '?')} cpus, "
        f"{ctx.get('date', '')}; buffers {ctx.get('buffer_offset', '0')} bytes past a "
        "64-byte boundary",
    ]
    for th in (1, 2):
        s = f"/threads:{th}"
        body = []
        for hkv in (32, 8):
            base = f"/H:32/Hkv:{hkv}/L:128/Skv:32768{s}"
            f32 = t("BM_decode/kv:f32" + base)
            kv_bytes_16 = 2 * hkv * 32768 * 128 * 2
            probe_name = {512 << 20: "512MiB", 128 << 20: "128MiB"}.get(kv_bytes_16)
            probe1 = gbs(f"BM_read_probe/bytes:{probe_name}{s}") if probe_name else None
            # The two-stream probe (K and V side by side, as the decode
            # reads them) where the run has it; the share is of the faster.
            probe2 = gbs(f"BM_read_probe2/bytes:{probe_name}{s}") if probe_name else None
            probes = [p for p in (probe1, probe2) if p]
            probe = max(probes) if probes else None
            which = ("two streams" if probe2 and probe == probe2 else "one stream")
            also = (f"; the other probe {fmt(probe1 if probe == probe2 else probe2)}"
                    if probe1 and probe2 else "")
            paired = f"BM_paired_decode{base}"
            for kv in ("f16", "bf16"):
                x = t(f"BM_decode/kv:{kv}" + base)
                p_speed = counter(paired, f"speed_{kv}")
                p_share = counter(paired, f"share_{kv}")
                p_cell = (f"{fmt(p_speed, 2)}x, {fmt(100 * p_share if p_share else None, 0)}%"
                          if p_speed else "-")
                ratio = f32 / x if f32 and x else None
                share = gbs(f"BM_decode/kv:{kv}" + base)
                pct = 100 * share / probe if share and probe else None
                body.append([
                    f"decode H=32 Hkv={hkv} L=128 Skv=32768, K/V {kv} vs f32",
                    f"{fmt(ratio, 2)}x ({fmt(x, 0)} vs {fmt(f32, 0)} us); "
                    f"{fmt(share)} GB/s = {fmt(pct, 0)}% of the probe "
                    f"({fmt(probe)} GB/s over {probe_name}, {which}{also})",
                    p_cell, ">= 1.8x, >= 70%"])
        for shape in ("/H:8/Hkv:8/L:64/Skv:4096", "/H:32/Hkv:32/L:128/Skv:32768",
                      "/H:32/Hkv:8/L:128/Skv:32768"):
            h = t("BM_decode_twin/headsum/kv:bf16" + shape + s)
            o = t("BM_decode_twin/onednn/kv:bf16" + shape + s)
            r = o / h if h and o else None
            body.append([f"decode bf16 K/V{shape.replace('/', ' ')} vs oneDNN bf16 composed",
                         f"{fmt(r, 2)}x ({fmt(h, 0)} vs {fmt(o, 0)} us)", "-", ">= 1.5x"])
        for S in (512, 2048):
            for c in (0, 1):
                suf = f"/S:{S}/causal:{c}{s}"
                a, b = t("BM_layout/bhsd" + suf), t("BM_layout/bshd" + suf)
                r = a / b if a and b else None
                p = counter("BM_paired_views" + suf, "token_major")
                body.append([f"token-major vs contiguous, S={S}{' causal' if c else ''}",
                             f"{fmt(r, 2)}x", f"{fmt(p, 2)}x", ">= 0.95x"])
        for S in (512, 2048):
            for c in (0, 1):
                suf = f"/S:{S}/causal:{c}{s}"
                f32 = t("BM_prefill/kv:f32" + suf)
                for kv in ("f16", "bf16"):
                    x = t(f"BM_prefill/kv:{kv}" + suf)
                    r = f32 / x if f32 and x else None
                    p = counter("BM_paired_views" + suf, f"speed_{kv}")
                    body.append([f"prefill S={S}{' causal' if c else ''}, K/V {kv} vs f32",
                                 f"{fmt(r, 2)}x", f"{fmt(p, 2)}x", ">= 0.9x"])
        for S in (1, 20, 512):
            f32 = t(f"BM_projection/wo:f32/S:{S}{s}")
            b = t(f"BM_projection/wo:bf16/S:{S}{s}")
            r = f32 / b if f32 and b else None
            p = counter(f"BM_paired_projection/S:{S}/wo:cache{s}", "speed_bf16")
            body.append([f"projection S={S}, Wo bf16 vs f32",
                         f"{fmt(r, 2)}x ({fmt(b)} vs {fmt(f32)} us)",
                         f"{fmt(p, 2)}x" if p else "-",
                         ">= 1.6x" if S == 1 else "reported"])
        for S in (1, 20):
            name = "BM_projection_stream/wo:{}/S:" + f"{S}{s}"
            f32, b = t(name.format("f32")), t(name.format("bf16"))
            r = f32 / b if f32 and b else None
            bw = gbs(name.format("f32")), gbs(name.format("bf16"))
            p = counter(f"BM_paired_projection/S:{S}/wo:memory{s}", "speed_bf16")
            body.append([f"projection S={S}, Wo from memory (a ring of layers beyond the LLC), "
                         "bf16 vs f32",
                         f"{fmt(r, 2)}x ({fmt(b)} vs {fmt(f32)} us; "
                         f"Wo read at {fmt(bw[1])} / {fmt(bw[0])} GB/s)",
                         f"{fmt(p, 2)}x" if p else "-",
                         ">= 1.6x" if S == 1 else "reported"])
        lines += ["", f"## {th} thread{'s' if th > 1 else ''}", ""]
        lines += render(["case", "measured", "paired", "goal"], body, [False] * 4, True)
    return lines


def tensor_options(p: argparse.ArgumentParser) -> None:
    source_options(p, "headsum_tensor_bench", "read this headsum_tensor_bench JSON output "
                   "instead (or name it without --json)", required=False)
    p.add_argument("json_file", nargs="?", metavar="JSON", help="the same as --json JSON")
    p.add_argument("--offset", type=int,
                   help="with --bench: --offset=N, every buffer N bytes past a 64-byte "
                        "boundary (a multiple of 4 below 64)")
    clock_option(p, "for every row (the main thread's: meant for the rows of one "
                      "thread)")


def tensor_main(args: argparse.Namespace) -> int:
    given = [x for x in (args.bench, args.json, args.json_file) if x]
    if len(given) != 1:
        args.parser.error("name one of --bench BINARY, --json JSON or JSON")
    if args.bench:
        extra = bench_flags(args)
        if args.offset is not None:
            extra.append(f"--offset={args.offset}")
        doc = run_bench(args.bench, args.repetitions, extra)
        if args.save_json:
            save_json(doc, Path(args.save_json))
    else:
        doc = load_json(args.json or args.json_file)
    print("\n".join(tensor_lines(doc, args.clock)))
    return 0


# --------------------------------------------------------------------------
# per-head: headsum_per_head_bench, the cost of per-head contributions

PER_HEAD_DOC = """Runs headsum_per_head_bench and prints what per-head contributions cost.

Attribution (R=1) straight from the fused kernel and through a precomputed
basis, against materializing every contribution [B][S][H][D] and dotting it
with the direction; and the extra time of writing per_head over a plain
project_heads_sum.  Medians of --repetitions runs, times in microseconds.
With --bench, OMP_PROC_BIND=true unless the environment sets it.
"""


def per_head_times(doc: dict, clock: str) -> dict[tuple[str, int, int], float]:
    """Microseconds (the bench's unit) by (benchmark, S, threads)."""
    times = {}
    for name, b in median_rows(doc).items():
        parsed = parse_name(name, labels=0)
        if b is None or parsed is None:
            continue
        kind, _, params = parsed
        if not {"S", "R", "threads"} <= params.keys():
            continue
        seq, threads = params["S"], params["threads"]
        times[(kind, seq, threads)] = b.get(time_key(clock, threads), math.nan)
    return times


def per_head_lines(doc: dict, clock: str, markdown: bool) -> list[str]:
    t = per_head_times(doc, clock)
    keys = sorted({(s, th) for (_, s, th) in t})
    lines = ["", "Per-head contributions (B=1, H=8, L=64, D=512, R=1; medians, microseconds)"]
    if clock == CPU:
        lines.append("--clock cpu: one-thread rows timed by CPU time (time waiting for a core "
                     "excluded); rows of 2 threads by the wall clock")
    head = ["S", "threads", "attribution", "via basis", "materialize+dot", "speedup",
            "basis speedup", "project", "project+per_head", "per_head extra"]

    def times(x: float) -> str:
        return fmt(x) + "x" if not math.isnan(x) else "-"

    body = []
    for s, th in keys:
        attr, basis, mat, plain, per = (
            t.get((k, s, th), math.nan) for k in ("AttributionHeadsum", "AttributionBasis",
                                                  "AttributionMaterialize", "ProjectPlain",
                                                  "ProjectPerHead"))
        extra = 100.0 * (per / plain - 1.0)
        body.append([str(s), str(th), fmt(attr), fmt(basis), fmt(mat), times(mat / attr),
                     times(mat / basis), fmt(plain), fmt(per),
                     "-" if math.isnan(extra) else f"{extra:+.0f}%"])
    return lines + [""] + render(head, body, [True] * len(head), markdown)


def per_head_options(p: argparse.ArgumentParser) -> None:
    source_options(p, "headsum_per_head_bench",
                   "read this headsum_per_head_bench JSON output instead")
    clock_option(p, "for the rows of one thread (rows of more threads keep the wall "
                      "clock)")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")


def per_head_main(args: argparse.Namespace) -> int:
    if args.bench:
        env = dict(os.environ)
        env.setdefault("OMP_PROC_BIND", "true")
        doc = run_bench(args.bench, args.repetitions, bench_flags(args), env)
        if args.save_json:
            save_json(doc, Path(args.save_json))
    else:
        doc = load_json(args.json)
    print("\n".join(per_head_lines(doc, args.clock, args.markdown)))
    return 0


# --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    commands = (
        ("kernels", "headsum_bench: every kernel beside its oneDNN twin, threads pinned and "
         "unpinned, aligned and 16-byte-offset buffers, shares of the peak and of the read "
         "bandwidth, the fixed per-call cost, a plot", KERNELS_DOC, kernels_options,
         kernels_main),
        ("tensor", "headsum_tensor_bench: the tensor API's ratios (16-bit K/V and Wo, "
         "token-major views, oneDNN's bf16 attention), the paired rows' ratios beside them",
         TENSOR_DOC, tensor_options, tensor_main),
        ("per-head", "headsum_per_head_bench: what per-head contributions cost",
         PER_HEAD_DOC, per_head_options, per_head_main),
    )
    for name, summary, doc, options, run in commands:
        p = subcommand(subparsers, name, summary, doc)
        options(p)
        p.set_defaults(run=run, parser=p)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
