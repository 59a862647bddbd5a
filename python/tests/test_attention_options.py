"""headsum.attention with what models add to the scores (window, softcap,
alibi_slopes, sinks, bias) against the float64 reference extended with each
of them (reference.py: score_options, softmax_v), each option alone and
together, broadcast biases with -inf, zero-copy, and every error."""

import numpy as np
import pytest

import headsum
from conftest import copies, runnable_targets, torch_or_skip
from reference import assert_within, attention_ref, f64

SHAPES = [
    # B, H, Hkv, Sq, Skv, L
    (2, 4, 2, 13, 29, 16),  # GQA, Sq < Skv
    (1, 2, 2, 20, 20, 64),  # MHA, square
    (2, 8, 2, 1, 300, 32),  # a decode step, GQA
    (1, 4, 1, 70, 150, 24),  # MQA, more than a query block
]

NEG_INF = -np.inf


def make_qkv(rng, B, H, Hkv, Sq, Skv, L, dtype=np.float32):
    q = rng.standard_normal((B, H, Sq, L)).astype(dtype)
    k = rng.standard_normal((B, Hkv, Skv, L)).astype(dtype)
    v = rng.standard_normal((B, Hkv, Skv, L)).astype(dtype)
    return q, k, v


def slopes_for(H):
    """BLOOM's 2^(-8 (h + 1) / H), scaled up to move O(1) scores."""
    return (2.0 * 2.0 ** (-8.0 * (np.arange(H) + 1) / H)).astype(np.float32)


def check(o, q, k, v, causal=False, scale=None, **options):
    L = q.shape[3]
    s = 1.0 / np.sqrt(L) if scale is None else float(np.float32(scale))
    ref_options = {}
    for name, value in options.items():
        if name in ("alibi_slopes", "sinks", "bias") and value is not None:
            # The values the kernel reads: arrays exactly, sequences as float32.
            value = f64(value) if hasattr(value, "dtype") else f64(np.asarray(value, np.float32))
        elif name == "softcap":
            value = float(np.float32(value))
        ref_options[name] = value
    ref, bound = attention_ref(f64(q), f64(k), f64(v), causal, s, **ref_options)
    assert_within(o, ref, bound, f"attention {sorted(options)}")
    return ref


