"""headsum.MHA and its KV cache against a float64 reference of the layer.

The bound is first order, as the kernels' (reference.py), carried through
the stages: each projection's rounding ((Dm + 2) eps times the magnitude of
its terms), RoPE's (cos/sin rounded to float32, two products and an add:
4 eps (|q_i| + |q_j|), plus the errors of the pair it mixes), the cache's
16-bit rounding of K and V (cache_dtype), attention's own bound with the
errors of Q and K entering each score (an absolute score error is a relative
error of its weight) and those of V passing through the softmax weights, and
the output projection's bound plus the errors of O through |Wo|.  16-bit
weights are compared with a reference fed the same rounded weights."""

import numpy as np
import pytest

import headsum
from conftest import copies, torch_or_skip
from reference import EPS, ROUNDING, SAFETY, score_options, softmax_v, visible


def rounded(w, dtype_name):
    if w is None or dtype_name == "float32":
        return None if w is None else w.astype(np.float64)
    if dtype_name == "float16":
        return w.astype(np.float16).astype(np.float64)
    torch = torch_or_skip()
    return torch.from_numpy(w).to(torch.bfloat16).to(torch.float64).numpy()


def rope(x, e, positions, theta):
    """x [B][H][S][L] rotated at `positions`, and the propagated error."""
    L = x.shape[-1]
    half = L // 2
    freq = float(theta) ** (-2.0 * np.arange(half) / L)
    ang = positions[:, None] * freq[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    x1, x2, e1, e2 = x[..., :half], x[..., half:], e[..., :half], e[..., half:]
    out = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
    mixed = e1 + e2 + 4 * EPS * (np.abs(x1) + np.abs(x2))
    return out, np.concatenate([mixed, mixed], -1)


def layer_ref(x, w, heads, kv_heads, causal, theta, cache_dtype, window=0, softcap=0.0,
              alibi_slopes=None, sinks=None):
    """y [B][T][Dm] for the whole sequence x [B][T][Dm] (a cache fed the same
    tokens in chunks must agree when causal), and its bound; with the options
    of MHA (reference.py's score_options and softmax_v)."""
    wq, wk, wv, wo, bq, bk, bv, bo = w
    B, T, Dm = x.shape
    L = wq.shape[1] // heads
    ax = np.abs(x)

    def proj(wm, b, n):
        val = x @ wm + (0 if b is None else b)
        err = (Dm + 2) * EPS * (ax @ np.abs(wm) + (0 if b is None else np.abs(b)))
        split = lambda a: a.reshape(B, T, n, L).transpose(0, 2, 1, 3)  # noqa: E731
        return split(val), split(err)

    q, eq = proj(wq, bq, heads)
    k, ek = proj(wk, bk, kv_heads)
    v, ev = proj(wv, bv, kv_heads)
    if theta:
        pos = np.arange(T, dtype=np.float64)
        q, eq = rope(q, eq, pos, theta)
        k, ek = rope(k, ek, pos, theta)
    unit, tiny = ROUNDING[cache_dtype]
    ek = ek + unit * np.abs(k) + tiny
    ev = ev + unit * np.abs(v) + tiny
    rep = heads // kv_heads
    k, ek, v, ev = (np.repeat(a, rep, axis=1) for a in (k, ek, v, ev))
    scale = 1 / np.sqrt(L)
    s = scale * q @ k.transpose(0, 1, 3, 2)
    s_err = scale * (
        (L + 3) * EPS * np.abs(q) @ np.abs(k).transpose(0, 1, 3, 2)
        + eq @ np.abs(k).transpose(0, 1, 3, 2)
        + np.abs(q) @ ek.transpose(0, 1, 3, 2)
    )
    s, extra = score_options(s, softcap, alibi_slopes)
    vis = np.broadcast_to(visible(T, T, causal, window), s.shape)
    o, eo = softmax_v(s, s_err + extra, vis, v, sinks, v_err=ev)
    oc = o.transpose(0, 2, 1, 3).reshape(B, T, heads * L)
    eoc = eo.transpose(0, 2, 1, 3).reshape(B, T, heads * L)
    y = oc @ wo + (0 if bo is None else bo)
    ey = eoc @ np.abs(wo) + (heads * L + heads + 3) * EPS * (
        np.abs(oc) @ np.abs(wo) + (0 if bo is None else np.abs(bo))
    )
    return y, SAFETY * ey


def make_layer(rng, Dm, H, Hkv, L, biases=True):
    n = lambda *s: (rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)  # noqa: E731
    b = lambda m: (rng.standard_normal(m) * 0.1).astype(np.float32) if biases else None  # noqa: E731
    return [n(Dm, H * L), n(Dm, Hkv * L), n(Dm, Hkv * L), n(H * L, Dm), b(H * L), b(Hkv * L), b(Hkv * L), b(Dm)]


def check(y, ref, bound, what):
    err = np.abs(np.asarray(y, np.float64) - ref)
    bad = ~(err <= bound)
    assert not bad.any(), f"{what}: {int(bad.sum())} elements out of bound, worst excess {(err - bound).max():.3e}"


CONFIGS = [
    # Dm, H, Hkv, L, causal, rope_theta, weight_dtype, cache_dtype, biases
    (32, 4, 4, 8, True, 0.0, "float32", "float32", True),
    (48, 4, 2, 12, True, 10000.0, "float32", "float32", True),
    (32, 4, 1, 8, False, 500.0, "float32", "float32", False),
    (40, 2, 2, 20, True, 10000.0, "float16", "float16", True),
    (32, 4, 2, 8, True, 10000.0, "bfloat16", "bfloat16", True),
]


@pytest.mark.parametrize("config", CONFIGS)
def test_layer_without_cache(rng, config):
    Dm, H, Hkv, L, causal, theta, wdt, cdt, biases = config
    w = make_layer(rng, Dm, H, Hkv, L, biases)
    names = ["wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"]
    mha = headsum.MHA(*w[:4], heads=H, kv_heads=Hkv, causal=causal, rope_theta=theta,
                      **dict(zip(names[4:], w[4:])), weight_dtype=wdt, cache_dtype=cdt)
    assert (mha.model_dim, mha.heads, mha.kv_heads, mha.head_dim, mha.causal) == (Dm, H, Hkv, L, causal)
    x = rng.standard_normal((2, 13, Dm)).astype(np.float32)
    y = mha(x)
    assert y.dtype == np.float32 and y.shape == x.shape
    wr = [rounded(a, wdt) if i < 4 else (None if a is None else a.astype(np.float64)) for i, a in enumerate(w)]
    # Without a cache K and V stay float32.
    ref, bound = layer_ref(x.astype(np.float64), wr, H, Hkv, causal, np.float32(theta), "float32")
    check(y, ref, bound, f"layer {config}")


@pytest.mark.parametrize("config", [c for c in CONFIGS if c[4]])
def test_cache_in_chunks_matches_the_whole_sequence(rng, config):
    Dm, H, Hkv, L, causal, theta, wdt, cdt, biases = config
    w = make_layer(rng, Dm, H, Hkv, L, biases)
    mha = headsum.MHA(*w[:4], heads=H, kv_heads=Hkv, causal=True, rope_theta=theta,
                      bq=w[4], bk=w[5], bv=w[6], bo=w[7], weight_dtype=wdt, cache_dtype=cdt)
    B, T = 2, 21
    x = rng.standard_normal((B, T, Dm)).astype(np.float32)
    wr = [rounded(a, wdt) if i < 4 else (None if a is None else a.astype(np.float64)) for i, a in enumerate(w)]
    ref, bound = layer_ref(x.astype(np.float64), wr, H, Hkv, True, np.float32(theta), cdt)
    cache = mha.new_cache(batch=B, capacity=32)
    assert (cache.batch, cache.capacity, len(cache)) == (B, 32, 0)
    start = 0
    for chunk in (9, 1, 1, 6, 1, 3):  # a prompt, then decode steps and chunks
        y = mha(x[:, start : start + chunk], cache)
        check(y, ref[:, start : start + chunk], bound[:, start : start + chunk], f"tokens {start}..")
        start += chunk
        assert cache.length == start
    # Rewind and replay: the same answers.
    cache.truncate(9)
    assert len(cache) == 9
    y = mha(x[:, 9:T], cache)
    check(y, ref[:, 9:T], bound[:, 9:T], "after truncate")
    cache.reset()
    assert len(cache) == 0


def test_views_torch_and_in_place(rng):
    Dm, H, L = 32, 4, 8
    w = make_layer(rng, Dm, H, H, L)
    # Weights as strided views: staged once (the layer copies them anyway).
    wq_t = np.ascontiguousarray(w[0].T).T
    mha = headsum.MHA(wq_t, *w[1:4], heads=H, bq=w[4], bk=w[5], bv=w[6], bo=w[7])
    ref_mha = headsum.MHA(*w[:4], heads=H, bq=w[4], bk=w[5], bv=w[6], bo=w[7])
    x = rng.standard_normal((1, 7, Dm)).astype(np.float32)
    y = ref_mha(x)
    assert np.array_equal(mha(x), y)  # same weights, same result
    before = copies()
    out = np.empty_like(x)
    assert ref_mha(x, out=out) is out and copies() == before
    assert np.array_equal(out, y)
    x2 = x.copy()
    assert ref_mha(x2, out=x2) is x2  # y may be x
    assert np.array_equal(x2, y)
    xs = np.zeros((1, 7, Dm + 3), np.float32)
    xs[..., :Dm] = x
    assert np.array_equal(ref_mha(xs[..., :Dm]), y)  # a strided x: staged
    try:
        import torch
    except ImportError:
        return
    yt = ref_mha(torch.from_numpy(x))
    assert isinstance(yt, torch.Tensor) and torch.equal(yt, torch.from_numpy(y))


def test_errors(rng):
    Dm, H, Hkv, L = 32, 4, 2, 8
    w = make_layer(rng, Dm, H, Hkv, L)
    wq, wk, wv, wo = w[:4]
    for args, kwargs, pattern in [
        ((wq[0], wk, wv, wo), {"heads": H}, r"wq: expected 2 dims \[Dm\]\[H\*L\]"),
        ((wq, wk, wv, wo), {"heads": 5}, r"wq: expected shape \[Dm\]\[H\*L\] with H=5 dividing its columns, got \(32, 32\)"),
        ((wq, wk, wv, wo), {"heads": H, "kv_heads": 3}, r"kv_heads: must divide heads=4, got 3"),
        ((wq, wk, wv, wo), {"heads": H}, r"wk: expected shape \[Dm=32\]\[Hkv\*L=32\], got \(32, 16\)"),
        ((wq, wk, wv[:, :8], wo), {"heads": H, "kv_heads": Hkv}, r"wv: expected shape \[Dm=32\]\[Hkv\*L=16\], got \(32, 8\)"),
        ((wq, wk, wv, wo[:, :5]), {"heads": H, "kv_heads": Hkv}, r"wo: expected shape \[H\*L=32\]\[Dm=32\], got \(32, 5\)"),
        ((wq, wk, wv, wo), {"heads": H, "kv_heads": Hkv, "bk": np.zeros(3, np.float32)}, r"bk: expected shape \[Hkv\*L=16\] = \(16,\), got \(3,\)"),
        ((wq, wk, wv, wo), {"heads": H, "kv_heads": Hkv, "rope_theta": -1.0}, r"rope_theta"),
        ((wq, wk, wv, wo), {"heads": H, "kv_heads": Hkv, "weight_dtype": "float64"}, r'weight_dtype: expected "float32", "float16" or "bfloat16", got "float64"'),
        ((wq.astype(np.float64), wk, wv, wo), {"heads": H, "kv_heads": Hkv}, r"wq: dtype float64 is not supported"),
        ((wq, wk, wv, wo), {"heads": 0}, r"heads: must be >= 1"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            headsum.MHA(*args, **kwargs)
    mha = headsum.MHA(wq, wk, wv, wo, heads=H, kv_heads=Hkv)
    other = headsum.MHA(wq, wk, wv, wo, heads=H, kv_heads=Hkv)
    x = rng.standard_normal((2, 5, Dm)).astype(np.float32)
    with pytest.raises(ValueError, match=r"x: expected shape \[B\]\[S\]\[Dm=32\], got \(2, 5, 31\)"):
        mha(x[..., :31])
    with pytest.raises(ValueError, match=r"x: expected 3 dims"):
        mha(x[0])
    cache = mha.new_cache(batch=2, capacity=8)
    mha(x, cache)
    out = np.full_like(x, 4.0)
    with pytest.raises(ValueError):  # no room for 5 more: the cache is left as it was
        mha(x, cache, out=out)
    assert len(cache) == 5 and (out == 4.0).all()
    with pytest.raises(ValueError):  # a batch other than the cache's
        mha(x[:1, :2], cache)
    with pytest.raises(ValueError):  # a cache made for another layer
        other(x[:, :1], cache)
    assert len(cache) == 5
    with pytest.raises(ValueError):
        cache.truncate(6)
    with pytest.raises(ValueError):
        mha.new_cache(batch=0, capacity=8)
    readonly = np.zeros_like(x)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match=r"out: the array is read-only"):
        mha(x, out=readonly)


def test_cache_keeps_its_layer_alive(rng):
    import gc

    w = make_layer(rng, 16, 2, 2, 8)
    mha = headsum.MHA(*w[:4], heads=2)
    cache = mha.new_cache(1, 4)
    x = rng.standard_normal((1, 2, 16)).astype(np.float32)
    y = mha(x, cache)
    del mha
    gc.collect()
    assert len(cache) == 2 and y.shape == x.shape


# --- the layer with options (window, softcap, alibi_slopes, sinks) ----------

OPTION_CONFIGS = [
    # Dm, H, Hkv, L, causal, rope_theta, cache_dtype, options
    (32, 4, 2, 8, True, 10000.0, "float32", {"window": 5}),
    (32, 4, 4, 8, False, 0.0, "float32", {"window": 3}),
    (40, 2, 2, 20, True, 0.0, "float32", {"softcap": 1.5}),
    (48, 4, 1, 12, True, 500.0, "float32", {"alibi_slopes": [1.0, 0.5, 0.25, 0.125]}),
    (32, 4, 2, 8, False, 0.0, "float32", {"sinks": [0.5, -1.0, 2.0, 0.0]}),
    (32, 4, 2, 8, True, 10000.0, "bfloat16",
     {"window": 6, "softcap": 2.0, "alibi_slopes": [0.5, 0.25, 0.125, 0.0625], "sinks": [1.0, 0.0, -1.0, 0.5]}),
]


def ref_options(options):
    out = dict(options)
    for name in ("alibi_slopes", "sinks"):
        if name in out:
            out[name] = np.asarray(out[name], np.float32).astype(np.float64)
    if "softcap" in out:
        out["softcap"] = float(np.float32(out["softcap"]))
    return out


@pytest.mark.parametrize("config", OPTION_CONFIGS)
def test_layer_with_options(rng, config):
    """Without a cache, and through one in chunks (causal): within the bound of
    the reference layer with the same options; the plain layer is not."""
    Dm, H, Hkv, L, causal, theta, cdt, options = config
    w = make_layer(rng, Dm, H, Hkv, L)
    mha = headsum.MHA(*w[:4], heads=H, kv_heads=Hkv, causal=causal, rope_theta=theta,
                      bq=w[4], bk=w[5], bv=w[6], bo=w[7], cache_dtype=cdt, **options)
    assert (mha.window, mha.softcap) == (options.get("window", 0), np.float32(options.get("softcap", 0.0)))
    B, T = 2, 17
    x = rng.standard_normal((B, T, Dm)).astype(np.float32)
    wr = [None if a is None else a.astype(np.float64) for a in w]
    ro = ref_options(options)
    ref, bound = layer_ref(x.astype(np.float64), wr, H, Hkv, causal, np.float32(theta), "float32", **ro)
    y = mha(x)
    check(y, ref, bound, f"layer {config} without a cache")
    plain = headsum.MHA(*w[:4], heads=H, kv_heads=Hkv, causal=causal, rope_theta=theta,
                        bq=w[4], bk=w[5], bv=w[6], bo=w[7])
    assert np.abs(plain(x) - ref).max() > 1e-3, "the options changed nothing"
    if not causal:
        return
    ref, bound = layer_ref(x.astype(np.float64), wr, H, Hkv, True, np.float32(theta), cdt, **ro)
    cache = mha.new_cache(batch=B, capacity=T)
    start = 0
    for chunk in (7, 1, 1, 5, 1, 2):
        y = mha(x[:, start : start + chunk], cache)
        check(y, ref[:, start : start + chunk], bound[:, start : start + chunk], f"tokens {start}..")
        start += chunk


def test_layer_options_as_arrays_and_copied(rng):
    Dm, H, L = 32, 4, 8
    w = make_layer(rng, Dm, H, H, L)
    slopes = np.array([0.5, 0.25, 0.125, 0.0625], np.float32)
    sinks = np.array([1.0, 0.0, -1.0, 0.5], np.float16)  # any float dtype: staged
    mha = headsum.MHA(*w[:4], heads=H, alibi_slopes=slopes, sinks=sinks, window=4)
    same = headsum.MHA(*w[:4], heads=H, alibi_slopes=slopes.tolist(),
                       sinks=sinks.astype(np.float32).tolist(), window=4)
    x = rng.standard_normal((1, 9, Dm)).astype(np.float32)
    y = mha(x)
    slopes[:] = np.nan  # the layer holds its own copy
    assert np.array_equal(mha(x), y)
    assert np.array_equal(same(x), y)


def test_layer_option_errors(rng):
    Dm, H, Hkv, L = 32, 4, 2, 8
    w = make_layer(rng, Dm, H, Hkv, L)
    for kwargs, pattern in [
        ({"window": -2}, r"window: must be >= 0 \(0: no window\), got -2"),
        ({"softcap": -1.0}, r"softcap: must be finite and >= 0"),
        ({"alibi_slopes": [1.0, 2.0]}, r"alibi_slopes: expected shape \[H=4\] = \(4,\), one value per query head, got \(2,\)"),
        ({"sinks": np.zeros(8, np.float32)}, r"sinks: expected shape \[H=4\]"),
        ({"sinks": [0.0, float("nan"), 0.0, 0.0]}, r"headsum_mha_create_ex: options->sinks\[1\] = nan must be finite"),
        ({"alibi_slopes": [0.0, 0.0, float("inf"), 0.0]}, r"options->alibi_slopes\[2\] = inf must be finite"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            headsum.MHA(*w[:4], heads=H, kv_heads=Hkv, **kwargs)
    with pytest.raises(TypeError):  # the layer takes no bias
        headsum.MHA(*w[:4], heads=H, kv_heads=Hkv, bias=np.zeros((1, 1, 1, 1), np.float32))
