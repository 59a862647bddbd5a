"""headsum.attention against a float64 reference, for every dtype and layout
the binding takes, and every error path."""

import numpy as np
import pytest

import headsum
from conftest import copies, torch_or_skip
from reference import assert_within, attention_ref, f64, native_rounds_p

SHAPES = [
    # B, H, Hkv, Sq, Skv, L
    (1, 2, 2, 7, 7, 16),  # MHA, tails below a vector
    (2, 4, 2, 33, 33, 64),  # GQA
    (1, 4, 1, 5, 40, 24),  # MQA, Sq < Skv
    (2, 3, 3, 1, 70, 8),  # a decode step
    (1, 2, 1, 9, 4, 32),  # Sq > Skv: causal rows that see nothing
]


def make_qkv(rng, B, H, Hkv, Sq, Skv, L, dtype=np.float32):
    q = rng.standard_normal((B, H, Sq, L)).astype(dtype)
    k = rng.standard_normal((B, Hkv, Skv, L)).astype(dtype)
    v = rng.standard_normal((B, Hkv, Skv, L)).astype(dtype)
    return q, k, v


def check(o, q, k, v, causal, scale=None):
    L = q.shape[3]
    s = 1.0 / np.sqrt(L) if scale is None else float(np.float32(scale))
    ref, bound = attention_ref(f64(q), f64(k), f64(v), causal, s, p_rounded=native_rounds_p(q, k, v))
    assert_within(o, ref, bound, "attention")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_matches_reference(rng, shape, causal, dtype):
    q, k, v = make_qkv(rng, *shape, dtype=dtype)
    o = headsum.attention(q, k, v, causal=causal)
    assert isinstance(o, np.ndarray) and o.dtype == dtype and o.shape == q.shape
    check(o, q, k, v, causal)


def test_scale_and_large_logits(rng):
    q, k, v = make_qkv(rng, 1, 2, 2, 6, 11, 16)
    for scale in (0.01, 3.0, -0.5):
        check(headsum.attention(q, k, v, scale=scale), q, k, v, False, scale)
    # Scores in the hundreds: the row max keeps the softmax finite.
    o = headsum.attention(q * 30, k * 30, v, causal=True, scale=1.0)
    assert np.isfinite(o).all()
    check(o, q * 30, k * 30, v, True, 1.0)


def test_fully_masked_rows_are_zero(rng):
    q, k, v = make_qkv(rng, 1, 2, 2, 6, 2, 8)  # Sq > Skv: rows 0-3 see no key
    o = headsum.attention(q, k, v, causal=True)
    assert (o[:, :, :4] == 0).all()
    check(o, q, k, v, True)


def test_strided_views(rng):
    B, H, S, L = 2, 4, 13, 32
    # Token-major [B][S][H][L] storage, viewed as [B][H][S][L].
    qt = rng.standard_normal((B, S, H, L)).astype(np.float32)
    q = qt.transpose(0, 2, 1, 3)
    # A fused QKV buffer [B][S][3][H][L]: three strided views of one array.
    qkv = rng.standard_normal((B, S, 3, H, L)).astype(np.float32)
    k, v = qkv[:, :, 1].transpose(0, 2, 1, 3), qkv[:, :, 2].transpose(0, 2, 1, 3)
    # A KV cache with room for more positions than it holds, and every
    # other key of a longer sequence.
    cache = rng.standard_normal((B, H, 64, L)).astype(np.float32)
    k2, v2 = cache[:, :, :S], cache[:, :, 1 : 2 * S : 2]
    # Last dim sliced out of a wider row.
    wide = rng.standard_normal((B, H, S, L + 16)).astype(np.float32)
    q2 = wide[..., 8 : 8 + L]
    for qq, kk, vv in [(q, k, v), (q2, k2, v2), (q, k2, vv_ := v2), (q2, k, v)]:
        for causal in (False, True):
            check(headsum.attention(qq, kk, vv, causal=causal), qq, kk, vv, causal)


