#!/usr/bin/env python3
"""The tensor issue's goals from one run of headsum_tensor_bench.

    build/bench/headsum_tensor_bench --benchmark_format=json > t.json
    python3 scripts/tensor_table.py [--clock cpu|wall] t.json

Reads the _median rows and prints, per thread count, every ratio the goals
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
"""
import json
import re
import sys


def load(path):
    with open(path) as f:
        data = json.load(f)
    rows = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        name = re.sub(r"(/iterations:\d+)?/real_time$", "", b["run_name"])
        rows[name] = b
    return data.get("context", {}), rows


CLOCK = "real_time"


def t(rows, name):
    b = rows.get(name)
    return None if b is None else b[CLOCK]


def counter(rows, name, key):
    b = rows.get(name)
    return None if b is None else b.get(key)


def gbs(rows, name):
    return counter(rows, name, "GB/s")


def fmt(x, spec="{:.2f}"):
    return "-" if x is None else spec.format(x)


def main():
    global CLOCK
    args = sys.argv[1:]
    if "--clock" in args:
        i = args.index("--clock")
        CLOCK = {"cpu": "cpu_time", "wall": "real_time"}[args[i + 1]]
        del args[i:i + 2]
    if len(args) != 1:
        print(__doc__)
        sys.exit(2)
    ctx, rows = load(args[0])
    print(f"times: {CLOCK} (--clock cpu: the main thread's CPU time, for 1-thread rows "
          f"on a loaded machine)")
    print(f"host {ctx.get('host_name', '?')}, {ctx.get('num_cpus', '?')} cpus, "
          f"{ctx.get('date', '')}; buffers {ctx.get('buffer_offset', '0')} bytes past a "
          f"64-byte boundary")
    for th in (1, 2):
        s = f"/threads:{th}"
        print(f"\n## {th} thread{'s' if th > 1 else ''}\n")
        print("| case | measured | paired | goal |")
        print("|---|---|---|---|")
        for hkv in (32, 8):
            base = f"/H:32/Hkv:{hkv}/L:128/Skv:32768{s}"
            f32 = t(rows, "BM_decode/kv:f32" + base)
            kv_bytes_16 = 2 * hkv * 32768 * 128 * 2
            probe_name = {512 << 20: "512MiB", 128 << 20: "128MiB"}.get(kv_bytes_16)
            probe1 = gbs(rows, f"BM_read_probe/bytes:{probe_name}{s}") if probe_name else None
            # The two-stream probe (K and V side by side, as the decode
            # reads them) where the run has it; the share is of the faster.
            probe2 = gbs(rows, f"BM_read_probe2/bytes:{probe_name}{s}") if probe_name else None
            probes = [p for p in (probe1, probe2) if p]
            probe = max(probes) if probes else None
            which = ("two streams" if probe2 and probe == probe2 else "one stream")
            also = (f"; the other probe {fmt(probe1 if probe == probe2 else probe2, '{:.1f}')}"
                    if probe1 and probe2 else "")
            paired = f"BM_paired_decode{base}"
            for kv in ("f16", "bf16"):
                x = t(rows, f"BM_decode/kv:{kv}" + base)
                p_speed = counter(rows, paired, f"speed_{kv}")
                p_share = counter(rows, paired, f"share_{kv}")
                p_cell = (f"{fmt(p_speed)}x, {fmt(100 * p_share if p_share else None, '{:.0f}')}%"
                          if p_speed else "-")
                ratio = f32 / x if f32 and x else None
                share = gbs(rows, f"BM_decode/kv:{kv}" + base)
                pct = 100 * share / probe if share and probe else None
                print(f"| decode H=32 Hkv={hkv} L=128 Skv=32768, K/V {kv} vs f32 | "
                      f"{fmt(ratio)}x ({fmt(x, '{:.0f}')} vs {fmt(f32, '{:.0f}')} us); "
                      f"{fmt(share, '{:.1f}')} GB/s = {fmt(pct, '{:.0f}')}% of the probe "
                      f"({fmt(probe, '{:.1f}')} GB/s over {probe_name}, {which}{also}) "
                      f"| {p_cell} | >= 1.8x, >= 70% |")
        for shape in ("/H:8/Hkv:8/L:64/Skv:4096", "/H:32/Hkv:32/L:128/Skv:32768",
                      "/H:32/Hkv:8/L:128/Skv:32768"):
            h = t(rows, "BM_decode_twin/headsum/kv:bf16" + shape + s)
            o = t(rows, "BM_decode_twin/onednn/kv:bf16" + shape + s)
            r = o / h if h and o else None
            print(f"| decode bf16 K/V{shape.replace('/', ' ')} vs oneDNN bf16 composed | "
                  f"{fmt(r)}x ({fmt(h, '{:.0f}')} vs {fmt(o, '{:.0f}')} us) | - | >= 1.5x |")
        for S in (512, 2048):
            for c in (0, 1):
                suf = f"/S:{S}/causal:{c}{s}"
                a, b = t(rows, "BM_layout/bhsd" + suf), t(rows, "BM_layout/bshd" + suf)
                r = a / b if a and b else None
                p = counter(rows, "BM_paired_views" + suf, "token_major")
                print(f"| token-major vs contiguous, S={S}{' causal' if c else ''} | "
                      f"{fmt(r)}x | {fmt(p)}x | >= 0.95x |")
        for S in (512, 2048):
            for c in (0, 1):
                suf = f"/S:{S}/causal:{c}{s}"
                f32 = t(rows, "BM_prefill/kv:f32" + suf)
                for kv in ("f16", "bf16"):
                    x = t(rows, f"BM_prefill/kv:{kv}" + suf)
                    r = f32 / x if f32 and x else None
                    p = counter(rows, "BM_paired_views" + suf, f"speed_{kv}")
                    print(f"| prefill S={S}{' causal' if c else ''}, K/V {kv} vs f32 | "
                          f"{fmt(r)}x | {fmt(p)}x | >= 0.9x |")
        for S in (1, 20, 512):
            f32 = t(rows, f"BM_projection/wo:f32/S:{S}{s}")
            b = t(rows, f"BM_projection/wo:bf16/S:{S}{s}")
            r = f32 / b if f32 and b else None
            p = counter(rows, f"BM_paired_projection/S:{S}/wo:cache{s}", "speed_bf16")
            print(f"| projection S={S}, Wo bf16 vs f32 | {fmt(r)}x "
                  f"({fmt(b, '{:.1f}')} vs {fmt(f32, '{:.1f}')} us) | "
                  f"{fmt(p) + 'x' if p else '-'} | {'>= 1.6x' if S == 1 else 'reported'} |")
        for S in (1, 20):
            name = "BM_projection_stream/wo:{}/S:" + f"{S}{s}"
            f32, b = t(rows, name.format("f32")), t(rows, name.format("bf16"))
            r = f32 / b if f32 and b else None
            bw = gbs(rows, name.format("f32")), gbs(rows, name.format("bf16"))
            p = counter(rows, f"BM_paired_projection/S:{S}/wo:memory{s}", "speed_bf16")
            print(f"| projection S={S}, Wo from memory (a ring of layers beyond the LLC), "
                  f"bf16 vs f32 | {fmt(r)}x ({fmt(b, '{:.1f}')} vs {fmt(f32, '{:.1f}')} us; "
                  f"Wo read at {fmt(bw[1], '{:.1f}')} / {fmt(bw[0], '{:.1f}')} GB/s) | "
                  f"{fmt(p) + 'x' if p else '-'} | {'>= 1.6x' if S == 1 else 'reported'} |")


if __name__ == "__main__":
    main()
