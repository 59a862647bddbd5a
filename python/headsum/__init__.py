"""headsum: SIMD multi-head attention kernels for CPUs, from Python.

Multi-head attention read as an addition machine: the output projection is
a sum over heads, Y = sum_h O_h @ Wo[h] + b, so each head's contribution can
be gated, measured and attributed without materializing [B][S][H][D].

    import numpy as np, headsum
    o = headsum.attention(q, k, v, causal=True)     # q [B][H][S][L], k/v [B][Hkv][S][L]
    y = headsum.project_heads_sum(o, wo)            # wo [H*L][D] -> y [B][S][D]
    a = headsum.head_attribution(o, wo, direction)  # [B][S][H]: who writes along it
    y_ablated = headsum.project_heads_sum(o, wo, gates=gates)
    mha = headsum.MHA(wq, wk, wv, wo, heads=8, rope_theta=10000.0)  # the whole layer
    cache = mha.new_cache(batch=1, capacity=4096)
    y = mha(x, cache)                               # x, y [B][S][Dm]
    headsum.paged_kv_write(k_new, v_new, k_pool, v_pool, block_table, q_offsets, kv_lens)
    o = headsum.attention_paged(q, k_pool, v_pool, block_table, q_offsets, kv_lens)

Arrays are NumPy float32/float16 arrays or DLPack tensors (PyTorch float32,
float16, bfloat16) on the CPU, read in place; see each function's docstring.
ValueError: a bad argument; RuntimeError: the build or CPU cannot serve the
call; MemoryError: out of memory.  The GIL is released while kernels run.

Integrations, imported on first use (so `import headsum` needs neither):
headsum.torch (scaled_dot_product_attention with torch's semantics, the
custom op torch.ops.headsum.sdpa) and headsum.transformers (importing it
registers attn_implementation="headsum" with Hugging Face transformers).
"""

from ._headsum import (
    MHA,
    AttributionBasis,
    KVCache,
    __version__,
    active_target,
    attention,
    attention_paged,
    compiled_targets,
    head_attribution,
    head_contribution_norms,
    head_contributions,
    paged_kv_write,
    project_heads_sum,
    set_num_threads,
    set_target,
)

_INTEGRATIONS = ("torch", "transformers")


def __getattr__(name):
    # headsum.torch imports torch and headsum.transformers transformers:
    # loaded when first named, never by `import headsum`.
    if name in _INTEGRATIONS:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "MHA",
    "AttributionBasis",
    "KVCache",
    "__version__",
    "active_target",
    "attention",
    "attention_paged",
    "compiled_targets",
    "head_attribution",
    "head_contribution_norms",
    "head_contributions",
    "paged_kv_write",
    "project_heads_sum",
    "set_num_threads",
    "set_target",
]