def test_layouts_that_need_a_copy(rng):
    """Last dim not contiguous, negative strides, 0 strides (broadcast):
    still exact results."""
    B, H, S, L = 1, 2, 9, 16
    q, k, v = make_qkv(rng, B, H, H, S, S, L)
    q_lt = np.ascontiguousarray(q.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    assert q_lt.strides[3] != 4
    k_rev = k[:, :, ::-1]
    v_bcast = np.broadcast_to(v[:1, :1], v.shape)
    for qq, kk, vv in [(q_lt, k, v), (q, k_rev, v), (q, k, v_bcast), (q_lt, k_rev, v_bcast)]:
        check(headsum.attention(qq, kk, vv, causal=True), qq, kk, vv, True)


def test_out_into_a_view_of_a_larger_array(rng):
    B, H, S, L = 2, 2, 10, 16
    q, k, v = make_qkv(rng, B, H, H, S, S, L)
    big = np.full((B, H + 1, S, L + 5), 7.0, dtype=np.float32)
    view = big[:, 1:, :, 2 : 2 + L]
    before = copies()
    got = headsum.attention(q, k, v, causal=True, out=view)
    assert got is view
    check(view, q, k, v, True)
    # Outside the view: untouched.
    mask = np.ones(big.shape, dtype=bool)
    mask[:, 1:, :, 2 : 2 + L] = False
    assert (big[mask] == 7.0).all()
    # Written where it lies: no staging.
    assert copies()[0] - before[0] == 0


def test_out_contiguous_float32_is_written_directly(rng):
    q, k, v = make_qkv(rng, 1, 2, 2, 8, 8, 16)
    out = np.empty_like(q)
    before = copies()
    assert headsum.attention(q, k, v, out=out) is out
    assert copies() == before
    check(out, q, k, v, False)


@pytest.mark.parametrize("out_dtype", [np.float16, np.float32])
def test_out_dtype(rng, out_dtype):
    q, k, v = make_qkv(rng, 1, 2, 2, 8, 8, 16)
    out = np.zeros(q.shape, dtype=out_dtype)
    headsum.attention(q, k, v, out=out)
    check(out, q, k, v, False)
    # A 16-bit result is the float32 one rounded to nearest even once:
    # exactly NumPy's rounding of the float32 result.
    exact = headsum.attention(q, k, v)
    assert np.array_equal(out, exact.astype(out_dtype))


def test_mixed_input_dtypes(rng):
    q, k, v = make_qkv(rng, 1, 4, 2, 6, 12, 16)
    k16 = k.astype(np.float16)
    o = headsum.attention(q, k16, v)
    assert o.dtype == np.float32
    check(o, q, k16, v, False)


def test_zero_copy_strided_inputs(rng):
    """Strided views with a contiguous last dim are read where they lie."""
    B, H, S, L = 1, 2, 16, 32
    qkv = rng.standard_normal((B, S, 3, H, L)).astype(np.float32)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    assert np.shares_memory(q, qkv) and not q.flags.c_contiguous
    before = copies()
    o = headsum.attention(q, k, v)
    after = copies()
    check(o, q, k, v, False)
    assert after[0] - before[0] == 0
    # The counter does count: a last dim that is not contiguous is staged.
    q_lt = np.ascontiguousarray(q.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    before = copies()
    headsum.attention(q_lt, np.ascontiguousarray(k), np.ascontiguousarray(v))
    assert copies()[0] - before[0] == 1
    assert copies()[1] - before[1] == q_lt.size * 4


# --- torch -----------------------------------------------------------------


@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
def test_torch(rng, dtype_name, causal):
    torch = torch_or_skip()
    dtype = getattr(torch, dtype_name)
    B, H, Hkv, S, L = 2, 4, 2, 19, 32
    q = torch.from_numpy(rng.standard_normal((B, S, H, L)).astype(np.float32)).to(dtype)
    q = q.transpose(1, 2)  # token-major storage, [B][H][S][L] view
    k = torch.from_numpy(rng.standard_normal((B, Hkv, S, L)).astype(np.float32)).to(dtype)
    v = torch.from_numpy(rng.standard_normal((B, Hkv, S, L)).astype(np.float32)).to(dtype)
    before = copies()
    o = headsum.attention(q, k, v, causal=causal)
    after = copies()
    assert isinstance(o, torch.Tensor) and o.dtype == dtype and tuple(o.shape) == (B, H, S, L)
    check(o, q, k, v, causal)
    assert after == before  # read and written in place, bf16 included
    # out= a torch tensor, strided.
    big = torch.zeros((B, S, H, L + 4), dtype=dtype)
    view = big[..., :L].transpose(1, 2)
    assert headsum.attention(q, k, v, causal=causal, out=view) is view
    check(view, q, k, v, causal)
    assert (big[..., L:] == 0).all()


def test_torch_bf16_matches_sdpa(rng):
    """bf16 inputs, compared with torch's own float64 attention on the same
    rounded values."""
    torch = torch_or_skip()
    q, k, v = (
        torch.from_numpy(a).to(torch.bfloat16) for a in make_qkv(rng, 1, 4, 4, 24, 24, 64)
    )
    o = headsum.attention(q, k, v, causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), is_causal=True
    )
    _, bound = attention_ref(f64(q), f64(k), f64(v), True, 1 / 8, p_rounded=native_rounds_p(q, k, v))
    assert_within(o, ref.numpy(), bound, "attention bf16 vs torch float64 SDPA")


def test_torch_requires_grad_is_read_without_autograd(rng):
    torch = torch_or_skip()
    q, k, v = (torch.from_numpy(a).requires_grad_() for a in make_qkv(rng, 1, 2, 2, 3, 3, 8))
    o = headsum.attention(q, k, v)
    assert not o.requires_grad  # headsum is not part of autograd's graph
    check(o, q, k, v, False)


# --- errors ----------------------------------------------------------------


def test_errors(rng):
    q, k, v = make_qkv(rng, 2, 4, 2, 5, 6, 8)
    bad = [
        ((q[0], k, v), {}, r"q: expected 4 dims \[B\]\[H\]\[Sq\]\[L\], got 3 dims with shape \(4, 5, 8\)"),
        ((q, k[0], v), {}, r"k: expected 4 dims"),
        ((q, k[:1], v[:1]), {}, r"k: expected shape \[B=2\]\[Hkv\]\[Skv\]\[L=8\] with Hkv dividing H=4, got \(1, 2, 6, 8\)"),
        ((q, k[..., :4], v[..., :4]), {}, r"k: expected shape \[B=2\]\[Hkv\]\[Skv\]\[L=8\]"),
        ((q, np.concatenate([k, k[:, :1]], 1), np.concatenate([v, v[:, :1]], 1)), {}, r"Hkv dividing H=4, got \(2, 3, 6, 8\)"),
        ((q, k, v[:, :, :5]), {}, r"v: expected the shape of k, \(2, 2, 6, 8\), got \(2, 2, 5, 8\)"),
        ((q.astype(np.float64), k, v), {}, r"q: dtype float64 is not supported; expected float32, float16 or bfloat16"),
        ((q, k.astype(np.int32), v), {}, r"k: dtype int32 is not supported"),
        ((q, k, v.tolist()), {}, r"v: expected a NumPy array or a DLPack tensor .* got list"),
        ((q, k, None), {}, r"v: expected a NumPy array or a DLPack tensor .* got NoneType"),
        ((q, k, v), {"scale": 0.0}, r"scale: must not be 0"),
        ((q, k, v), {"scale": float("inf")}, r"scale"),
        ((q, k, v), {"scale": float("nan")}, r"scale"),
        ((q[:0], k[:0], v[:0]), {}, r"batch"),
    ]
    for args, kwargs, pattern in bad:
        with pytest.raises(ValueError, match=pattern):
            headsum.attention(*args, **kwargs)


def test_out_errors_write_nothing(rng):
    q, k, v = make_qkv(rng, 1, 2, 2, 5, 5, 8)
    readonly = np.full(q.shape, 3.0, dtype=np.float32)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match=r"out: the array is read-only"):
        headsum.attention(q, k, v, out=readonly)
    cases = [
        (np.full((1, 2, 5, 9), 3.0, np.float32), r"out: expected shape \[B\]\[H\]\[Sq\]\[L\] = \(1, 2, 5, 8\), got \(1, 2, 5, 9\)"),
        (np.full((2, 5, 8), 3.0, np.float32), r"out: expected 4 dims"),
        (np.full(q.shape, 3.0, np.float64), r"out: dtype float64 is not supported"),
        (np.lib.stride_tricks.as_strided(np.full(8, 3.0, np.float32), q.shape, (0, 0, 0, 4)), r"out: two indices of the array reach the same element"),
    ]
    for out, pattern in cases:
        keep = out.copy()
        with pytest.raises(ValueError, match=pattern):
            headsum.attention(q, k, v, out=out)
        assert np.array_equal(out, keep)
    # out overlapping an input.
    qkv = np.stack([q, k, v])
    keep = qkv.copy()
    with pytest.raises(ValueError, match=r"out: its memory overlaps q's"):
        headsum.attention(qkv[0], qkv[1], qkv[2], out=qkv[0])
    assert np.array_equal(qkv, keep)
    # Partly: out starts half way into v.
    buf = np.zeros(2 * v.size, dtype=np.float32)
    vv = buf[: v.size].reshape(v.shape)
    vv[...] = v
    out = buf[v.size // 2 : v.size // 2 + v.size].reshape(v.shape)
    keep = buf.copy()
    with pytest.raises(ValueError, match=r"out: its memory overlaps v's"):
        headsum.attention(q, k, vv, out=out)
    assert np.array_equal(buf, keep)
    # A library-side failure (scale not finite) writes nothing either.
    out = np.full(q.shape, 3.0, np.float32)
    with pytest.raises(ValueError):
        headsum.attention(q, k, v, scale=float("inf"), out=out)
    assert (out == 3.0).all()
