"""project_heads_sum, head_contributions, head_attribution, AttributionBasis
and head_contribution_norms against float64 references, in every dtype and
layout, and their error paths."""

import numpy as np
import pytest

import headsum
from conftest import copies, torch_or_skip
from reference import (
    assert_within,
    attribution_ref,
    contributions_bound,
    contributions_ref,
    f64,
    norms_ref,
    project_ref,
)

SHAPES = [
    # B, S, H, L, D
    (1, 1, 1, 8, 8),
    (2, 7, 4, 16, 48),
    (1, 13, 3, 24, 40),  # D != H*L, tails
]


def make(rng, B, S, H, L, D, dtype=np.float32):
    o = rng.standard_normal((B, H, S, L)).astype(dtype)
    wo = (rng.standard_normal((H * L, D)) / np.sqrt(H * L)).astype(dtype)
    return o, wo


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_project_heads_sum(rng, shape, dtype):
    B, S, H, L, D = shape
    o, wo = make(rng, *shape, dtype=dtype)
    bias = rng.standard_normal(D).astype(np.float32)
    gates = rng.uniform(-1, 2, H).astype(np.float32)
    bias16, gates16 = bias.astype(np.float16), gates.astype(np.float16)  # converted: D, H values
    for b, g in [(None, None), (bias, None), (None, gates), (bias, gates), (bias16, None), (bias16, gates16)]:
        y = headsum.project_heads_sum(o, wo, b, g)
        assert y.dtype == dtype and y.shape == (B, S, D)
        ref, bound = project_ref(f64(o), f64(wo), None if b is None else f64(b), None if g is None else f64(g))
        assert_within(y, ref, bound, f"project_heads_sum bias={b is not None} gates={g is not None}")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_per_head_calls(rng, shape, dtype):
    B, S, H, L, D = shape
    o, wo = make(rng, *shape, dtype=dtype)
    o64, wo64 = f64(o), f64(wo)
    c = headsum.head_contributions(o, wo)
    assert c.dtype == np.float32 and c.shape == (B, S, H, D)
    ref, abs_c = contributions_ref(o64, wo64)
    assert_within(c, ref, contributions_bound(o64, abs_c), "head_contributions")

    n = headsum.head_contribution_norms(o, wo)
    assert n.dtype == np.float32 and n.shape == (B, S, H)
    ref, bound = norms_ref(o64, wo64)
    assert_within(n, ref, bound, "head_contribution_norms")

    directions = rng.standard_normal((3, D)).astype(np.float32)
    a = headsum.head_attribution(o, wo, directions)
    assert a.dtype == np.float32 and a.shape == (B, S, H, 3)
    ref, bound = attribution_ref(o64, wo64, f64(directions))
    assert_within(a, ref, bound, "head_attribution")
    # One direction [D]: [B][S][H].
    a1 = headsum.head_attribution(o, wo, directions[1])
    assert a1.shape == (B, S, H)
    assert_within(a1, ref[..., 1], bound[..., 1], "head_attribution, one direction")

    basis = headsum.AttributionBasis(wo, directions, heads=H)
    assert (basis.heads, basis.head_dim, basis.model_dim, basis.n_directions) == (H, L, D, 3)
    assert_within(basis(o), ref, bound, "AttributionBasis")
    basis1 = headsum.AttributionBasis(wo, directions[2], H)
    assert_within(basis1(o), ref[..., 2], bound[..., 2], "AttributionBasis, one direction")


