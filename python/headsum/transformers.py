"""headsum as a Hugging Face transformers attention implementation.

    import headsum.transformers                    # registers "headsum"
    model = AutoModel.from_pretrained(name, attn_implementation="headsum")
    model.set_attn_implementation("headsum")       # or switch a loaded model

Importing this module registers "headsum" with transformers' AttentionInterface
(the attention core of every layer) and AttentionMaskInterface (transformers
5 builds no mask at all for a name it does not know, so padding would be
lost).  The mask function is transformers' sdpa_mask, so a layer receives
what the "sdpa" implementation would: None where the mask is plain causal
(or plain bidirectional), else a boolean [B][1][Sq][Skv] (True = attend),
which is made an additive 0 / -inf bias in the model's dtype once per
forward (in the mask function, not once per layer).

What each layer's call maps onto headsum.attention (q, k, v read in place,
the output written straight into the [B][S][H][L] tensor transformers
expects; no copy of Q, K or V):

  * attention_mask: the bias (broadcast over heads; a user's own 4-D float
    mask is added as it is); None with is_causal: torch's top-left causal,
    as the sdpa path computes it (headsum.torch's mapping);
  * is_causal: the kwarg, else module.is_causal, as sdpa_attention_forward
    reads them (a single query row is never causal, as there);
  * scaling -> scale; softcap (Gemma 2) -> softcap; s_aux (gpt-oss's
    per-head sinks) -> sinks;
  * sliding_window: already in the mask transformers builds (sdpa_mask
    only skips it when every key is inside the window);
  * GQA: key heads fewer than query heads run headsum's grouped heads.

What headsum cannot honour runs transformers' own path, with one warning
per reason: dropout > 0 while training, a tensor that requires grad with
grad mode on (headsum has no backward), output_attentions, a dtype other
than float32/float16/bfloat16, a non-CPU device, position_bias, a value
head dim unlike the query's, or a mask it cannot read.  The fallback is
the model's own eager_attention_forward where the layer needs softcap,
sinks or the attention weights (the sdpa path has none of them), else
transformers' sdpa_attention_forward.

Under torch.compile each call is the custom op torch.ops.headsum.sdpa (one
node per layer, no graph break; the mask then keeps all its rows).
"""

from __future__ import annotations

import math
import sys
from typing import Optional

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.utils import logging

from . import _headsum
from . import torch as _headsum_torch

__all__ = ["NAME", "attention_forward", "mask"]

NAME = "headsum"

logger = logging.get_logger(__name__)

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def mask(*args, dtype: torch.dtype = torch.float32, **kwargs) -> Optional[torch.Tensor]:
    """transformers' sdpa_mask, its boolean mask made an additive one.

    Returns None where sdpa_mask does (plain causal or bidirectional: the
    attention function then reads is_causal), else a [B][1][Sq][Skv] tensor
    of 0 (attend) and -inf in `dtype` (the model's), which every layer of
    the forward reads as headsum's bias.  A mask that does not depend on the
    query row (padding only) keeps Sq = 1, broadcast by headsum."""
    m = sdpa_mask(*args, dtype=dtype, **kwargs)
    if m is None or m.dtype != torch.bool:
        return m
    if m.dim() == 4 and m.shape[2] > 1 and (
        m.stride(2) == 0 or (not torch.compiler.is_compiling() and torch.equal(m, m[:, :, :1].expand(m.shape)))
    ):
        m = m[:, :, :1]  # every row alike (a padding mask): one row, broadcast
    if not dtype.is_floating_point:
        dtype = torch.float32
    return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill_(m.logical_not(), -math.inf)


def _unsupported(module, query, key, value, attention_mask, dropout, kwargs) -> Optional[str]:
    """Why headsum cannot compute this call exactly, or None.  Cheap checks
    first: a small model's call is tens of microseconds."""
    dtype = query.dtype
    if dtype not in _DTYPES or key.dtype != dtype or value.dtype != dtype:
        return f"dtype {dtype} (headsum takes float32, float16, bfloat16)"
    if not (query.is_cpu and key.is_cpu and value.is_cpu):
        return f"device {query.device.type}"
    if (query.requires_grad or key.requires_grad or value.requires_grad) and torch.is_grad_enabled():
        return "a tensor requires grad (headsum has no backward; run under torch.no_grad() or torch.inference_mode())"
    if dropout and dropout > 0 and module.training:
        return "dropout > 0 while training"
    if kwargs and (kwargs.get("output_attentions") or kwargs.get("position_bias") is not None):
        if kwargs.get("output_attentions"):
            return "output_attentions (headsum never forms the attention weights)"
        return "position_bias"
    if query.dim() != 4 or key.dim() != 4 or value.shape != key.shape or value.shape[-1] != query.shape[-1]:
        return "query, key and value shapes (value's head dim must be the query's)"
    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
        return f"a {type(attention_mask).__name__} attention mask"
    return None


_warned = set()


