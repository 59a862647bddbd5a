"""headsum from Python against PyTorch on the CPU, one thread each.

  * attention: headsum.attention vs torch.nn.functional.scaled_dot_product_attention,
    float32 and bfloat16 torch tensors (headsum reads them in place through
    DLPack), B=1, H=8, L=64, S=512 and 2048, causal and not;
  * head attribution: headsum.head_attribution (and a reusable
    AttributionBasis) vs materializing every head's contribution
    [B][S][H][D] with torch.einsum and dotting it with the directions;
  * the binding's call overhead: attention at Sq=Skv=1 (B=1, H=8, L=64),
    whose kernel work is a few hundred nanoseconds;
  * concurrency: two Python threads calling attention (one kernel thread
    each) at once, against the two calls one after the other, beside a
    control that is known to release the GIL (hashlib over 8 MiB).  The GIL's
    release itself is tested (python/tests/test_settings.py); how much two
    calls gain from a second core depends on the machine (two vCPUs that
    are one core's SMT siblings share its FMA units), so it is reported
    here, not asserted.

Times are the best of repeated calls (the least disturbed by other load) and
the median.  Prints a Markdown table.

    python bench/python_bench.py [--quick]
"""

import argparse
import hashlib
import os
import statistics
import threading
import time

import numpy as np

import headsum

try:
    import torch
except ImportError:  # the overhead rows still run
    torch = None


def timed(fn, min_time, min_reps=3, max_reps=10000):
    fn()  # warm up
    times = []
    start = time.perf_counter()
    while len(times) < min_reps or (time.perf_counter() - start < min_time and len(times) < max_reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def us(t):
    return f"{t * 1e6:,.0f}" if t >= 1e-4 else f"{t * 1e6:.2f}"


def attention_rows(min_time, sizes):
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for S in sizes:
            for causal in (False, True):
                g = torch.Generator().manual_seed(S)
                q, k, v = (torch.randn(1, 8, S, 64, generator=g).to(dtype) for _ in range(3))
                hs = timed(lambda: headsum.attention(q, k, v, causal=causal), min_time)
                th = timed(
                    lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal),
                    min_time,
                )
                rows.append((str(dtype).replace("torch.", ""), S, causal, hs, th))
    return rows


def attribution_rows(min_time, sizes):
    rows = []
    B, H, L, D = 1, 8, 64, 512
    for S in sizes:
        for R in (1, 16):
            g = torch.Generator().manual_seed(R)
            o = torch.randn(B, H, S, L, generator=g)
            wo = torch.randn(H * L, D, generator=g) / 22.6
            d = torch.randn(R, D, generator=g)
            basis = headsum.AttributionBasis(wo, d, H)
            w3 = wo.view(H, L, D)

            def materialized():
                c = torch.einsum("bhsl,hld->bshd", o, w3)  # [B][S][H][D]
                return c @ d.T

            hs = timed(lambda: headsum.head_attribution(o, wo, d), min_time)
            hb = timed(lambda: basis(o), min_time)
            th = timed(materialized, min_time)
            ref = materialized()
            assert torch.allclose(headsum.head_attribution(o, wo, d), ref, rtol=1e-3, atol=1e-3)
            rows.append((S, R, hs, hb, th, B * S * H * D * 4))
    return rows


def overhead_rows(min_time):
    rows = []
    q = np.random.default_rng(0).standard_normal((1, 8, 1, 64)).astype(np.float32)
    out = np.empty_like(q)
    rows.append(("NumPy float32, new result", timed(lambda: headsum.attention(q, q, q), min_time)))
    rows.append(("NumPy float32, out=", timed(lambda: headsum.attention(q, q, q, out=out), min_time)))
    if torch is not None:
        t = torch.from_numpy(q)
        tout = torch.empty_like(t)
        rows.append(("torch float32, new result", timed(lambda: headsum.attention(t, t, t), min_time)))
        rows.append(("torch float32, out=", timed(lambda: headsum.attention(t, t, t, out=tout), min_time)))
        rows.append(
            ("torch SDPA, same shape", timed(lambda: torch.nn.functional.scaled_dot_product_attention(t, t, t), min_time))
        )
    return rows


def serial_and_concurrent(work, rounds):
    """Best-of-rounds seconds for work(0); work(1) one after the other, and
    for the two in two threads at once."""

    def serial():
        t0 = time.perf_counter()
        work(0)
        work(1)
        return time.perf_counter() - t0

    def concurrent():
        barrier = threading.Barrier(3)
        threads = [threading.Thread(target=lambda i=i: (barrier.wait(), work(i))) for i in (0, 1)]
        for t in threads:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        return time.perf_counter() - t0

    return min(serial() for _ in range(rounds)), min(concurrent() for _ in range(rounds))


def concurrency_rows(rounds):
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 8, 512, 64)).astype(np.float32) for _ in range(3))
    outs = [np.empty_like(q), np.empty_like(q)]
    blob = rng.bytes(8 << 20)
    work = {
        "hashlib.sha256, 8 MiB (control)": lambda i: hashlib.sha256(blob).digest(),
        "headsum.attention S=512, one kernel thread": lambda i: headsum.attention(q, k, v, out=outs[i]),
    }
    rows = []
    for name, fn in work.items():
        fn(0)
        serial, concurrent = serial_and_concurrent(fn, rounds)
        rows.append((name, serial, concurrent))
    assert np.array_equal(outs[0], outs[1])
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="S=512 only, shorter timing")
    args = parser.parse_args()
    min_time = 0.3 if args.quick else 1.5
    sizes = (512,) if args.quick else (512, 2048)
    headsum.set_num_threads(1)
    if torch is not None:
        torch.set_num_threads(1)
    print(f"headsum {headsum.__version__}, target {headsum.active_target()}, one thread each; "
          f"torch {torch.__version__ if torch else '(not installed)'}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")

    if torch is not None:
        print("| attention B=1 H=8 L=64 | S | causal | headsum us (best / median) | torch SDPA us (best / median) | speedup (best) |")
        print("|---|---|---|---|---|---|")
        for dtype, S, causal, hs, th in attention_rows(min_time, sizes):
            print(f"| {dtype} | {S} | {'yes' if causal else 'no'} | {us(hs[0])} / {us(hs[1])} | "
                  f"{us(th[0])} / {us(th[1])} | {th[0] / hs[0]:.2f}x |")
        print()
        print("| attribution B=1 H=8 L=64 D=512 | R | head_attribution us | AttributionBasis us | einsum materialized us | speedup (attribution, basis) | [B][S][H][D] materialized |")
        print("|---|---|---|---|---|---|---|")
        for S, R, hs, hb, th, nbytes in attribution_rows(min_time, sizes):
            print(f"| S={S} | {R} | {us(hs[0])} | {us(hb[0])} | {us(th[0])} | "
                  f"{th[0] / hs[0]:.1f}x, {th[0] / hb[0]:.1f}x | {nbytes / 2**20:.0f} MiB |")
        print()
    print("| call overhead: attention B=1 H=8 Sq=Skv=1 L=64 | us per call (best / median) |")
    print("|---|---|")
    for name, (best, median) in overhead_rows(min_time):
        print(f"| {name} | {us(best)} / {us(median)} |")
    print()
    print("| two Python threads at once | serial us (best) | concurrent us (best) | concurrent / serial |")
    print("|---|---|---|---|")
    for name, serial, concurrent in concurrency_rows(3 if args.quick else 10):
        print(f"| {name} | {us(serial)} | {us(concurrent)} | {concurrent / serial:.2f} |")


if __name__ == "__main__":
    main()