def test_ablation_and_additivity(rng):
    """Gating head h to 0 moves y by exactly -c_h (within the bounds), and
    along a direction by head h's attribution."""
    B, S, H, L, D = 2, 5, 4, 16, 32
    o, wo = make(rng, B, S, H, L, D)
    bias = rng.standard_normal(D).astype(np.float32)
    y = f64(headsum.project_heads_sum(o, wo, bias))
    c = f64(headsum.head_contributions(o, wo))
    y_sum = c.sum(axis=2) + bias
    ref, bound = project_ref(f64(o), f64(wo), f64(bias))
    _, abs_c = contributions_ref(f64(o), f64(wo))
    c_bound = contributions_bound(f64(o), abs_c).sum(axis=2)
    assert (np.abs(y - y_sum) <= bound + c_bound).all()
    for h in range(H):
        gates = np.ones(H, np.float32)
        gates[h] = 0
        y_abl = headsum.project_heads_sum(o, wo, bias, gates)
        ref_abl, bound_abl = project_ref(f64(o), f64(wo), f64(bias), f64(gates))
        assert_within(y_abl, ref_abl, bound_abl, f"ablate head {h}")
        assert np.allclose(ref - ref_abl, f64(c)[:, :, h], rtol=0, atol=(bound + bound_abl).max() * 4)


def test_strided_and_staged_layouts(rng):
    B, S, H, L, D = 2, 6, 3, 16, 24
    o, wo = make(rng, B, S, H, L, D)
    o_tok = np.ascontiguousarray(o.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)  # [B][S][H][L] storage
    wide = np.zeros((H * L, D + 8), np.float32)
    wide[:, 4 : 4 + D] = wo
    wo_rows = wide[:, 4 : 4 + D]  # row stride D + 8
    wo_t = np.ascontiguousarray(wo.T).T  # last dim not contiguous
    o_rev = np.ascontiguousarray(o[:, :, ::-1])[:, :, ::-1]  # negative seq stride
    directions = rng.standard_normal((2, D)).astype(np.float32)
    d_view = np.repeat(directions, 2, axis=1)[:, ::2]
    for oo, ww in [(o_tok, wo), (o, wo_rows), (o, wo_t), (o_rev, wo_rows), (o_tok, wo_t)]:
        o64, w64 = f64(oo), f64(ww)
        ref, bound = project_ref(o64, w64)
        assert_within(headsum.project_heads_sum(oo, ww), ref, bound, "project_heads_sum strided")
        ref, bound = attribution_ref(o64, w64, f64(directions))
        assert_within(headsum.head_attribution(oo, ww, d_view), ref, bound, "attribution strided")
        ref, bound = norms_ref(o64, w64)
        assert_within(headsum.head_contribution_norms(oo, ww), ref, bound, "norms strided")


