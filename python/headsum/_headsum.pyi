"""Type stubs for headsum's compiled core (re-exported by `headsum`).

Array arguments are NumPy arrays (float32, float16) or DLPack tensors
(e.g. torch float32/float16/bfloat16) on the CPU.  Results are NumPy arrays,
or torch tensors when the call's first array is a torch tensor.
"""

from typing import Any, Optional, Sequence, Tuple, Union


# A NumPy array or any object with __dlpack__ (torch.Tensor, ...).
ArrayLike = Any
# [H] values, one per query head: an array or a sequence of numbers.
PerHead = Union[ArrayLike, Sequence[float]]

__version__: str

def attention(
    q: ArrayLike,
    k: ArrayLike,
    v: ArrayLike,
    *,
    causal: bool = False,
    scale: Optional[float] = None,
    out: Optional[ArrayLike] = None,
    window: int = 0,
    softcap: float = 0.0,
    alibi_slopes: Optional[PerHead] = None,
    sinks: Optional[PerHead] = None,
    bias: Optional[ArrayLike] = None,
) -> ArrayLike:
    """O [B][H][Sq][L] = softmax(scale Q K^T + mask) V; q [B][H][Sq][L],
    k and v [B][Hkv][Skv][L] (Hkv divides H).  scale None: 1/sqrt(L).

    With what a model adds, query i at position p = i + (Skv - Sq), key j
    at j: s = scale q.k; s = softcap tanh(s / softcap) (softcap > 0);
    s += alibi_slopes[h] (j - p); s += bias[b][h][i][j]; keys outside the
    window (window > 0: causal p - window < j <= p, else |j - p| < window)
    and the causal mask removed; sinks[h] joins the denominator only.
    alibi_slopes, sinks [H]; bias broadcastable to [B][H][Sq][Skv] (2-4
    dims, last dim Skv), -inf removes a key."""

# Index arrays: NumPy arrays, DLPack tensors or sequences of ints (any
# integer dtype, converted exactly).
IndexLike = Union[ArrayLike, Sequence[int], Sequence[Sequence[int]]]

def attention_paged(
    q: ArrayLike,
    k_pool: ArrayLike,
    v_pool: ArrayLike,
    block_table: IndexLike,
    q_offsets: IndexLike,
    kv_lens: IndexLike,
    *,
    causal: bool = True,
    scale: Optional[float] = None,
    window: int = 0,
    softcap: float = 0.0,
    alibi_slopes: Optional[PerHead] = None,
    sinks: Optional[PerHead] = None,
    out: Optional[ArrayLike] = None,
) -> ArrayLike:
    """O [T][H][L] of a ragged batch over a paged KV cache.  q [T][H][L]
    (T = q_offsets[B]); k_pool, v_pool [num_blocks][block_size][Hkv][L]
    (one dtype and strides, L contiguous, read in place; a head-major pool
    passes as .transpose(0, 2, 1, 3)); block_table [B][blocks_per_seq]
    (int32 values); q_offsets [B+1], kv_lens [B] (int64 values).  Sequence
    b's rows q_offsets[b] .. q_offsets[b+1]-1 are its last positions among
    its kv_lens[b] keys (causal bottom-right); token t is slot
    t % block_size of block block_table[b][t // block_size].  Options as
    attention()."""

def paged_kv_write(
    k_new: ArrayLike,
    v_new: ArrayLike,
    k_pool: ArrayLike,
    v_pool: ArrayLike,
    block_table: IndexLike,
    q_offsets: IndexLike,
    kv_lens: IndexLike,
) -> None:
    """Writes k_new, v_new [T][Hkv][L] into the pools IN PLACE at each
    sequence's positions kv_lens[b] - n_b .. kv_lens[b] - 1, converted to
    the pools' dtype (nearest even).  The pools must be writeable with L
    contiguous; they are never copied."""