def _fallback(reason, module, query, key, value, attention_mask, dropout, scaling, is_causal, softcap, s_aux, kwargs):
    """transformers' own answer: the model's eager function where the layer
    needs what sdpa lacks (softcap, sinks, the weights), else sdpa's."""
    needs_eager = softcap is not None or s_aux is not None or kwargs.get("output_attentions")
    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    use_eager = needs_eager and eager is not None
    if reason not in _warned:
        _warned.add(reason)
        logger.warning(
            f"headsum attention: {reason}; running transformers' "
            f"{'eager' if use_eager else 'sdpa'} attention instead (warned once)."
        )
    if use_eager:
        if is_causal is None:
            is_causal = getattr(module, "is_causal", True)
        Sq, Skv = query.shape[2], key.shape[2]
        if attention_mask is None and is_causal and Sq > 1:
            # eager reads causality from the mask alone; sdpa_mask left it
            # to is_causal (torch's top-left), so build that mask.
            seen = torch.ones((Sq, Skv), dtype=torch.bool, device=query.device).tril()
            attention_mask = seen[None, None]
        if attention_mask is not None and attention_mask.dtype == torch.bool:
            attention_mask = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device).masked_fill_(
                attention_mask.logical_not(), torch.finfo(query.dtype).min
            )
        elif attention_mask is not None:
            # eager adds the mask to the scores: -inf on a row with no key
            # would give NaN where sdpa and headsum give 0, so clamp as
            # transformers' eager_mask does (finfo.min).
            attention_mask = attention_mask.to(query.dtype).clamp(min=torch.finfo(query.dtype).min)
        extra = {"softcap": softcap} if softcap is not None else {}
        if s_aux is not None:
            extra["s_aux"] = s_aux
        return eager(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **extra, **kwargs)
    return sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
    )


def _direct(query, key, value, attention_mask, causal, scaling, softcap, sinks, out):
    """The calls transformers makes most (its own mask from mask(), or none
    with causal at Sq == Skv or not causal), straight to headsum.attention
    with no further checks; False for the rest (headsum.torch's mapping)."""
    Skv = key.shape[2]
    if attention_mask is not None:
        m = attention_mask
        if m.dtype != query.dtype or m.dim() != 4 or m.shape[1] != 1 or m.shape[3] != Skv or m.stride(3) != 1:
            return False
        if m.shape[0] != query.shape[0] or m.shape[2] not in (1, query.shape[2]):
            return False
    elif causal and query.shape[2] != Skv:
        return False
    if query.shape[1] % key.shape[1]:
        return False
    opts = {}
    if scaling is not None:
        if scaling == 0.0 or not math.isfinite(scaling):
            return False
        opts["scale"] = scaling
    if softcap:
        opts["softcap"] = softcap
    if sinks is not None:
        opts["sinks"] = sinks
    if attention_mask is not None:
        opts["bias"] = attention_mask
    elif causal:
        opts["causal"] = True
    _headsum.attention(query, key, value, out=out.transpose(1, 2), **opts)
    return True


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    is_causal: Optional[bool] = None,
    sliding_window: Optional[int] = None,
    softcap: Optional[float] = None,
    s_aux: Optional[torch.Tensor] = None,
    **kwargs,
):
    """The "headsum" attention: query [B][H][Sq][L], key/value
    [B][Hkv][Skv][L] -> ([B][Sq][H][L], None), as transformers' sdpa and
    eager functions return.  See the module's docstring for the mapping."""
    reason = _unsupported(module, query, key, value, attention_mask, dropout, kwargs)
    if reason is None and softcap is not None and not (softcap > 0 and math.isfinite(softcap)):
        reason = f"softcap {softcap}"
    if reason is None and s_aux is not None and (s_aux.dim() != 1 or s_aux.shape[0] != query.shape[1]):
        reason = f"s_aux of shape {tuple(s_aux.shape)} (one sink per query head)"
    if reason is None:
        B, H, Sq, L = query.shape
        # As sdpa_attention_forward: a mask replaces is_causal, and a single
        # query row is never causal.
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        causal = bool(causal) and Sq > 1 and attention_mask is None
        if attention_mask is not None and attention_mask.dtype == torch.bool:
            # A boolean 4-D mask from elsewhere (a user's, a cached one).
            attention_mask = torch.zeros(attention_mask.shape, dtype=query.dtype).masked_fill_(
                attention_mask.logical_not(), -math.inf
            )
        sinks = s_aux
        if sinks is not None and sinks.requires_grad:
            sinks = sinks.detach()  # a Parameter: DLPack takes no tensor that requires grad
        if torch.compiler.is_compiling():
            # One node of the graph: the custom op (it cannot write into a
            # view, so the [B][S][H][L] copy is the graph's).
            o = torch.ops.headsum.sdpa(
                query, key, value, attention_mask, causal, scaling, True, softcap or 0.0, sinks
            )
            return o.transpose(1, 2).contiguous(), None
        out = torch.empty((B, Sq, H, L), dtype=query.dtype)
        if _direct(query, key, value, attention_mask, causal, scaling, softcap, sinks, out):
            return out, None
        done = _headsum_torch._native(
            query, key, value, attention_mask, causal, scaling, True,
            out=out.transpose(1, 2), softcap=softcap or 0.0, sinks=sinks,
        )
        if done is not None:
            return out, None
        reason = "a mask headsum cannot read (shape or dtype)"
    if reason is not None:
        kwargs["sliding_window"] = sliding_window
        return _fallback(
            reason, module, query, key, value, attention_mask, dropout, scaling, is_causal, softcap, s_aux, kwargs
        )
    return out, None


def register() -> None:
    """Registers "headsum" with transformers' AttentionInterface and
    AttentionMaskInterface (done on import; calling it again is harmless)."""
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, mask)


register()
