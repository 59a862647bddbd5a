"""Randomized configurations against the float64 reference, on every target
this CPU runs: shapes off the vector edges, GQA/MQA, causal with Sq != Skv,
float32/float16 per tensor, token-major and head-major views, K/V as the
filled part of a larger cache whose tail holds NaN, strided and 16-bit
outputs.  Seeded: a failure names its configuration and reproduces."""

import numpy as np
import pytest

import headsum
from conftest import runnable_targets
from reference import assert_within, attention_ref, f64, project_ref

DTYPES = [np.float32, np.float16]


def filled_rows(rng, B, H, S, L, dtype, token_major, capacity, tail):
    """[B][H][S][L] view of the first S rows of a [.. capacity ..] buffer
    (rows padded by 0-2 elements) whose unfilled rows hold `tail`."""
    pad = int(rng.integers(0, 3))
    shape = (B, capacity, H, L + pad) if token_major else (B, H, capacity, L + pad)
    buf = np.full(shape, tail, dtype=dtype)
    data = rng.standard_normal((B, H, S, L)).astype(dtype)
    if token_major:
        buf[:, :S, :, :L] = data.transpose(0, 2, 1, 3)
        return buf[:, :S, :, :L].transpose(0, 2, 1, 3)
    buf[:, :, :S, :L] = data
    return buf[:, :, :S, :L]


def output(rng, shape, dtype):
    """A NaN-filled output, head-major or as a token-major view."""
    B, H, S, L = shape
    if rng.random() < 0.5:
        return np.full((B, S, H, L), np.nan, dtype=dtype).transpose(0, 2, 1, 3)
    return np.full(shape, np.nan, dtype=dtype)


@pytest.mark.parametrize("seed", range(8))
def test_attention_random_configurations(seed):
    rng = np.random.default_rng(1000 + seed)
    targets = runnable_targets()
    for _ in range(12):
        Hkv = int(rng.choice([1, 2, 3]))
        H = Hkv * int(rng.choice([1, 2, 4, 5]))
        B = int(rng.integers(1, 3))
        L = int(rng.choice([1, 3, 8, 16, 17, 31, 63, 64, 65, 128]))
        Sq = int(rng.choice([1, 2, 3, 7, 17, 33, 65]))
        Skv = int(rng.choice([1, 3, 17, 63, 65, 129, 300])) if rng.random() < 0.8 else Sq
        causal = bool(rng.random() < 0.5)
        dq, dk, dv, do = (DTYPES[int(rng.integers(0, 2))] for _ in range(4))
        q = filled_rows(rng, B, H, Sq, L, dq, rng.random() < 0.5, Sq, 0)
        k = filled_rows(rng, B, Hkv, Skv, L, dk, rng.random() < 0.5, Skv + int(rng.integers(0, 40)), np.nan)
        v = filled_rows(rng, B, Hkv, Skv, L, dv, rng.random() < 0.5, Skv + int(rng.integers(0, 40)), np.nan)
        scale = None if rng.random() < 0.7 else float(np.float32(rng.uniform(0.01, 2.0)))
        used = 1.0 / np.sqrt(L) if scale is None else scale
        ref, bound = attention_ref(f64(q), f64(k), f64(v), causal, used)
        what = (f"B={B} H={H} Hkv={Hkv} Sq={Sq} Skv={Skv} L={L} causal={causal} scale={scale} "
                f"q/k/v/o {[np.dtype(d).name for d in (dq, dk, dv, do)]}")
        for name in targets:
            headsum.set_target(name)
            out = output(rng, (B, H, Sq, L), do)
            headsum.attention(q, k, v, causal=causal, scale=scale, out=out)
            assert_within(out, ref, bound, f"attention on {name}, {what}")


@pytest.mark.parametrize("seed", range(8))
def test_projection_random_configurations(seed):
    rng = np.random.default_rng(2000 + seed)
    targets = runnable_targets()
    for _ in range(12):
        B = int(rng.integers(1, 3))
        H = int(rng.choice([1, 2, 3, 8]))
        L = int(rng.choice([1, 3, 16, 17, 64, 65]))
        S = int(rng.choice([1, 2, 5, 17, 20, 33]))
        D = int(rng.choice([1, 3, 16, 17, 63, 65, 512]))
        do, dw, dy = (DTYPES[int(rng.integers(0, 2))] for _ in range(3))
        o = filled_rows(rng, B, H, S, L, do, rng.random() < 0.5, S, 0)
        wpad = int(rng.integers(0, 5))
        wbuf = np.full((H * L, D + wpad), np.nan, dtype=dw)
        wbuf[:, :D] = (rng.standard_normal((H * L, D)) / np.sqrt(H * L)).astype(dw)
        wo = wbuf[:, :D]
        bias = rng.standard_normal(D).astype(np.float32) if rng.random() < 0.5 else None
        gates = rng.standard_normal(H).astype(np.float32) if rng.random() < 0.3 else None
        ref, bound = project_ref(f64(o), f64(wo), None if bias is None else f64(bias),
                                 None if gates is None else f64(gates))
        what = (f"B={B} H={H} L={L} S={S} D={D} bias={bias is not None} "
                f"gates={gates is not None} o/wo/y {[np.dtype(d).name for d in (do, dw, dy)]}")
        for name in targets:
            headsum.set_target(name)
            y = np.full((B, S, D + int(rng.integers(0, 3))), np.nan, dtype=dy)[..., :D]
            headsum.project_heads_sum(o, wo, bias, gates, out=y)
            assert_within(y, ref, bound, f"project_heads_sum on {name}, {what}")
