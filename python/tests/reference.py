"""Float64 references and error bounds for the binding's tests.

The bounds are the ones the C++ suite asserts (tests/error_bounds.h and .cc,
README "Numerics"), computed here with NumPy from the exact input values the
kernels are given: first-order rounding bounds in float32 eps times the
magnitude of the inputs, times kSafety = 2.  16-bit inputs are compared
against a reference fed the same rounded values (widened exactly), so they
carry the float32 bound; a 16-bit result adds its one rounding, relative
2^-11 (float16) or 2^-8 (bfloat16) of the value, plus half the smallest
subnormal.
"""

import numpy as np

EPS = float(np.finfo(np.float32).eps)  # 2^-23
SAFETY = 2.0
EXP_REL_ERR = 8 * EPS

# Unit roundoff and half the smallest subnormal of each 16-bit result dtype.
ROUNDING = {
    "float32": (0.0, 0.0),
    "float16": (2.0**-11, 2.0**-25),
    "bfloat16": (2.0**-8, 2.0**-134),
}


# The native bf16 paths (headsum.compiled_targets() lists them first).
NATIVE_PATHS = ("AMX_BF16", "AVX512_BF16", "NEON_BF16")


def native_rounds_p(*inputs):
    """Whether a native bf16 path may compute an attention of these inputs:
    one is in force and they are all bfloat16.  It rounds P to bf16 for P V,
    relative 2^-8 a term (tests/error_bounds.cc, NativeBf16PvBound); where
    the call runs on the Highway kernels instead (AVX512_BF16 on Intel),
    the bound is merely the looser."""
    import headsum

    return headsum.active_target() in NATIVE_PATHS and all(
        dtype_name(x) == "bfloat16" for x in inputs
    )


def f64(a):
    """The exact values of a NumPy array or torch tensor, as float64."""
    if hasattr(a, "detach"):  # torch: widen exactly before leaving torch
        import torch

        return a.detach().to(torch.float64).numpy()
    return np.asarray(a, dtype=np.float64)


def dtype_name(a):
    return str(a.dtype).replace("torch.", "")


def visible(sq, skv, causal, window=0):
    """[Sq][Skv] mask: query i (at position p = i + Skv - Sq, bottom-right
    aligned) sees key j: causal j <= p; a window, causal p - window < j <= p,
    else |j - p| < window."""
    p = np.arange(sq)[:, None] + (skv - sq)
    j = np.arange(skv)[None, :]
    vis = np.ones((sq, skv), dtype=bool)
    if causal:
        vis &= j <= p
    if window > 0:
        vis &= (j > p - window) if causal else (np.abs(j - p) < window)
    return vis


def score_options(s, softcap=0.0, alibi_slopes=None, bias=None):
    """What a model adds to the scores s = scale q.k [B][H][Sq][Skv], in the
    kernels' order (softcap tanh, + slope (j - p), + bias), and the error
    those steps add in float32 (tests/error_bounds.cc, OptionsScoreError):
    the softcap c (EXP_REL_ERR / 2 + 5 eps) + 4 eps |s|; each added term
    eps |term| + eps |the sum so far|.  bias: float64 values broadcastable
    to s (-inf removes a key, adds no error)."""
    Sq, Skv = s.shape[2], s.shape[3]
    mag = np.abs(s)
    err = np.zeros(s.shape)
    if softcap > 0:
        err = err + softcap * (EXP_REL_ERR / 2 + 5 * EPS) + 4 * EPS * mag
        s = softcap * np.tanh(s / softcap)
        mag = softcap * np.tanh(mag / softcap)
    if alibi_slopes is not None:
        dist = np.arange(Skv)[None, :] - (np.arange(Sq)[:, None] + (Skv - Sq))
        term = np.asarray(alibi_slopes, np.float64)[None, :, None, None] * dist[None, None]
        s = s + term
        mag = mag + np.abs(term)
        err = err + EPS * np.abs(term) + EPS * mag
    if bias is not None:
        b = np.broadcast_to(bias, s.shape)
        finite = np.isfinite(b)
        s = s + b
        term = np.where(finite, np.abs(b), 0.0)
        mag = mag + term
        err = err + np.where(finite, EPS * term + EPS * mag, 0.0)
    return s, err


def softmax_v(s, score_err, vis, v, sinks=None, v_err=None, p_unit=0.0):
    """O = softmax(S) V over the visible, finite scores (a sink joining each
    row's denominator), and its first-order float32 error (without SAFETY):
    sum_j p_j delta_j |v_j| + delta_bar A + (2 Skv + 4) eps A (+ 4 eps A with
    sinks) + sum_j p_j v_err_j, A = sum_j p_j |v_j|; delta_j the relative
    error of weight j (exp, forming s_j - m, the score's own error), the
    sink's in delta_bar (tests/error_bounds.cc, SoftmaxVBoundImpl); p_unit
    A more where P is rounded for P V (2^-8: a native bf16 path).  s,
    score_err, vis [B][H][Sq][Skv]; v, v_err [B][H][Skv][L]."""
    Skv = s.shape[-1]
    vis = vis & (s > -np.inf)
    any_visible = vis.any(axis=-1, keepdims=True)
    m = np.where(vis, s, -np.inf).max(axis=-1, keepdims=True)
    m = np.where(any_visible, m, 0.0)
    sink_p = np.zeros(m.shape)
    sink_delta = np.zeros(m.shape)
    if sinks is not None:
        sink = np.asarray(sinks, np.float64)[None, :, None, None]
        m = np.maximum(m, sink)
        sink_p = np.where(any_visible, np.exp(sink - m), 0.0)
        sink_delta = np.minimum(EXP_REL_ERR + 3 * EPS * (np.abs(sink) + np.abs(m)), 1.0)
    w = np.where(vis, np.exp(np.where(vis, s - m, 0.0)), 0.0)
    z = w.sum(axis=-1, keepdims=True) + sink_p
    p = np.where(any_visible, w / np.where(z > 0, z, 1.0), 0.0)
    o = p @ v
    delta = EXP_REL_ERR + 2 * EPS * (np.abs(np.where(vis, s, 0.0)) + np.abs(m)) + score_err
    delta = np.where(np.where(vis, s, 0.0) - m < -80.0, 1.0, delta)
    delta = np.where(vis, np.minimum(delta, 1.0), 0.0)
    delta_bar = (p * delta).sum(axis=-1, keepdims=True)
    delta_bar = delta_bar + np.where(any_visible, sink_p / np.where(z > 0, z, 1.0), 0.0) * sink_delta
    a = p @ np.abs(v)
    weighted = (p * delta) @ np.abs(v)
    accumulation = (2 * Skv + 4) * EPS + (4 * EPS if sinks is not None else 0.0)
    err = weighted + delta_bar * a + accumulation * a + p_unit * a
    if v_err is not None:
        err = err + p @ v_err
    return o, err