def project_heads_sum(
    o: ArrayLike,
    wo: ArrayLike,
    bias: Optional[ArrayLike] = None,
    gates: Optional[ArrayLike] = None,
    *,
    out: Optional[ArrayLike] = None,
) -> ArrayLike:
    """Y [B][S][D] = sum_h gates[h] O_h Wo[h] + bias; o [B][H][S][L],
    wo [H*L][D], bias [D], gates [H]."""

def head_contributions(
    o: ArrayLike, wo: ArrayLike, *, out: Optional[ArrayLike] = None
) -> ArrayLike:
    """C [B][S][H][D] = O_h Wo[h] (float32)."""

def head_attribution(
    o: ArrayLike, wo: ArrayLike, directions: ArrayLike, *, out: Optional[ArrayLike] = None
) -> ArrayLike:
    """A [B][S][H][R] = (O_h Wo[h]) . directions[r] (float32); directions
    [R][D], or [D] for a [B][S][H] result."""

def head_contribution_norms(
    o: ArrayLike, wo: ArrayLike, *, out: Optional[ArrayLike] = None
) -> ArrayLike:
    """N [B][S][H] = ||O_h Wo[h]||_2 (float32)."""

class AttributionBasis:
    """head_attribution with Wo[h] directions[r] computed once."""

    heads: int
    head_dim: int
    model_dim: int
    n_directions: int
    def __init__(self, wo: ArrayLike, directions: ArrayLike, heads: int) -> None: ...
    def __call__(self, o: ArrayLike, *, out: Optional[ArrayLike] = None) -> ArrayLike:
        """A [B][S][H][R] (or [B][S][H]) for o [B][H][S][L]."""

class KVCache:
    """A layer's KV cache (MHA.new_cache): K after RoPE and V of up to
    `capacity` tokens for `batch` sequences."""

    batch: int
    capacity: int
    @property
    def length(self) -> int: ...
    def __len__(self) -> int: ...
    def reset(self) -> None: ...
    def truncate(self, length: int) -> None: ...

class MHA:
    """The whole attention layer: x @ [Wq Wk Wv] (+ biases), RoPE, attention
    (GQA; with a window, softcap, ALiBi slopes, sinks), y = sum_h O_h Wo[h]
    + bo.  wq [Dm][H*L], wk/wv [Dm][Hkv*L], wo [H*L][Dm]."""

    model_dim: int
    heads: int
    kv_heads: int
    head_dim: int
    causal: bool
    rope_theta: float
    window: int
    softcap: float
    def __init__(
        self,
        wq: ArrayLike,
        wk: ArrayLike,
        wv: ArrayLike,
        wo: ArrayLike,
        heads: int = 8,
        kv_heads: Optional[int] = None,
        causal: bool = True,
        rope_theta: float = 0.0,
        bq: Optional[ArrayLike] = None,
        bk: Optional[ArrayLike] = None,
        bv: Optional[ArrayLike] = None,
        bo: Optional[ArrayLike] = None,
        weight_dtype: str = "float32",
        cache_dtype: str = "float32",
        window: int = 0,
        softcap: float = 0.0,
        alibi_slopes: Optional[PerHead] = None,
        sinks: Optional[PerHead] = None,
    ) -> None:
        """window, softcap, alibi_slopes [H], sinks [H]: what the model adds
        to the scores, as attention() takes them, copied."""
    def __call__(
        self, x: ArrayLike, cache: Optional[KVCache] = None, *, out: Optional[ArrayLike] = None
    ) -> ArrayLike:
        """y [B][S][Dm] (float32) for x [B][S][Dm]; with a cache, the tokens
        follow those it holds and are appended."""
    def new_cache(self, batch: int = 1, capacity: int = 4096) -> KVCache: ...

def set_target(name: Optional[str] = None) -> None: ...
def active_target() -> str: ...
def compiled_targets() -> list[str]: ...
def set_num_threads(n: int) -> None: ...
def _copy_stats() -> Tuple[int, int]: ...
def _fail_allocations_after(n: int) -> None: ...
