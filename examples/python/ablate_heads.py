"""Which head writes most along a direction?  Find it with head_attribution,
confirm it by ablation with gates, and compare the memory that
materializing every head's contribution ([B][S][H][D], TransformerLens's
"result" hook) would take with what headsum writes.

A small attention layer with random weights, in NumPy: x @ Wq/Wk/Wv, the
per-head attention (headsum.attention reads Q/K/V token-major, as views of
the projections, without a copy), and the output projection read as a sum
over heads.  One head gets a planted component along the direction, so
there is a right answer to find.

    pip install .   # at the repository root
    python examples/python/ablate_heads.py
"""

import numpy as np

import headsum


def human(nbytes):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024 or unit == "TiB":
            return f"{nbytes:.1f} {unit}" if unit != "B" else f"{nbytes} B"
        nbytes /= 1024


def main():
    rng = np.random.default_rng(7)
    B, S, H, L, D = 2, 64, 8, 64, 512
    planted = 5

    x = rng.standard_normal((B, S, D)).astype(np.float32)
    wq, wk, wv = ((rng.standard_normal((D, H * L)) / np.sqrt(D)).astype(np.float32) for _ in range(3))
    wo = (rng.standard_normal((H * L, D)) / np.sqrt(H * L)).astype(np.float32)
    bias = (rng.standard_normal(D) * 0.1).astype(np.float32)
    direction = rng.standard_normal(D).astype(np.float32)
    direction /= np.linalg.norm(direction)
    # Head `planted` writes along the direction: its Wo slice gains a
    # rank-one part u direction^T.
    u = rng.standard_normal(L).astype(np.float32)
    wo[planted * L : (planted + 1) * L] += 0.5 * np.outer(u, direction)

    # [B][S][H*L] -> [B][H][S][L] views (strides, no copy).
    def heads(w):
        return (x @ w).reshape(B, S, H, L).transpose(0, 2, 1, 3)

    o = headsum.attention(heads(wq), heads(wk), heads(wv), causal=True)  # [B][H][S][L]
    y = headsum.project_heads_sum(o, wo, bias)  # [B][S][D]

    # Attribution along the direction, [B][S][H]: no [B][S][H][D] tensor.
    attribution = headsum.head_attribution(o, wo, direction)
    score = np.abs(attribution).sum(axis=(0, 1))
    top = int(np.argmax(score))
    print("head  sum over (b, s) of |attribution along the direction|")
    for h in range(H):
        print(f"  {h}   {score[h]:10.4f}{'   <- most' if h == top else ''}")

    # Ablation: gate each head to 0; the output moves along the direction
    # by minus that head's attribution, and the top head moves it most.
    moved = np.empty(H)
    for h in range(H):
        gates = np.ones(H, np.float32)
        gates[h] = 0.0
        y_without = headsum.project_heads_sum(o, wo, bias, gates)
        delta = (y - y_without) @ direction  # [B][S]
        moved[h] = np.abs(delta).sum()
        err = np.abs(delta - attribution[:, :, h]).max()
        assert err <= 1e-4 * (1 + np.abs(attribution[:, :, h]).max()), (h, err)
    print("ablating each head: sum over (b, s) of |movement of y along the direction|")
    for h in range(H):
        print(f"  {h}   {moved[h]:10.4f}")
    assert int(np.argmax(moved)) == top == planted
    print(f"head {top} writes most along the direction; ablation confirms it "
          f"(y . direction moves by its attribution, to float32 rounding)")

    # Memory: every head's contribution materialized vs what headsum writes.
    def sizes(b, s, h, d, r=1):
        return b * s * h * d * 4, b * s * h * r * 4

    full, ours = sizes(B, S, H, D)
    print(f"\nthis example: [B][S][H][D] contributions {human(full)}, "
          f"headsum's attribution [B][S][H] {human(ours)}")
    for name, (b, s, h, d) in {
        "GPT-2 small, batch 8 x 1024 tokens": (8, 1024, 12, 768),
        "Llama-2-7B, batch 4 x 4096 tokens": (4, 4096, 32, 4096),
    }.items():
        full, ours = sizes(b, s, h, d)
        print(f"{name}, one layer: materialized {human(full)}, headsum {human(ours)} "
              f"({full // ours}x less)")

    # And the materialized way agrees (here it still fits).
    c = headsum.head_contributions(o, wo)  # [B][S][H][D]
    assert np.allclose(c @ direction, attribution, rtol=1e-4, atol=1e-4)


if __name__ == "__main__":
    main()