def attention_ref(q, k, v, causal, scale, window=0, softcap=0.0, alibi_slopes=None,
                  sinks=None, bias=None, p_rounded=False):
    """O and its float32-kernel error bound.  q [B][H][Sq][L], k/v [B][Hkv][Skv][L]
    (float64 holding the kernel's inputs); scale the value the kernel uses;
    the options as headsum.attention takes them (float64 values);
    p_rounded: a native bf16 path may compute it (native_rounds_p)."""
    B, H, Sq, L = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    kk = np.repeat(k, H // Hkv, axis=1)
    vv = np.repeat(v, H // Hkv, axis=1)
    s = scale * np.einsum("bhil,bhjl->bhij", q, kk)
    score_err = (L + 3) * EPS * abs(scale) * np.einsum("bhil,bhjl->bhij", np.abs(q), np.abs(kk))
    s, extra = score_options(s, softcap, alibi_slopes, bias)
    vis = np.broadcast_to(visible(Sq, Skv, causal, window), s.shape)
    o, err = softmax_v(s, score_err + extra, vis, vv, sinks, p_unit=2.0**-8 if p_rounded else 0.0)
    return o, SAFETY * err


def split_wo(wo, heads):
    """Wo [H*L][D] as [H][L][D]."""
    return wo.reshape(heads, wo.shape[0] // heads, wo.shape[1])


def contributions_ref(o, wo):
    """c [B][S][H][D] = O_h Wo[h], and abs_c = sum_l |O_l W_l,c|."""
    w = split_wo(wo, o.shape[1])
    c = np.einsum("bhsl,hld->bshd", o, w)
    abs_c = np.einsum("bhsl,hld->bshd", np.abs(o), np.abs(w))
    return c, abs_c


def contributions_bound(o, abs_c):
    L = o.shape[3]
    return SAFETY * (L + 2) * EPS * abs_c


def project_ref(o, wo, bias=None, gates=None):
    """y [B][S][D] and its bound."""
    B, H, S, L = o.shape
    c, abs_c = contributions_ref(o, wo)
    g = np.ones(H) if gates is None else gates
    y = np.einsum("bshd,h->bsd", c, g)
    magnitude = np.einsum("bshd,h->bsd", abs_c, np.abs(g))
    if bias is not None:
        y = y + bias
        magnitude = magnitude + np.abs(bias)
    bound = SAFETY * (H * L + H + 3) * EPS * magnitude
    return y, bound


def attribution_ref(o, wo, directions):
    """a [B][S][H][R] and its bound; directions [R][D]."""
    B, H, S, L = o.shape
    D = wo.shape[1]
    w = split_wo(wo, H)
    c, _ = contributions_ref(o, wo)
    a = np.einsum("bshd,rd->bshr", c, directions)
    abs_wdir = np.einsum("hld,rd->hlr", np.abs(w), np.abs(directions))
    magnitude = np.einsum("bhsl,hlr->bshr", np.abs(o), abs_wdir)
    bound = SAFETY * (D + L + 3) * EPS * magnitude
    return a, bound


def norms_ref(o, wo):
    """n [B][S][H] = ||c_h|| and its bound (ContributionNormsBound)."""
    B, H, S, L = o.shape
    D = wo.shape[1]
    c, abs_c = contributions_ref(o, wo)
    n = np.sqrt((c * c).sum(axis=-1))
    a2 = (abs_c * abs_c).sum(axis=-1)
    dsq = (D + 2 * L + 4) * EPS * a2
    with np.errstate(divide="ignore"):
        via_sum = np.where(n > 0, dsq / np.where(n > 0, n, 1.0), np.inf)
    bound = SAFETY * (np.minimum(via_sum, np.sqrt(dsq)) + EPS * n)
    return n, bound


def assert_within(got, ref, bound, what):
    """|got - ref| <= bound element-wise, with the result's 16-bit rounding
    added when got is 16-bit.  bound must not be trivially large: callers
    pass the derived bound only."""
    name = dtype_name(got)
    unit, tiny = ROUNDING[name]
    g = f64(got)
    assert g.shape == ref.shape, f"{what}: shape {g.shape} != {ref.shape}"
    total = bound * (1 + unit) + unit * np.abs(ref) + tiny
    err = np.abs(g - ref)
    bad = ~(err <= total)
    if bad.any():
        idx = tuple(np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} elements out of bound; first at {idx}: "
            f"got {g[idx]!r}, ref {ref[idx]!r}, |err| {err[idx]:.3e} > bound {total[idx]:.3e}"
        )
