"""The binding's own 16-bit conversions (staging 16-bit inputs for the
float32-only calls, writing their results to 16-bit out= arrays), checked
bit for bit against NumPy's and torch's round-to-nearest-even.

head_contributions with H = L = D = 1 and Wo = [[1]] returns O * 1: exact,
so its result is the staged input itself and its 16-bit out= the rounding."""

import numpy as np
import pytest

import headsum
from conftest import torch_or_skip

ONE = np.ones((1, 1), np.float32)


def special_float32():
    f16_tie = lambda m, e: np.float32((1 + (2 * m + 1) * 2.0**-11) * 2.0**e)  # noqa: E731
    specials = [
        0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, 65504.0, 65519.996, 65520.0, 65536.0, 1e30,
        2.0**-14, 2.0**-14 * (1 - 2.0**-11), 2.0**-24, 2.0**-25, 2.0**-25 * 1.0001, 3 * 2.0**-26,
        2.0**-26, 1e-30, 2.0**-126, 2.0**-149, 3.0e38, 1 + 2.0**-8, 1 + 3 * 2.0**-8,
        1 + 2.0**-9 + 2.0**-24,
    ]
    specials += [f16_tie(m, e) for m in (0, 1, 511) for e in (-10, 0, 7)]
    rng = np.random.default_rng(3)
    wide = rng.standard_normal(4000) * np.exp2(rng.uniform(-30, 20, 4000))
    vals = np.concatenate([np.array(specials, np.float64), wide]).astype(np.float32)
    return np.concatenate([vals, -vals])


def as_o(values):
    return values.reshape(1, 1, -1, 1)


def test_float32_to_float16_out_rounds_like_numpy():
    x = special_float32()
    out = np.zeros((1, x.size, 1, 1), np.float16)
    headsum.head_contributions(as_o(x), ONE, out=out)
    with np.errstate(over="ignore"):
        want = (x + np.float32(0)).astype(np.float16)
    assert np.array_equal(out.reshape(-1).view(np.uint16), want.view(np.uint16))


def test_float16_input_widens_exactly():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    h = bits.view(np.float16)
    h = h[~np.isnan(h)]  # NaN payloads aside, every half
    c = headsum.head_contributions(as_o(h), ONE)
    want = h.astype(np.float32) + np.float32(0)
    assert np.array_equal(c.reshape(-1).view(np.uint32), want.view(np.uint32))
    nan = np.array([np.nan], np.float16)
    assert np.isnan(headsum.head_contributions(as_o(nan), ONE)).all()


def test_nan_stays_nan_in_float16_out():
    x = np.array([np.nan, -np.nan, 1.0], np.float32)
    out = np.zeros((1, 3, 1, 1), np.float16)
    headsum.head_contributions(as_o(x), ONE, out=out)
    assert np.isnan(out[0, :2]).all() and out[0, 2, 0, 0] == 1


def test_bfloat16_both_ways():
    torch = torch_or_skip()
    x = special_float32()
    x = x[np.isfinite(x) | np.isinf(x)]
    out = torch.zeros((1, x.size, 1, 1), dtype=torch.bfloat16)
    headsum.head_contributions(as_o(x), ONE, out=out)
    want = (torch.from_numpy(x) + 0.0).to(torch.bfloat16)
    assert torch.equal(out.reshape(-1).view(torch.int16), want.view(torch.int16))
    bits = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    b = bits.view(torch.bfloat16)
    b = b[~torch.isnan(b)]
    c = headsum.head_contributions(b.reshape(1, 1, -1, 1), torch.ones((1, 1)))
    want = b.to(torch.float32) + 0.0
    assert torch.equal(c.reshape(-1).view(torch.int32), want.view(torch.int32))


def test_staged_16bit_attention_out_is_the_float32_result_rounded():
    """An out= the tensor API cannot take (last dim not contiguous) is
    written by the binding: the float32 result rounded once, as NumPy
    rounds it."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 2, 9, 16)).astype(np.float32) for _ in range(3))
    exact = headsum.attention(q, k, v, causal=True)
    out = np.zeros((1, 2, 16, 9), np.float16).transpose(0, 1, 3, 2)
    assert out.strides[3] != 2
    headsum.attention(q, k, v, causal=True, out=out)
    assert np.array_equal(out, exact.astype(np.float16))


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_staged_float16_gated_projection(dtype):
    """gates make project_heads_sum float32-only: 16-bit o and wo staged,
    the result rounded into a 16-bit out."""
    rng = np.random.default_rng(5)
    o = rng.standard_normal((2, 3, 4, 8)).astype(dtype)
    wo = rng.standard_normal((24, 10)).astype(dtype)
    gates = np.array([1, 0, 0.5], np.float32)
    exact = headsum.project_heads_sum(o.astype(np.float32), wo.astype(np.float32), gates=gates)
    out = np.zeros((2, 4, 10), np.float16)
    headsum.project_heads_sum(o, wo, gates=gates, out=out)
    assert np.array_equal(out, exact.astype(np.float16))
