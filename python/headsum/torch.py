"""headsum inside PyTorch: torch's scaled_dot_product_attention on headsum.

    import headsum.torch
    o = headsum.torch.scaled_dot_product_attention(q, k, v, attn_mask=None,
                                                    is_causal=False, scale=None,
                                                    enable_gqa=False)

The semantics are torch.nn.functional.scaled_dot_product_attention's (no
dropout): q [B][H][Sq][L] (or [H][Sq][L]), k/v [B][Hkv][Skv][L]; returns
[B][H][Sq][L] in q's dtype.  What maps onto headsum.attention, read in place:

  * is_causal: torch's causal mask is TOP-LEFT aligned (query i sees keys
    j <= i), headsum's bottom-right (j <= i + Skv - Sq).  Sq == Skv: the
    same.  Sq < Skv: keys j >= Sq are seen by no query, so the call runs on
    k[:, :, :Sq] (a view) with headsum's causal.  Sq > Skv: rows i < Skv are
    the square causal call over every key, rows i >= Skv see every key: two
    calls writing the two halves of one output.
  * attn_mask: a boolean mask (True = attend) becomes a 0 / -inf additive
    bias in q's dtype (one [*mask.shape] tensor); a float mask (float32 or
    q's dtype, as torch takes) is the bias itself, read in place with its
    broadcast dims at stride 0.  A mask headsum cannot read directly (a
    broadcast last dim, fewer than 2 or more than 4 dims) is broadcast to
    [B][H][Sq][Skv] first.
  * enable_gqa: Hkv dividing H runs headsum's grouped heads (no repeat of
    K, V).  Without it, torch broadcasts only Hkv == 1 (the same values as
    one group); any other H != Hkv raises as torch does.
  * a key/value batch of 1 broadcasts over q's batch (stride 0).

Everything else runs torch's own function inside the op, so the answer
(or the error) is torch's: dtypes other than float32/float16/bfloat16 or
mixed ones, a non-CPU device, Ev != L, scale == 0 (headsum reads 0 as
"default"), empty dims, other ranks, a mask with is_causal (torch raises).

The call is the custom op torch.ops.headsum.sdpa (torch.library.custom_op,
with a fake implementation; after torch's arguments it takes headsum's
softcap and sinks, which headsum.transformers passes), so torch.compile
and torch.export keep it in the graph as one node; called eagerly,
scaled_dot_product_attention skips the dispatcher (the same function the
op runs, 5 us less per call).  Inference only: a tensor that requires grad
(with grad mode on) raises; the op registers no autograd, so a backward
through it raises torch.library's error.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from . import _headsum

__all__ = ["scaled_dot_product_attention"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _heads_ok(H: int, Hkv: int, enable_gqa: bool) -> bool:
    if H == Hkv or Hkv == 1:  # Hkv == 1: torch broadcasts it, GQA or not
        return True
    return enable_gqa and H % Hkv == 0


def _bias(attn_mask: torch.Tensor, q: torch.Tensor, B: int, H: int, Sq: int, Skv: int):
    """The additive bias headsum reads for torch's attn_mask, or None when
    torch itself must judge the mask (its dtype or shape)."""
    if attn_mask.dtype == torch.bool:
        bias = torch.zeros(attn_mask.shape, dtype=q.dtype).masked_fill_(attn_mask.logical_not(), -math.inf)
    elif attn_mask.dtype == torch.float32 or attn_mask.dtype == q.dtype:
        bias = attn_mask
    else:  # torch: "Expected attn_mask dtype to be bool or float or to match query dtype"
        return None
    if bias.device.type != "cpu" or bias.dim() < 2:
        return None
    shape = tuple(bias.shape)
    direct = bias.dim() <= 4 and shape[-1] == Skv
    if direct:
        target = (B, H, Sq, Skv)[4 - len(shape):]
        direct = all(d == t or d == 1 for d, t in zip(shape[:-1], target[:-1]))
    if not direct:
        try:
            bias = torch.broadcast_to(bias, (B, H, Sq, Skv))
        except RuntimeError:
            return None
    return bias


def _native(q, k, v, attn_mask, is_causal, scale, enable_gqa, out=None, softcap=0.0, sinks=None):
    """headsum's answer to torch's SDPA of these arguments (written into out,
    a [B][H][Sq][L] view, when given), or None when the call is not one
    headsum maps exactly (the caller then runs torch's).  softcap and sinks
    (headsum.attention's) are for headsum.transformers; torch's SDPA has
    neither."""
    # Cheap checks first: a decode step's whole call is ~15 us.
    squeeze = out is None and q.dim() == 3 and k.dim() == 3 and v.dim() == 3
    if squeeze:
        q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    dtype = q.dtype
    if dtype not in _DTYPES or k.dtype != dtype or v.dtype != dtype:
        return None
    if not (q.is_cpu and k.is_cpu and v.is_cpu) or q.dim() != 4 or k.dim() != 4:
        return None
    if scale is not None and (scale == 0.0 or not math.isfinite(scale)):
        return None
    B, H, Sq, L = q.shape
    kshape = k.shape
    Bk, Hkv, Skv, Lk = kshape
    if v.shape != kshape or Lk != L or not (B and H and Sq and L and Skv):
        return None
    if H != Hkv and not _heads_ok(H, Hkv, enable_gqa):
        return None
    if Bk != B:
        if Bk != 1:
            return None
        k, v = k.expand(B, Hkv, Skv, L), v.expand(B, Hkv, Skv, L)
    # DLPack refuses tensors that require grad; the public function has
    # already refused them with grad mode on, and the op has no autograd.
    if q.requires_grad or k.requires_grad or v.requires_grad:
        q, k, v = q.detach(), k.detach(), v.detach()
    opts = {}  # only what is set: each keyword costs the binding a parse
    if scale is not None:
        opts["scale"] = scale
    if softcap:
        opts["softcap"] = softcap
    if sinks is not None:
        opts["sinks"] = sinks
    if out is not None:
        opts["out"] = out
    if attn_mask is not None:
        if is_causal:
            return None  # torch raises: an explicit mask with is_causal
        bias = _bias(attn_mask.detach(), q, B, H, Sq, Skv)
        if bias is None:
            return None
        o = _headsum.attention(q, k, v, bias=bias, **opts)
    elif not is_causal:
        o = _headsum.attention(q, k, v, **opts)
    elif Sq == Skv:
        o = _headsum.attention(q, k, v, causal=True, **opts)
    elif Sq < Skv:
        # Top-left: no query sees a key past Sq - 1.
        o = _headsum.attention(q, k[:, :, :Sq], v[:, :, :Sq], causal=True, **opts)
    else:
        # Top-left with Sq > Skv: the first Skv rows are the square causal
        # call, the rest see every key.
        o = opts.pop("out", None)
        if o is None:
            o = torch.empty((B, H, Sq, L), dtype=q.dtype)
        _headsum.attention(q[:, :, :Skv], k, v, causal=True, out=o[:, :, :Skv], **opts)
        _headsum.attention(q[:, :, Skv:], k, v, causal=False, out=o[:, :, Skv:], **opts)
    return o.squeeze(0) if squeeze else o


def _sdpa(q, k, v, attn_mask, is_causal, scale, enable_gqa, softcap=0.0, sinks=None):
    o = _native(q, k, v, attn_mask, is_causal, scale, enable_gqa, softcap=softcap, sinks=sinks)
    if o is None:
        if softcap or sinks is not None:  # torch's function has neither
            raise RuntimeError(
                "headsum::sdpa: softcap or sinks on a call headsum cannot serve (dtype, device or shapes); "
                "torch's scaled_dot_product_attention has neither"
            )
        o = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
        )
    return o


@torch.library.custom_op("headsum::sdpa", mutates_args=())
def _sdpa_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """torch's SDPA arguments, then headsum's softcap and sinks [H] (what
    headsum.transformers passes for Gemma 2 and gpt-oss under torch.compile)."""
    return _sdpa(q, k, v, attn_mask, is_causal, scale, enable_gqa, softcap, sinks)


@_sdpa_op.register_fake
def _sdpa_fake(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False, softcap=0.0, sinks=None):
    # [*batch, Sq, Ev]: the leading dims broadcast as torch's do, except the
    # head dim under GQA, which is q's.
    lead = list(q.shape[:-2])
    other = list(k.shape[:-2])
    for i in range(1, min(len(lead), len(other)) + 1):
        if lead[-i] == 1:
            lead[-i] = other[-i]
    if len(other) > len(lead):
        lead = other[: len(other) - len(lead)] + lead
    return q.new_empty((*lead, q.shape[-2], v.shape[-1]))


def _requires_grad(q, k, v, attn_mask) -> bool:
    return (q.requires_grad or k.requires_grad or v.requires_grad or (
        attn_mask is not None and attn_mask.requires_grad)) and torch.is_grad_enabled()


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """torch.nn.functional.scaled_dot_product_attention (without dropout) on
    headsum's kernels; see the module's docstring for what maps and what
    runs torch's own function.  Inference only: raises RuntimeError for a
    tensor that requires grad while grad mode is on."""
    if _requires_grad(query, key, value, attn_mask):
        raise RuntimeError(
            "headsum.torch.scaled_dot_product_attention is inference only (headsum::sdpa has no "
            "backward): a tensor requires grad. Run it under torch.no_grad() or "
            "torch.inference_mode(), or use torch.nn.functional.scaled_dot_product_attention to train."
        )
    if torch.compiler.is_compiling():
        return _sdpa_op(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    return _sdpa(query, key, value, attn_mask, is_causal, scale, enable_gqa)

