"""Time to the second token: each decode step after a prefill, timed alone.

A headsum.MHA layer (default Dm=512 H=8 L=64, float32 weights and cache,
RoPE theta 10000, causal), one kernel thread, a cache of capacity 4096.
Each repeat runs a fresh prompt of --prompt tokens (4064: the cache then
holds 4064) and then --steps decode steps of one token, each timed on its
own with time.perf_counter around the call.  Prints the median (and min and
max) per step index over the repeats, and the median of the steps past the
first few as the steady state.

A repeat either reuses one cache (cache.reset() then the prefill: what an
engine serving one prompt after another does; the default) or makes a new
cache for each prompt (--new-cache).  The first repeat is a warm-up and is
not counted.

Then two controls with no prefill, after an idle gap as long as the median
prefill (a busy-wait on the calling thread that touches no memory of
note), in the same process: the cache truncated back to the prompt, a few
warm steps, the gap, and --steps timed steps; and a NumPy max over a buffer
of the step's working set (the K/V held plus the packed [Wq Wk Wv] and Wo),
passes 1 to 3 after the same gap, in GB/s.  Where the steps after the gap
are as slow as those after a prefill, and the probe's first passes as slow
against its third, the first steps' cost is the memory system's (data
that went cold during the gap), not anything the prefill leaves behind.

    python bench/first_steps.py [--repeats 15] [--steps 20] [--new-cache] [--no-control]
"""

import argparse
import statistics
import time

import numpy as np

import headsum


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dim", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=4064, help="tokens of each prefill")
    ap.add_argument("--capacity", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=20, help="decode steps timed after each prefill")
    ap.add_argument("--repeats", type=int, default=15, help="prompts (after one warm-up)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--new-cache", action="store_true", help="a new cache for every prompt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-control", action="store_true", help="skip the idle-gap controls")
    args = ap.parse_args()

    headsum.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    Dm, H, L = args.model_dim, args.heads, args.head_dim
    w = lambda r, c: (rng.standard_normal((r, c)) / np.sqrt(r)).astype(np.float32)  # noqa: E731
    mha = headsum.MHA(w(Dm, H * L), w(Dm, H * L), w(Dm, H * L), w(H * L, Dm), heads=H,
                      rope_theta=args.rope_theta)
    cache = mha.new_cache(batch=1, capacity=args.capacity)
    # Inputs made before any timing: a prompt and the step tokens per repeat.
    prompts = [rng.standard_normal((1, args.prompt, Dm), dtype=np.float32)
               for _ in range(args.repeats + 1)]
    tokens = [[rng.standard_normal((1, 1, Dm), dtype=np.float32) for _ in range(args.steps)]
              for _ in range(args.repeats + 1)]
    out = np.empty((1, 1, Dm), np.float32)

    times = [[] for _ in range(args.steps)]  # [step][repeat], seconds
    prefill = []
    for r in range(args.repeats + 1):
        if args.new_cache:
            cache = None  # the old one freed before the new one is made
            cache = mha.new_cache(batch=1, capacity=args.capacity)
        else:
            cache.reset()
        t0 = time.perf_counter()
        mha(prompts[r], cache)
        t1 = time.perf_counter()
        step_times = []
        for s in range(args.steps):
            x = tokens[r][s]
            t0s = time.perf_counter()
            mha(x, cache, out=out)
            step_times.append(time.perf_counter() - t0s)
        if r == 0:
            continue  # warm-up
        prefill.append(t1 - t0)
        for s, t in enumerate(step_times):
            times[s].append(t)

    print(f"headsum {headsum.__version__} target {headsum.active_target()}, "
          f"Dm={Dm} H={H} L={L} f32, {args.threads} thread(s), prompt {args.prompt} "
          f"(capacity {args.capacity}), {args.repeats} repeats, "
          f"{'a new cache' if args.new_cache else 'one cache reset'} per prompt")
    print(f"prefill: median {statistics.median(prefill) * 1e3:.2f} ms")
    print("step  cached  median_ms  min_ms  max_ms")
    for s in range(args.steps):
        t = times[s]
        print(f"{s + 1:4d}  {args.prompt + s:6d}  {statistics.median(t) * 1e3:9.3f}  "
              f"{min(t) * 1e3:6.3f}  {max(t) * 1e3:6.3f}")
    steady = [x for s in range(min(5, args.steps - 1), args.steps) for x in times[s]]
    first2 = [statistics.median(times[s]) * 1e3 for s in range(min(2, args.steps))]
    print(f"steps 1, 2: {', '.join(f'{m:.3f}' for m in first2)} ms; "
          f"steps {min(6, args.steps)}-{args.steps}: median {statistics.median(steady) * 1e3:.3f} ms")
    if not args.no_control:
        control(args, mha, Dm, H, L, statistics.median(prefill), rng)
    return 0


def spin(seconds: float) -> None:
    """Busy-waits on this thread (the core stays busy, nothing large is read)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def control(args, mha, Dm: int, H: int, L: int, gap: float, rng) -> None:
    cache = mha.new_cache(batch=1, capacity=args.capacity)
    mha(rng.standard_normal((1, args.prompt, Dm), dtype=np.float32), cache)
    x = rng.standard_normal((1, 1, Dm), dtype=np.float32)
    out = np.empty((1, 1, Dm), np.float32)
    times = [[] for _ in range(args.steps)]
    for _ in range(args.repeats):
        cache.truncate(args.prompt)
        for _ in range(5):
            mha(x, cache, out=out)  # warm: the working set read just before
        cache.truncate(args.prompt)
        spin(gap)
        for s in range(args.steps):
            t0 = time.perf_counter()
            mha(x, cache, out=out)
            times[s].append(time.perf_counter() - t0)
    med = [statistics.median(t) * 1e3 for t in times]
    print(f"control, no prefill: {gap * 1e3:.0f} ms idle, then steps 1-{min(5, args.steps)}: "
          f"{', '.join(f'{m:.3f}' for m in med[:5])} ms; "
          f"steps {min(6, args.steps)}-{args.steps}: median "
          f"{statistics.median(med[min(5, args.steps - 1):]):.3f} ms")
    # The step's working set: K and V held (f32), [Wq Wk Wv] and Wo (f32).
    nbytes = 2 * H * args.prompt * L * 4 + Dm * 3 * H * L * 4 + H * L * Dm * 4
    buf = np.ones(nbytes // 4, np.float32)
    passes = [[] for _ in range(3)]
    for _ in range(args.repeats):
        for _ in range(5):
            buf.max()
        spin(gap)
        for k in range(3):
            t0 = time.perf_counter()
            buf.max()
            passes[k].append(time.perf_counter() - t0)
    print(f"control, NumPy max over {nbytes / 2**20:.1f} MiB (the step's working set) after the "
          f"same idle: passes 1-3 "
          f"{', '.join(f'{nbytes / statistics.median(p) / 1e9:.1f}' for p in passes)} GB/s")


if __name__ == "__main__":
    raise SystemExit(main())