def options_for(name, rng, B, H, Sq, Skv):
    """One option (or all) for a call of this shape."""
    if name == "window":
        return {"window": max(2, Skv // 5)}
    if name == "softcap":
        return {"softcap": 1.5}
    if name == "alibi":
        return {"alibi_slopes": slopes_for(H)}
    if name == "sinks":
        return {"sinks": rng.uniform(-1, 2, H).astype(np.float32)}
    if name == "bias":
        return {"bias": rng.uniform(-2, 2, (B, H, Sq, Skv)).astype(np.float32)}
    assert name == "all"
    out = {}
    for one in ("window", "softcap", "alibi", "sinks"):
        out.update(options_for(one, rng, B, H, Sq, Skv))
    bias = rng.uniform(-1, 1, (B, 1, 1, Skv)).astype(np.float32)
    bias[-1, ..., : Skv // 4] = NEG_INF  # padding at the front of the last sequence
    out["bias"] = bias
    return out


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("option", ["window", "softcap", "alibi", "sinks", "bias", "all"])
def test_each_option_and_all_match_reference(rng, shape, causal, option):
    B, H, Hkv, Sq, Skv, L = shape
    q, k, v = make_qkv(rng, *shape)
    options = options_for(option, rng, B, H, Sq, Skv)
    o = headsum.attention(q, k, v, causal=causal, **options)
    assert o.shape == q.shape and o.dtype == np.float32
    ref = check(o, q, k, v, causal, **options)
    # The option does something: the plain call is not that result.
    plain = headsum.attention(q, k, v, causal=causal)
    assert not np.allclose(plain, ref, rtol=1e-4, atol=1e-5), f"{option} changed nothing"


@pytest.mark.parametrize("dtype", [np.float16])
def test_options_on_16_bit_arrays(rng, dtype):
    B, H, Hkv, Sq, Skv, L = 2, 4, 2, 9, 40, 32
    q, k, v = make_qkv(rng, B, H, Hkv, Sq, Skv, L, dtype=dtype)
    options = options_for("all", rng, B, H, Sq, Skv)
    options["bias"] = options["bias"].astype(np.float16)  # a 16-bit bias, read as it is
    options["sinks"] = options["sinks"].astype(np.float16)
    before = copies()
    o = headsum.attention(q, k, v, causal=True, **options)
    assert o.dtype == dtype
    # The float16 sinks are staged to float32 for the C API (H values).
    assert copies()[0] - before[0] == 1
    check(o, q, k, v, True, **options)


def test_scale_with_options(rng):
    q, k, v = make_qkv(rng, 1, 2, 2, 6, 11, 16)
    for scale in (0.05, 2.0):
        options = {"softcap": 3.0, "alibi_slopes": [0.5, 0.25], "sinks": [0.0, 1.0]}
        check(headsum.attention(q, k, v, scale=scale, **options), q, k, v, False, scale, **options)


def test_all_options_on_every_target(rng):
    B, H, Hkv, Sq, Skv, L = 2, 4, 2, 5, 70, 16
    q, k, v = make_qkv(rng, B, H, Hkv, Sq, Skv, L)
    options = options_for("all", rng, B, H, Sq, Skv)
    for name in runnable_targets():
        headsum.set_target(name)
        check(headsum.attention(q, k, v, causal=True, **options), q, k, v, True, **options)


# --- the bias: broadcasting, -inf, zero-copy --------------------------------


def test_key_padding_mask_broadcasts_with_minus_inf(rng):
    B, H, Hkv, Sq, Skv, L = 3, 4, 2, 7, 25, 16
    q, k, v = make_qkv(rng, B, H, Hkv, Sq, Skv, L)
    lengths = [25, 18, 9]
    mask = np.zeros((B, 1, 1, Skv), np.float32)
    for b, n in enumerate(lengths):
        mask[b, ..., n:] = NEG_INF
    before = copies()
    o = headsum.attention(q, k, v, bias=mask)
    assert copies() == before  # read in place, strides {Skv, 0, 0}
    check(o, q, k, v, bias=mask)
    # Each sequence is attention over its own keys only.
    for b, n in enumerate(lengths):
        alone = headsum.attention(q[b : b + 1], k[b : b + 1, :, :n], v[b : b + 1, :, :n])
        np.testing.assert_allclose(o[b : b + 1], alone, rtol=1e-5, atol=1e-6)


def test_per_head_bias_with_minus_inf(rng):
    B, H, Hkv, Sq, Skv, L = 2, 4, 4, 9, 30, 8
    q, k, v = make_qkv(rng, B, H, Hkv, Sq, Skv, L)
    bias = rng.uniform(-2, 2, (1, H, Sq, Skv)).astype(np.float32)
    bias[0, 1, :, 3::7] = NEG_INF  # head 1 never sees every seventh key
    for b in (bias, bias[0]):  # [1][H][Sq][Skv] and [H][Sq][Skv]
        before = copies()
        o = headsum.attention(q, k, v, causal=True, bias=b)
        assert copies() == before
        check(o, q, k, v, True, bias=b)


@pytest.mark.parametrize(
    "bias_shape",
    [(7, 12), (1, 12), (4, 1, 12), (1, 4, 7, 12), (2, 1, 7, 12), (2, 4, 1, 12), (1, 1, 1, 12)],
)
def test_bias_broadcasts_as_numpy_does(rng, bias_shape):
    B, H, Sq, Skv = 2, 4, 7, 12
    q, k, v = make_qkv(rng, B, H, 2, Sq, Skv, 16)
    bias = rng.uniform(-3, 3, bias_shape).astype(np.float32)
    o = headsum.attention(q, k, v, bias=bias)
    full = np.broadcast_to(bias, (B, H, Sq, Skv))
    assert np.array_equal(o, headsum.attention(q, k, v, bias=np.ascontiguousarray(full)))
    check(o, q, k, v, bias=bias)


def test_bias_views_read_in_place_or_staged_once(rng):
    B, H, Sq, Skv = 2, 2, 5, 20
    q, k, v = make_qkv(rng, B, H, H, Sq, Skv, 16)
    big = rng.uniform(-1, 1, (B, H, Sq, Skv + 8)).astype(np.float32)
    for view in (big[..., 3 : 3 + Skv], np.broadcast_to(big[:1, :1, :1, :Skv], (B, H, Sq, Skv))):
        before = copies()
        o = headsum.attention(q, k, v, bias=view)
        assert copies() == before  # a row stride, zero strides: as they are
        check(o, q, k, v, bias=view)
    # j not contiguous, or reversed: one float32 copy of the bias.
    wide = rng.uniform(-1, 1, (B, H, Sq, 2 * Skv)).astype(np.float32)
    for view in (wide[..., ::2], big[..., Skv - 1 :: -1]):
        assert view.shape == (B, H, Sq, Skv)
        before = copies()
        o = headsum.attention(q, k, v, bias=view)
        assert copies()[0] - before[0] == 1
        check(o, q, k, v, bias=view)


def test_rows_that_see_no_key_give_zeros(rng):
    q, k, v = make_qkv(rng, 1, 2, 2, 4, 6, 8)
    bias = np.zeros((1, 1, 4, 6), np.float32)
    bias[..., 1, :] = NEG_INF  # row 1 sees nothing
    for sinks in (None, [0.5, -0.5]):
        o = headsum.attention(q, k, v, bias=bias, sinks=sinks)
        assert (o[:, :, 1] == 0).all()
        check(o, q, k, v, bias=bias, sinks=sinks)


def test_sinks_take_mass_from_the_keys(rng):
    """A sink far above every score takes almost all the weight: O -> 0."""
    q, k, v = make_qkv(rng, 1, 2, 2, 3, 8, 16)
    o = headsum.attention(q, k, v, sinks=[40.0, -40.0])
    assert np.abs(o[:, 0]).max() < 1e-6
    check(o, q, k, v, sinks=[40.0, -40.0])


def test_window_equals_slicing_the_keys(rng):
    """A causal decode step with a window sees its last `window` keys: the
    plain call on those keys alone."""
    q, k, v = make_qkv(rng, 1, 4, 2, 1, 100, 32)
    o = headsum.attention(q, k, v, causal=True, window=17)
    alone = headsum.attention(q, k[:, :, -17:], v[:, :, -17:], causal=True)
    np.testing.assert_allclose(o, alone, rtol=1e-5, atol=1e-6)
    check(o, q, k, v, True, window=17)


def test_per_head_values_as_sequences_and_arrays(rng):
    q, k, v = make_qkv(rng, 1, 4, 2, 5, 9, 16)
    slopes = slopes_for(4)
    sinks = np.array([0.0, 1.0, -1.0, 0.5], np.float32)
    a = headsum.attention(q, k, v, alibi_slopes=slopes, sinks=sinks)
    b = headsum.attention(q, k, v, alibi_slopes=slopes.tolist(), sinks=tuple(sinks.tolist()))
    assert np.array_equal(a, b)
    check(a, q, k, v, alibi_slopes=slopes, sinks=sinks)


# --- errors ----------------------------------------------------------------


def test_errors_name_the_argument_and_write_nothing(rng):
    B, H, Hkv, Sq, Skv, L = 2, 4, 2, 5, 6, 8
    q, k, v = make_qkv(rng, B, H, Hkv, Sq, Skv, L)
    good_bias = np.zeros((B, 1, 1, Skv), np.float32)
    bad = [
        ({"window": -1}, r"window: must be >= 0 \(0: no window\), got -1"),
        ({"softcap": -1.0}, r"softcap: must be finite and >= 0"),
        ({"softcap": float("nan")}, r"softcap: must be finite and >= 0"),
        ({"softcap": float("inf")}, r"softcap: must be finite and >= 0"),
        ({"softcap": 1e39}, r"options->softcap = inf"),  # past float32: the C API
        ({"alibi_slopes": np.ones(3, np.float32)}, r"alibi_slopes: expected shape \[H=4\] = \(4,\), one value per query head, got \(3,\)"),
        ({"alibi_slopes": [1.0, 2.0]}, r"alibi_slopes: expected shape \[H=4\]"),
        ({"alibi_slopes": np.ones((4, 1), np.float32)}, r"alibi_slopes: expected 1 dims \[H=4\]"),
        ({"alibi_slopes": [0.5, float("nan"), 0.5, 0.5]}, r"options->alibi_slopes\[1\] = nan must be finite"),
        ({"sinks": [0.0, 0.0, float("-inf"), 0.0]}, r"options->sinks\[2\] = -inf must be finite"),
        ({"sinks": np.zeros(4, np.float64)}, r"sinks: dtype float64 is not supported"),
        ({"sinks": "abc"}, r"sinks: expected a NumPy array or a DLPack tensor"),
        ({"bias": np.zeros(Skv, np.float32)}, r"bias: expected 2 to 4 dims broadcastable to \[B\]\[H\]\[Sq\]\[Skv\] = \(2, 4, 5, 6\), got 1 dims"),
        ({"bias": np.zeros((1, 1, 1, 1, Skv), np.float32)}, r"bias: expected 2 to 4 dims"),
        ({"bias": np.zeros((B, 1, 1, 1), np.float32)}, r"bias: expected a shape broadcastable to \[B\]\[H\]\[Sq\]\[Skv\] = \(2, 4, 5, 6\) with its last dim Skv=6 \(j is read contiguously, never broadcast\), got \(2, 1, 1, 1\)"),
        ({"bias": np.zeros((3, 1, 1, Skv), np.float32)}, r"bias: expected a shape broadcastable .* got \(3, 1, 1, 6\)"),
        ({"bias": np.zeros((H + 1, Sq, Skv), np.float32)}, r"bias: expected a shape broadcastable .* got \(5, 5, 6\)"),
        ({"bias": np.zeros((B, 1, 1, Skv), np.float64)}, r"bias: dtype float64 is not supported"),
        ({"bias": np.zeros((B, 1, 1, Skv), bool)}, r"bias: dtype bool is not supported"),
        ({"bias": good_bias.tolist()}, r"bias: expected a NumPy array or a DLPack tensor"),
    ]
    for kwargs, pattern in bad:
        out = np.full(q.shape, 3.0, np.float32)
        with pytest.raises(ValueError, match=pattern):
            headsum.attention(q, k, v, out=out, **kwargs)
        assert (out == 3.0).all(), f"{kwargs}: out was written"
    # out overlapping the bias or the slopes: refused, nothing written.
    buf = np.zeros(q.size + B * Skv, np.float32)
    out = buf[: q.size].reshape(q.shape)
    bias = buf[q.size - Skv : q.size - Skv + B * Skv].reshape(B, 1, 1, Skv)
    keep = buf.copy()
    with pytest.raises(ValueError, match=r"out: its memory overlaps bias's"):
        headsum.attention(q, k, v, out=out, bias=bias)
    slopes = buf[:H]
    with pytest.raises(ValueError, match=r"out: its memory overlaps alibi_slopes's"):
        headsum.attention(q, k, v, out=out, alibi_slopes=slopes)
    assert np.array_equal(buf, keep)
    # The arguments are keywords.
    with pytest.raises(TypeError):
        headsum.attention(q, k, v, False, None, None, 3)


# --- torch -----------------------------------------------------------------


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_torch_masks_and_sinks_zero_copy(rng, dtype_name):
    torch = torch_or_skip()
    dtype = getattr(torch, dtype_name)
    B, H, Hkv, Sq, Skv, L = 2, 4, 2, 6, 33, 16
    q, k, v = (torch.from_numpy(a).to(dtype) for a in make_qkv(rng, B, H, Hkv, Sq, Skv, L))
    mask = torch.zeros((B, 1, 1, Skv), dtype=dtype)
    mask[1, ..., 20:] = float("-inf")
    sinks = torch.from_numpy(rng.uniform(-1, 1, H).astype(np.float32))
    # An HF-style expanded mask view [B][H][Sq][Skv] of a [B][1][1][Skv] tensor.
    expanded = mask.expand(B, H, Sq, Skv)
    before = copies()
    o = headsum.attention(q, k, v, causal=True, window=12, bias=expanded, sinks=sinks)
    assert copies() == before
    assert isinstance(o, torch.Tensor) and o.dtype == dtype
    check(o, q, k, v, True, window=12, bias=expanded, sinks=sinks)