def test_out_views_and_copies(rng):
    B, S, H, L, D = 1, 4, 2, 8, 16
    o, wo = make(rng, B, S, H, L, D)
    o64, wo64 = f64(o), f64(wo)
    # Contiguous float32 everything: no staging anywhere.
    before = copies()
    y = headsum.project_heads_sum(o, wo)
    c = headsum.head_contributions(o, wo)
    n = headsum.head_contribution_norms(o, wo)
    a = headsum.head_attribution(o, wo, np.ones((2, D), np.float32))
    assert copies() == before
    # out= views of larger arrays: written in place, the rest untouched.
    big = np.full((B, S + 2, D + 3), -5.0, np.float32)
    view = big[:, 1 : S + 1, :D]
    assert headsum.project_heads_sum(o, wo, out=view) is view
    ref, bound = project_ref(o64, wo64)
    assert_within(view, ref, bound, "project_heads_sum out=view")
    assert (big[:, 0] == -5).all() and (big[:, S + 1] == -5).all() and (big[..., D:] == -5).all()
    big = np.full((B, S, H, D + 1), -5.0, np.float32)
    view = big[..., 1:]
    assert headsum.head_contributions(o, wo, out=view) is view
    ref, abs_c = contributions_ref(o64, wo64)
    assert_within(view, ref, contributions_bound(o64, abs_c), "head_contributions out=view")
    assert (big[..., 0] == -5).all()
    # A contiguous float32 out= is written directly.
    for fn, out in [
        (headsum.head_contributions, np.empty_like(c)),
        (headsum.head_contribution_norms, np.empty_like(n)),
        (lambda o, wo, out: headsum.head_attribution(o, wo, np.ones((2, D), np.float32), out=out), np.empty_like(a)),
    ]:
        before = copies()
        assert fn(o, wo, out=out) is out
        assert copies() == before
    # 16-bit inputs to the float32-only calls: one staged copy each.
    before = copies()
    headsum.head_contribution_norms(o.astype(np.float16), wo)
    assert copies()[0] - before[0] == 1 and copies()[1] - before[1] == o.size * 4
    # project_heads_sum without gates: strided float32 views read in place
    # through the tensor API.
    o_tok = np.ascontiguousarray(o.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    before = copies()
    headsum.project_heads_sum(o_tok, wo)
    assert copies()[0] - before[0] == 0


@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
def test_torch(rng, dtype_name):
    torch = torch_or_skip()
    dtype = getattr(torch, dtype_name)
    B, S, H, L, D = 2, 5, 4, 16, 32
    o_np, wo_np = make(rng, B, S, H, L, D)
    o = torch.from_numpy(np.ascontiguousarray(o_np.transpose(0, 2, 1, 3))).to(dtype).transpose(1, 2)
    wo = torch.from_numpy(wo_np).to(dtype)
    o64, wo64 = f64(o), f64(wo)
    bias = torch.from_numpy(rng.standard_normal(D).astype(np.float32))
    y = headsum.project_heads_sum(o, wo, bias)
    assert isinstance(y, torch.Tensor) and y.dtype == dtype and tuple(y.shape) == (B, S, D)
    ref, bound = project_ref(o64, wo64, f64(bias))
    assert_within(y, ref, bound, "project_heads_sum torch")
    gates = torch.tensor([1.0, 0.0, 0.5, 2.0])
    ref, bound = project_ref(o64, wo64, None, f64(gates))
    assert_within(headsum.project_heads_sum(o, wo, gates=gates), ref, bound, "gated torch")
    c = headsum.head_contributions(o, wo)
    assert isinstance(c, torch.Tensor) and c.dtype == torch.float32
    ref, abs_c = contributions_ref(o64, wo64)
    assert_within(c, ref, contributions_bound(o64, abs_c), "head_contributions torch")
    ref, bound = norms_ref(o64, wo64)
    assert_within(headsum.head_contribution_norms(o, wo), ref, bound, "norms torch")
    d = torch.randn(3, D).to(dtype)
    ref, bound = attribution_ref(o64, wo64, f64(d))
    assert_within(headsum.head_attribution(o, wo, d), ref, bound, "attribution torch")
    assert_within(headsum.AttributionBasis(wo, d, H)(o), ref, bound, "basis torch")


def test_errors(rng):
    B, S, H, L, D = 2, 3, 4, 8, 16
    o, wo = make(rng, B, S, H, L, D)
    d = np.ones((2, D), np.float32)
    calls = {
        "project_heads_sum": lambda *a, **k: headsum.project_heads_sum(*a, **k),
        "head_contributions": headsum.head_contributions,
        "head_contribution_norms": headsum.head_contribution_norms,
        "head_attribution": lambda o, wo, **k: headsum.head_attribution(o, wo, d, **k),
    }
    for name, fn in calls.items():
        for args, pattern in [
            ((o[0], wo), r"o: expected 4 dims \[B\]\[H\]\[S\]\[L\], got 3 dims with shape \(4, 3, 8\)"),
            ((o, wo[0]), r"wo: expected 2 dims \[H\*L\]\[D\], got 1 dims"),
            ((o, wo[:-1]), r"wo: expected shape \[H\*L=32\]\[D\] \(H=4, L=8 from o\), got \(31, 16\)"),
            ((o.astype(np.float64), wo), r"o: dtype float64 is not supported"),
            ((o, wo.astype(np.int64)), r"wo: dtype int64 is not supported"),
            ((o, "wo"), r"wo: expected a NumPy array or a DLPack tensor .* got str"),
        ]:
            with pytest.raises(ValueError, match=pattern):
                fn(*args)
        readonly = np.zeros(1, np.float32)
        readonly.flags.writeable = False
        with pytest.raises(ValueError, match=r"out: the array is read-only"):
            fn(o, wo, out=readonly)
        with pytest.raises(ValueError, match=r"out: expected shape \[B\]\[S\]"):
            fn(o, wo, out=np.zeros((9, 9, 9, 9)[: (3 if name in ("project_heads_sum", "head_contribution_norms") else 4)], np.float32))
        shape = fn(o, wo).shape
        buf = np.zeros(o.size + int(np.prod(shape)), np.float32)
        o_in = buf[: o.size].reshape(o.shape)
        o_in[...] = o
        keep = buf.copy()
        with pytest.raises(ValueError, match=r"out: its memory overlaps o's"):
            fn(o_in, wo, out=buf[o.size - 1 : o.size - 1 + int(np.prod(shape))].reshape(shape))
        assert np.array_equal(buf, keep)
    with pytest.raises(ValueError, match=r"bias: expected shape \[D=16\] = \(16,\), got \(15,\)"):
        headsum.project_heads_sum(o, wo, np.zeros(15, np.float32))
    with pytest.raises(ValueError, match=r"bias: expected 1 dims"):
        headsum.project_heads_sum(o, wo, np.zeros((1, 16), np.float32))
    with pytest.raises(ValueError, match=r"gates: expected shape \[H=4\] = \(4,\), got \(3,\)"):
        headsum.project_heads_sum(o, wo, gates=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match=r"directions: expected shape \[R\]\[D=16\] or \[D=16\] \(D from wo\), got \(2, 15\)"):
        headsum.head_attribution(o, wo, np.ones((2, 15), np.float32))
    with pytest.raises(ValueError, match=r"directions: expected 1 or 2 dims"):
        headsum.head_attribution(o, wo, np.ones((1, 2, 16), np.float32))
    with pytest.raises(ValueError, match=r"heads: must be >= 1 and divide wo's 32 rows \(H\*L\), got 5"):
        headsum.AttributionBasis(wo, d, 5)
    with pytest.raises(ValueError, match=r"heads: must be >= 1"):
        headsum.AttributionBasis(wo, d, 0)
    basis = headsum.AttributionBasis(wo, d, 4)
    with pytest.raises(ValueError, match=r"o: expected shape \[B\]\[H=4\]\[S\]\[L=8\] \(the basis'\), got \(2, 2, 3, 16\)"):
        basis(o.reshape(2, 2, 3, 16))
    out = np.full((B, S, H, 2), 9.0, np.float32)
    with pytest.raises(ValueError, match=r"out: expected shape \[B\]\[S\]\[H\]\[R\] = \(2, 3, 4, 2\), got \(2, 3, 4, 3\)"):
        basis(o, out=np.zeros((B, S, H, 3), np.float32))
    basis(o, out=out)
    ref, bound = attribution_ref(f64(o), f64(wo), f64(d))
    assert_within(out, ref, bound, "basis out=")


def test_memory_error(rng):
    """OUT_OF_MEMORY from the library is MemoryError with its message, and
    nothing is written."""
    o, wo = make(rng, 1, 4, 2, 8, 16)
    out = np.full((1, 4, 2, 3), 5.0, np.float32)
    headsum._headsum._fail_allocations_after(0)
    try:
        with pytest.raises(MemoryError, match=r"head_attribution"):
            headsum.head_attribution(o, wo, np.ones((3, 16), np.float32), out=out)
        with pytest.raises(MemoryError):
            headsum.AttributionBasis(wo, np.ones((3, 16), np.float32), 2)
    finally:
        headsum._headsum._fail_allocations_after(-1)
    assert (out == 5.0).all()
    headsum.head_attribution(o, wo, np.ones((3, 16), np.float32), out=out)
    assert not (out == 5.0).all()
