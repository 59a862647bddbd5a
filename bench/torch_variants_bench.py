"""The attention variants of current models, headsum against what a PyTorch
CPU engine runs for them, in one process, one thread each, calls alternated.

For each variant the torch side is what transformers' CPU code does for it:

  * a sliding window (Mistral, Gemma, gpt-oss), ALiBi (BLOOM, MPT) and a
    key-padding mask: torch.nn.functional.scaled_dot_product_attention with
    the equivalent float mask (-inf outside the window / on padded keys,
    slope (j - i) for ALiBi), built once outside the timed call;
  * softcap (Gemma 2) and sinks (gpt-oss): SDPA cannot express them, so the
    eager attention transformers falls back to (scores, tanh cap or a sink
    column, softmax in float32, times V).

headsum runs headsum.attention(q, k, v, window=, softcap=, alibi_slopes=,
sinks=, bias=) on the same torch tensors (read in place through DLPack).
Every row first checks that both sides agree (max |difference| printed).
B=1, H=8, L=64, float32 (and bfloat16 with --bf16), S=512 and 2048; the
window is 1024 over S=8192, causal.  Medians of alternated calls; speedup =
torch time / headsum time (the issue-55 goal: >= 2x).

    python bench/torch_variants_bench.py [--rounds N] [--quick] [--bf16]

scripts/torch_bench.sh runs it in a throwaway virtual environment with
torch and headsum installed when the current Python lacks torch.
"""

import argparse
import statistics
import time

import numpy as np
import torch

import headsum


def alternated(fns, rounds):
    """Medians of each function's times, the calls alternated."""
    for fn in fns:
        fn()  # warm up
    times = [[] for _ in fns]
    for _ in range(rounds):
        for t, fn in zip(times, fns):
            t0 = time.perf_counter()
            fn()
            t.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def causal_window_mask(S, window, dtype):
    i = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    seen = (j <= i) & (j > i - window) if window else (j <= i)
    return torch.where(seen, 0.0, float("-inf")).to(dtype)


def alibi_slopes(H):
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)])


def eager(q, k, v, scale, softcap=0.0, sinks=None):
    """transformers' eager attention: Gemma 2's soft-capping, gpt-oss's sinks."""
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    if sinks is not None:
        col = sinks.reshape(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1).to(s.dtype)
        s = torch.cat([s, col], dim=-1)
    p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
    if sinks is not None:
        p = p[..., :-1]
    return torch.matmul(p, v)


def rows(args):
    H, L = 8, 64
    scale = 1.0 / np.sqrt(L)
    dtypes = [torch.float32] + ([torch.bfloat16] if args.bf16 else [])
    sizes = [512] if args.quick else [512, 2048]
    out = []
    for dtype in dtypes:
        dname = str(dtype).replace("torch.", "")
        g = torch.Generator().manual_seed(7)
        slopes = alibi_slopes(H)
        sinks = torch.full((H,), 0.5)
        for S in sizes:
            q, k, v = (torch.randn(1, H, S, L, generator=g).to(dtype) for _ in range(3))
            pad = torch.zeros(1, 1, 1, S)
            pad[..., S - S // 4:] = float("-inf")
            i = torch.arange(S)[:, None]
            j = torch.arange(S)[None, :]
            alibi_mask = (slopes[:, None, None] * (j - i)[None]).unsqueeze(0)  # [1][H][S][S]
            cases = [
                ("softcap 50", lambda: headsum.attention(q, k, v, softcap=50.0),
                 lambda: eager(q, k, v, scale, softcap=50.0), "eager (tanh cap)"),
                ("alibi", lambda: headsum.attention(q, k, v, alibi_slopes=slopes.numpy()),
                 lambda: torch.nn.functional.scaled_dot_product_attention(
                     q, k, v, attn_mask=alibi_mask.to(dtype)), "SDPA, float mask"),
                ("sinks", lambda: headsum.attention(q, k, v, sinks=sinks.numpy()),
                 lambda: eager(q, k, v, scale, sinks=sinks), "eager (sink column)"),
                ("key-padding mask", lambda: headsum.attention(q, k, v, bias=pad.numpy()),
                 lambda: torch.nn.functional.scaled_dot_product_attention(
                     q, k, v, attn_mask=pad.to(dtype)), "SDPA, float mask"),
            ]
            for name, hs, th, how in cases:
                diff = (hs().float() - th().float()).abs().max().item()
                t_hs, t_th = alternated([hs, th], args.rounds)
                out.append((f"{name} S={S}", dname, how, t_hs, t_th, diff))
        # The sliding window: 1024 over S=8192, causal.
        S, W = (2048, 512) if args.quick else (8192, 1024)
        q, k, v = (torch.randn(1, H, S, L, generator=g).to(dtype) for _ in range(3))
        mask = causal_window_mask(S, W, dtype)
        hs = lambda: headsum.attention(q, k, v, causal=True, window=W)
        th = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        diff = (hs().float() - th().float()).abs().max().item()
        t_hs, t_th = alternated([hs, th], max(3, args.rounds // 3))
        out.append((f"window {W} over S={S} causal", dname, "SDPA, float mask", t_hs, t_th, diff))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--bf16", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    headsum.set_num_threads(1)
    print(f"headsum {headsum.__version__} on {headsum.active_target()}, torch {torch.__version__}, "
          f"one thread each, medians of {args.rounds} alternated calls, B=1 H=8 L=64")
    print()
    print("| variant | dtype | torch runs | headsum ms | torch ms | speedup | max abs diff |")
    print("|---|---|---|---:|---:|---:|---:|")
    for name, dname, how, t_hs, t_th, diff in rows(args):
        print(f"| {name} | {dname} | {how} | {t_hs * 1e3:.2f} | {t_th * 1e3:.2f} | "
              f"{t_th / t_hs:.2f}x | {diff:.1e} |")


if __name__ == "__main__":
    main()
