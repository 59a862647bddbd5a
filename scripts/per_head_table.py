#!/usr/bin/env python3
"""Runs headsum_per_head_bench and prints what per-head contributions cost.

Attribution (R=1) straight from the fused kernel and through a precomputed
basis, against materializing every contribution [B][S][H][D] and dotting it
with the direction; and the extra time of writing per_head over a plain
project_heads_sum.  Medians of --repetitions runs, times in microseconds.
"""
import argparse
import json
import os
import re
import subprocess
import sys


def run(bench, repetitions, min_time):
    cmd = [bench, "--benchmark_format=json", f"--benchmark_repetitions={repetitions}",
           "--benchmark_report_aggregates_only=true"]
    if min_time:
        cmd.append(f"--benchmark_min_time={min_time}")
    env = dict(os.environ)
    env.setdefault("OMP_PROC_BIND", "true")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out)


def medians(report):
    times = {}
    for b in report["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        m = re.match(r"BM_(\w+)/S:(\d+)/R:(\d+)/threads:(\d+)", b["name"])
        if m:
            kind, seq, _, threads = m.group(1), int(m.group(2)), m.group(3), int(m.group(4))
            times[(kind, seq, threads)] = b["real_time"]  # microseconds (bench unit)
    return times


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bench", required=True, help="path to headsum_per_head_bench")
    p.add_argument("--repetitions", type=int, default=5)
    p.add_argument("--min-time", default="")
    a = p.parse_args()
    t = medians(run(a.bench, a.repetitions, a.min_time))
    keys = sorted({(s, th) for (_, s, th) in t})
    print("\nPer-head contributions (B=1, H=8, L=64, D=512, R=1; medians, microseconds)\n")
    head = ("S", "threads", "attribution", "via basis", "materialize+dot", "speedup",
            "basis speedup", "project", "project+per_head", "per_head extra")
    rows = []
    for s, th in keys:
        g = lambda k: t.get((k, s, th), float("nan"))
        attr, basis, mat = g("AttributionHeadsum"), g("AttributionBasis"), g("AttributionMaterialize")
        plain, per = g("ProjectPlain"), g("ProjectPerHead")
        rows.append((str(s), str(th), f"{attr:.1f}", f"{basis:.1f}", f"{mat:.1f}",
                     f"{mat / attr:.1f}x", f"{mat / basis:.1f}x", f"{plain:.1f}", f"{per:.1f}",
                     f"{100.0 * (per / plain - 1.0):+.0f}%"))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
