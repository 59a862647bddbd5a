"""headsum.attention_paged and headsum.paged_kv_write: ragged batches
(decode rows, prefill, chunked prefill and their mix) over a paged KV cache,
against the float64 reference of each sequence over its keys gathered from
the blocks (reference.attention_ref, its rows at their positions
kv_lens[b] - n_b .., causal bottom-right), with the bounds the other tests
use.  Block sizes 1, 16, 64 and one block per sequence; shuffled block
tables; a prefix block shared by several sequences; sequences with no query
rows; GQA and MQA; float32, float16 and bfloat16 pools and queries (bfloat16
through DLPack capsules made here, NumPy having no bfloat16); token-major
and head-major pools; the options; write-then-attend; out=; zero-copy;
every error, with nothing written."""

import ctypes

import numpy as np
import pytest

import headsum
from conftest import assert_releases_gil, copies, runnable_targets, torch_or_skip
from reference import assert_within, attention_ref

# --- bfloat16 arrays through DLPack ------------------------------------------
#
# A bfloat16 array is held here as its uint16 bits (any NumPy view of them)
# and handed to headsum as a DLPack capsule over that same memory: what a
# torch bfloat16 tensor is to the binding, without torch.


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _Dtype(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _Dtype),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_CAPSULE_NAME = b"dltensor"
_KEEP = []  # the structs (and arrays) capsules point at: kept for the process


class BF16:
    """A bfloat16 array: `bits` a uint16 NumPy array (any view)."""

    def __init__(self, bits):
        assert bits.dtype == np.uint16
        self.bits = bits

    @property
    def shape(self):
        return self.bits.shape

    def transpose(self, *axes):
        return BF16(self.bits.transpose(*axes))

    def __getitem__(self, index):
        return BF16(self.bits[index])

    def capsule(self):
        """A fresh DLPack capsule (kDLBfloat, 16 bits) over self.bits."""
        a = self.bits
        shape = (ctypes.c_int64 * a.ndim)(*a.shape)
        strides = (ctypes.c_int64 * a.ndim)(*(s // 2 for s in a.strides))
        m = _Managed()
        m.dl_tensor.data = a.ctypes.data
        m.dl_tensor.device = _Device(1, 0)  # kDLCPU
        m.dl_tensor.ndim = a.ndim
        m.dl_tensor.dtype = _Dtype(4, 16, 1)  # kDLBfloat
        m.dl_tensor.shape = shape
        m.dl_tensor.strides = strides
        m.dl_tensor.byte_offset = 0
        m.manager_ctx = None
        m.deleter = None
        _KEEP.append((m, shape, strides, a))
        return _PyCapsule_New(ctypes.addressof(m), _CAPSULE_NAME, None)


def bf16_bits(x):
    """float32 -> bfloat16 bits, round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def arg(a):
    """What the call is handed: NumPy arrays as they are, BF16 as a capsule."""
    return a.capsule() if isinstance(a, BF16) else a


def values(a):
    """The exact values, float64."""
    if isinstance(a, BF16):
        return (a.bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.asarray(a, dtype=np.float64)


def cast(x, dtype_name):
    """float32 values as an array of dtype_name (bfloat16: BF16)."""
    if dtype_name == "bfloat16":
        return BF16(bf16_bits(x))
    return np.asarray(x, np.float32).astype(dtype_name)


def empty_like_dtype(shape, dtype_name, fill=0.0):
    if dtype_name == "bfloat16":
        return BF16(np.full(shape, bf16_bits(np.float32(fill)), np.uint16))
    return np.full(shape, fill, dtype_name)


def snapshot(a):
    return (a.bits if isinstance(a, BF16) else a).copy()


def unchanged(a, before):
    return np.array_equal((a.bits if isinstance(a, BF16) else a), before, equal_nan=True)


# --- paged batches -----------------------------------------------------------


class Paged:
    """A ragged batch over a paged pool, filled with random values."""

    def __init__(self, rng, H, Hkv, L, block_size, rows, keys, dtype="float32", q_dtype=None,
                 head_major=False, share_prefix=False, shuffle=True, pad=0):
        B = len(rows)
        bs = block_size
        self.H, self.Hkv, self.L, self.bs = H, Hkv, L, bs
        self.rows = np.array(rows, np.int64)
        self.kv_lens = np.array(keys, np.int64)
        self.q_offsets = np.concatenate([[0], np.cumsum(self.rows)]).astype(np.int64)
        used = [-(-k // bs) for k in keys]
        self.blocks_per_seq = max(used) + 1  # an unused entry past each sequence's blocks
        self.num_blocks = sum(used) + 3  # blocks no sequence uses
        perm = rng.permutation(self.num_blocks) if shuffle else np.arange(self.num_blocks)
        table = np.full((B, self.blocks_per_seq), -7, np.int32)  # past the used blocks: never read
        nxt = 0
        for b in range(B):
            for n in range(used[b]):
                if share_prefix and b >= 1 and n == 0 and used[0] > 0:
                    table[b, 0] = table[0, 0]  # sequence 0's first block: a shared prefix
                    continue
                table[b, n] = perm[nxt]
                nxt += 1
        self.block_table = table
        # Pools: token-major [nb][bs][Hkv][L], or head-major [nb][Hkv][bs][L]
        # passed as .transpose(0, 2, 1, 3); `pad` elements after each row.
        storage = (self.num_blocks, Hkv, bs, L + pad) if head_major else (self.num_blocks, bs, Hkv, L + pad)
        self.k_pool = self._pool(rng.uniform(-1.5, 1.5, storage), dtype, head_major, L)
        self.v_pool = self._pool(rng.uniform(-1.0, 1.0, storage), dtype, head_major, L)
        T = int(self.q_offsets[-1])
        self.q = cast(rng.standard_normal((T, H, L)).astype(np.float32), q_dtype or dtype)

    @staticmethod
    def _pool(x, dtype, head_major, L):
        p = cast(x.astype(np.float32), dtype)[..., :L]
        return p.transpose(0, 2, 1, 3) if head_major else p

    def index(self):
        return self.block_table, self.q_offsets, self.kv_lens

    def gather(self, pool, b):
        """Sequence b's keys [Hkv][kv_len][L], float64, from the blocks."""
        S = int(self.kv_lens[b])
        t = np.arange(S)
        blocks = self.block_table[b, t // self.bs]
        return values(pool)[blocks, t % self.bs].transpose(1, 0, 2)

    def reference(self, q=None, causal=True, scale=None, **options):
        """O [T][H][L] and its bound, sequence by sequence."""
        q = values(self.q if q is None else q)
        s = 1.0 / np.sqrt(self.L) if scale is None else float(np.float32(scale))
        ref = np.zeros(q.shape)
        bound = np.zeros(q.shape)
        opts = {}
        for name, value in options.items():
            if name in ("alibi_slopes", "sinks") and value is not None:
                value = np.asarray(value, np.float32).astype(np.float64)
            elif name == "softcap":
                value = float(np.float32(value))
            opts[name] = value
        for b in range(len(self.kv_lens)):
            lo, hi = int(self.q_offsets[b]), int(self.q_offsets[b + 1])
            if hi == lo:
                continue
            qb = q[lo:hi].transpose(1, 0, 2)[None]  # [1][H][n_b][L]
            k = self.gather(self.k_pool, b)[None]
            v = self.gather(self.v_pool, b)[None]
            o, e = attention_ref(qb, k, v, causal, s, **opts)
            ref[lo:hi] = o[0].transpose(1, 0, 2)
            bound[lo:hi] = e[0].transpose(1, 0, 2)
        return ref, bound

    def attend(self, q=None, **kwargs):
        q = self.q if q is None else q
        return headsum.attention_paged(arg(q), arg(self.k_pool), arg(self.v_pool), *self.index(),
                                       **kwargs)


CASES = {
    # H, Hkv, L, block_size, rows (n_b), keys (kv_lens), head-major pool, shared prefix
    "one decode row, block 16": (4, 4, 64, 16, [1], [33], False, False),
    "decode, block 16, GQA, shared prefix": (8, 2, 64, 16, [1, 1, 1], [17, 1100 // 4, 40], False, True),
    "prefill, block 1": (2, 2, 17, 1, [3, 9, 5], [3, 9, 5], False, False),
    "mixed, block 64, MQA, head-major, shared": (4, 1, 32, 64, [1, 0, 59, 5], [200, 70, 130, 70], True, True),
    "one block a sequence": (2, 1, 16, 200, [4, 1], [150, 200], False, False),
    "chunked prefill and decode, L=17": (8, 2, 17, 16, [17, 1, 0, 2], [17, 90, 33, 40], True, False),
}


def make(rng, name, dtype="float32", q_dtype=None, **kwargs):
    H, Hkv, L, bs, rows, keys, head_major, share = CASES[name]
    return Paged(rng, H, Hkv, L, bs, rows, keys, dtype, q_dtype, head_major=head_major,
                 share_prefix=share, **kwargs)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("causal", [True, False])
def test_cases_match_reference(rng, name, dtype, causal):
    p = make(rng, name, dtype)
    o = p.attend(causal=causal)
    T = int(p.q_offsets[-1])
    # The result has q's dtype (float32 for a bfloat16 q that is not torch's).
    assert o.shape == (T, p.H, p.L)
    assert o.dtype == (np.float32 if dtype == "bfloat16" else np.dtype(dtype))
    ref, bound = p.reference(causal=causal)
    assert_within(o, ref, bound, f"attention_paged {name} {dtype} causal={causal}")


@pytest.mark.parametrize("pool_dtype,q_dtype", [("bfloat16", "float32"), ("float16", "float32"),
                                                ("float32", "bfloat16"), ("bfloat16", "float16")])
def test_pool_and_query_dtypes_mix(rng, pool_dtype, q_dtype):
    p = make(rng, "chunked prefill and decode, L=17", pool_dtype, q_dtype)
    ref, bound = p.reference()
    assert_within(p.attend(), ref, bound, f"{q_dtype} q over {pool_dtype} pools")


def test_block_sizes_and_unshuffled_tables(rng):
    """The same tokens in blocks of 1, 16, 64 and one block a sequence, the
    table shuffled or in order: the same attention within the bound."""
    keys, rows = [65, 3, 130], [17, 1, 3]
    for bs in (1, 16, 64, 130):
        for shuffle in (True, False):
            p = Paged(rng, 8, 2, 64, bs, rows, keys, shuffle=shuffle, pad=3)
            ref, bound = p.reference()
            assert_within(p.attend(), ref, bound, f"block_size {bs} shuffle={shuffle}")


def test_sequences_with_no_rows_and_an_empty_batch_of_rows(rng):
    p = Paged(rng, 4, 2, 16, 16, [0, 3, 0], [20, 40, 0])
    ref, bound = p.reference()
    assert_within(p.attend(), ref, bound, "sequences without rows")
    # No rows at all: a [0][H][L] result, nothing read.
    p = Paged(rng, 4, 2, 16, 16, [0, 0], [20, 5])
    o = p.attend()
    assert o.shape == (0, 4, 16)


def test_read_only_and_shared_pools_are_read(rng):
    """attention_paged only reads the pools: read-only arrays, and one
    array as both K and V, are fine."""
    p = make(rng, "prefill, block 1")
    p.k_pool.flags.writeable = False
    p.v_pool = p.k_pool
    ref, bound = p.reference()
    assert_within(p.attend(), ref, bound, "read-only pool as K and V")


def test_scale(rng):
    p = make(rng, "prefill, block 1")
    for scale in (0.05, 2.0):
        ref, bound = p.reference(scale=scale)
        assert_within(p.attend(scale=scale), ref, bound, f"scale {scale}")


# --- options -------------------------------------------------------------------


def slopes_for(H):
    return (2.0 * 2.0 ** (-8.0 * (np.arange(H) + 1) / H)).astype(np.float32)


def options_for(option, rng, H):
    if option == "window":
        return {"window": 24}
    if option == "softcap":
        return {"softcap": 1.5}
    if option == "alibi":
        return {"alibi_slopes": slopes_for(H)}
    if option == "sinks":
        return {"sinks": rng.uniform(-1, 2, H).astype(np.float32)}
    assert option == "all"
    out = {}
    for one in ("window", "softcap", "alibi", "sinks"):
        out.update(options_for(one, rng, H))
    return out


@pytest.mark.parametrize("option", ["window", "softcap", "alibi", "sinks", "all"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_options_on_a_paged_call(rng, option, causal, dtype):
    p = make(rng, "mixed, block 64, MQA, head-major, shared", dtype)
    options = options_for(option, rng, p.H)
    o = p.attend(causal=causal, **options)
    ref, bound = p.reference(causal=causal, **options)
    assert_within(o, ref, bound, f"attention_paged {option} causal={causal}")
    plain, _ = p.reference(causal=causal)
    assert not np.allclose(plain, ref, rtol=1e-4, atol=1e-5), f"{option} changed nothing"
    # Sequences as the per-head values: the same call.
    if option == "all":
        listed = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in options.items()}
        assert np.array_equal(o, p.attend(causal=causal, **listed))


def test_every_target(rng):
    p = make(rng, "chunked prefill and decode, L=17", "bfloat16")
    options = options_for("all", rng, p.H)
    ref, bound = p.reference(**options)
    for name in runnable_targets():
        headsum.set_target(name)
        assert_within(p.attend(**options), ref, bound, f"attention_paged on {name}")


# --- write, then attend ------------------------------------------------------------


def empty_pools(p, dtype, fill=7.0):
    """Fresh pools of p's layout and dtype, every element `fill`."""
    shape = (p.num_blocks, p.bs, p.Hkv, p.L)
    return empty_like_dtype(shape, dtype, fill), empty_like_dtype(shape, dtype, fill)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_write_then_attend_equals_dense_attention(rng, dtype):
    """A prefill chunk written, then a decode step written, by
    paged_kv_write from float32 rows into pools of `dtype`; attention_paged
    then equals dense attention over all the tokens, fed the same rounded
    values; the pools hold exactly the rounded rows, nothing else moved."""
    H, Hkv, L, bs = 8, 2, 64, 16
    total = [40, 17, 3]  # tokens each sequence ends with
    p = Paged(rng, H, Hkv, L, bs, [1, 1, 1], total)
    k_pool, v_pool = empty_pools(p, dtype)
    k_all = rng.uniform(-1.5, 1.5, (3, max(total), Hkv, L)).astype(np.float32)
    v_all = rng.uniform(-1, 1, (3, max(total), Hkv, L)).astype(np.float32)
    # Step 1: every token but the last of each sequence (a prefill chunk).
    # Step 2: the last token of each (a decode step).
    for first, last in (([0, 0, 0], [t - 1 for t in total]), ([t - 1 for t in total], total)):
        rows = [b - a for a, b in zip(first, last)]
        q_offsets = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        kv_lens = np.array(last, np.int64)
        k_new = np.concatenate([k_all[b, first[b] : last[b]] for b in range(3)])
        v_new = np.concatenate([v_all[b, first[b] : last[b]] for b in range(3)])
        before = copies()
        headsum.paged_kv_write(k_new, v_new, arg(k_pool), arg(v_pool), p.block_table, q_offsets,
                               kv_lens)
        assert copies() == before  # rows and pools as they are
    # The pools hold the rows rounded to their dtype, every other slot untouched.
    want_k, want_v = empty_pools(p, dtype)
    for b in range(3):
        t = np.arange(total[b])
        blocks, slots = p.block_table[b, t // bs], t % bs
        for pool, src in ((want_k, k_all), (want_v, v_all)):
            rounded = cast(src[b, : total[b]], dtype)
            if isinstance(pool, BF16):
                pool.bits[blocks, slots] = rounded.bits
            else:
                pool[blocks, slots] = rounded
    assert unchanged(k_pool, snapshot(want_k)) and unchanged(v_pool, snapshot(want_v))
    # Attend: the last token of each sequence over all its tokens.
    p.k_pool, p.v_pool = k_pool, v_pool
    p.kv_lens = np.array(total, np.int64)
    o = p.attend()
    ref, bound = p.reference()
    assert_within(o, ref, bound, f"write then attend, {dtype} pools")
    for b in range(3):
        k = values(cast(k_all[b, : total[b]], dtype)).transpose(1, 0, 2)[None]
        v = values(cast(v_all[b, : total[b]], dtype)).transpose(1, 0, 2)[None]
        q = values(p.q[b : b + 1]).transpose(1, 0, 2)[None]
        dense, dense_bound = attention_ref(q, k, v, True, 1.0 / np.sqrt(L))
        assert_within(o[b : b + 1], dense[0].transpose(1, 0, 2), dense_bound[0].transpose(1, 0, 2),
                      f"write then attend vs dense, sequence {b}")


def test_write_is_in_place_in_the_callers_arrays(rng):
    """paged_kv_write writes into the arrays it is given, whatever their
    layout: a head-major pool passed transposed, a padded token-major one,
    K and V halves of one [blocks][2][...] buffer (FlashInfer's); no
    staging, the padding and every other slot untouched."""
    H, Hkv, L, bs, nb = 4, 2, 17, 16, 6
    table = np.array([[4, 1], [0, 5]], np.int32)
    q_offsets = np.array([0, 3, 4], np.int64)
    kv_lens = np.array([18, 9], np.int64)  # sequence 0 writes positions 15..17, 1 writes 8
    k_new = rng.standard_normal((4, Hkv, L)).astype(np.float32)
    v_new = rng.standard_normal((4, Hkv, L)).astype(np.float32)
    dests = [(4, 15), (1, 0), (1, 1), (0, 8)]  # (block, slot) of each new row
    head_major = np.full((2, nb, Hkv, bs, L), -3.0, np.float32)
    padded = np.full((2, nb, bs, Hkv, L + 5), -3.0, np.float32)
    interleaved = np.full((nb, 2, bs, Hkv, L), -3.0, np.float32)
    layouts = {
        "head-major, transposed": (head_major[0].transpose(0, 2, 1, 3), head_major[1].transpose(0, 2, 1, 3), head_major),
        "padded token-major": (padded[0, ..., :L], padded[1, ..., :L], padded),
        "interleaved K and V": (interleaved[:, 0], interleaved[:, 1], interleaved),
    }
    for name, (k_pool, v_pool, whole) in layouts.items():
        before_whole = whole.copy()
        before = copies()
        headsum.paged_kv_write(k_new, v_new, k_pool, v_pool, table, q_offsets, kv_lens)
        assert copies() == before, name
        for row, (blk, slot) in enumerate(dests):
            assert np.array_equal(k_pool[blk, slot], k_new[row]), name
            assert np.array_equal(v_pool[blk, slot], v_new[row]), name
            k_pool[blk, slot] = -3.0
            v_pool[blk, slot] = -3.0
        assert np.array_equal(whole, before_whole), f"{name}: wrote outside the new rows' slots"


def test_write_converts_to_the_pool_dtype_exactly(rng):
    """float32 rows into float16 and bfloat16 pools: round to nearest even,
    as NumPy's float16 cast and bf16_bits; 16-bit rows into a float32 pool
    exactly; strided rows are staged once."""
    Hkv, L, bs = 2, 24, 8
    table = np.array([[2, 0, 1]], np.int32)
    q_offsets = np.array([0, 20], np.int64)
    kv_lens = np.array([20], np.int64)
    k_new = (rng.standard_normal((20, Hkv, L)) * 1e3).astype(np.float32)
    v_new = (rng.standard_normal((20, Hkv, L)) * 1e-3).astype(np.float32)
    t = np.arange(20)
    blocks, slots = table[0, t // bs], t % bs
    for dtype in ("float16", "bfloat16"):
        k_pool, v_pool = (empty_like_dtype((3, bs, Hkv, L), dtype) for _ in range(2))
        headsum.paged_kv_write(k_new, v_new, arg(k_pool), arg(v_pool), table, q_offsets, kv_lens)
        for pool, src in ((k_pool, k_new), (v_pool, v_new)):
            want = cast(src, dtype)
            got = pool.bits[blocks, slots] if dtype == "bfloat16" else pool[blocks, slots]
            assert np.array_equal(got, want.bits if dtype == "bfloat16" else want), dtype
    k16 = k_new.astype(np.float16)
    wide = np.zeros((20, Hkv, 2 * L), np.float16)
    wide[..., ::2] = v_new.astype(np.float16)
    k_pool = np.zeros((3, bs, Hkv, L), np.float32)
    v_pool = np.zeros((3, bs, Hkv, L), np.float32)
    before = copies()
    headsum.paged_kv_write(k16, wide[..., ::2], k_pool, v_pool, table, q_offsets, kv_lens)
    assert copies()[0] - before[0] == 1  # v_new's last dim is strided: one float32 staging
    assert np.array_equal(k_pool[blocks, slots], k16.astype(np.float32))
    assert np.array_equal(v_pool[blocks, slots], v_new.astype(np.float16).astype(np.float32))


# --- out=, strides, staging ------------------------------------------------------


def test_out_and_views(rng):
    p = make(rng, "chunked prefill and decode, L=17")
    T, H, L = p.q.shape
    ref, bound = p.reference()
    # out= a view with a padded last dim: written in place, returned.
    big = np.full((T, H, L + 6), 5.0, np.float32)
    out = big[..., 2 : 2 + L]
    before = copies()
    got = headsum.attention_paged(p.q, p.k_pool, p.v_pool, *p.index(), out=out)
    assert got is out and copies() == before
    assert_within(out, ref, bound, "out= a view")
    assert (big[..., :2] == 5.0).all() and (big[..., 2 + L :] == 5.0).all()
    # A float16 out for a float32 q: rounded once.
    out16 = np.zeros((T, H, L), np.float16)
    assert headsum.attention_paged(p.q, p.k_pool, p.v_pool, *p.index(), out=out16) is out16
    assert_within(out16, ref, bound, "float16 out=")
    # q with a strided head dim and token dim (read in place), and one whose
    # last dim is not contiguous (staged once); out likewise.
    qbig = np.zeros((T, 2 * H, L + 3), np.float32)
    qbig[:, ::2, :L] = p.q
    before = copies()
    assert_within(p.attend(q=qbig[:, ::2, :L]), ref, bound, "strided q")
    assert copies() == before
    qs = np.zeros((T, H, 2 * L), np.float32)
    qs[..., ::2] = p.q
    outs = np.zeros((T, H, 2 * L), np.float32)
    before = copies()
    got = headsum.attention_paged(qs[..., ::2], p.k_pool, p.v_pool, *p.index(), out=outs[..., ::2])
    assert copies()[0] - before[0] == 2  # q staged, out staged
    assert_within(outs[..., ::2], ref, bound, "staged q and out")
    assert (outs[..., 1::2] == 0).all()


def test_index_arrays_of_any_integer_dtype(rng):
    p = make(rng, "mixed, block 64, MQA, head-major, shared")
    o = p.attend()
    for conv in (lambda a: a.astype(np.int64), lambda a: a.astype(np.int16), lambda a: a.tolist(),
                 lambda a: np.asfortranarray(a)):
        got = headsum.attention_paged(p.q, p.k_pool, p.v_pool, conv(p.block_table),
                                      conv(p.q_offsets.astype(np.int32)), conv(p.kv_lens))
        assert np.array_equal(got, o)
    got = headsum.attention_paged(p.q, p.k_pool, p.v_pool, p.block_table,
                                  p.q_offsets.astype(np.uint32), p.kv_lens.astype(np.uint16))
    assert np.array_equal(got, o)


# --- errors ------------------------------------------------------------------------


def test_attention_errors_name_the_argument_and_write_nothing(rng):
    p = Paged(rng, 4, 2, 16, 8, [2, 1], [10, 5])
    q, kp, vp = p.q, p.k_pool, p.v_pool
    bt, qo, kl = p.index()
    T = q.shape[0]
    bad = [
        ((q[0], kp, vp, bt, qo, kl), {}, r"q: expected 3 dims \[T\]\[H\]\[L\], got 2 dims"),
        ((q.astype(np.float64), kp, vp, bt, qo, kl), {}, r"q: dtype float64 is not supported"),
        ((q[:2], kp, vp, bt, qo, kl), {}, r"q: expected shape \[T=q_offsets\[B\]=3\]\[H=4\]\[L=16\], got \(2, 4, 16\)"),
        ((q[..., :8], kp, vp, bt, qo, kl), {}, r"k_pool: expected shape \[num_blocks\]\[block_size\]\[Hkv\]\[L=8\]"),
        ((np.zeros((T, 3, 16), np.float32), kp, vp, bt, qo, kl), {}, r"k_pool: .*with Hkv dividing H=3"),
        ((q, kp[0], vp, bt, qo, kl), {}, r"k_pool: expected 4 dims \[num_blocks\]\[block_size\]\[Hkv\]\[L\], got 3 dims"),
        ((q, kp.astype(np.float64), vp, bt, qo, kl), {}, r"k_pool: dtype float64 is not supported"),
        ((q, kp, vp.astype(np.float16), bt, qo, kl), {}, r"v_pool: dtype float16 differs from k_pool's float32"),
        ((q, kp, vp[:-1], bt, qo, kl), {}, r"v_pool: expected the shape of k_pool"),
        ((q, kp, np.ascontiguousarray(vp.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3), bt, qo, kl), {},
         r"v_pool: strides \(in elements\) .* differ from k_pool's"),
        ((q, np.repeat(kp, 2, axis=3)[..., ::2], vp, bt, qo, kl), {}, r"k_pool: pools are read and written in place, never copied: the last dim \(L\) must be contiguous"),
        ((q, kp, vp, "abc", qo, kl), {}, r"block_table: expected a NumPy array"),
        ((q, kp, vp, bt.astype(np.float32), qo, kl), {}, r"block_table: dtype float32 is not supported; expected int32"),
        ((q, kp, vp, bt[0], qo, kl), {}, r"block_table: expected 2 dims \[B=2\]\[blocks_per_seq\]"),
        ((q, kp, vp, bt[:1], qo, kl), {}, r"block_table: expected shape \[B=2\]\[blocks_per_seq\] with blocks_per_seq >= 1, got \(1, 3\)"),
        ((q, kp, vp, bt[:, :0], qo, kl), {}, r"block_table: expected shape .* got \(2, 0\)"),
        ((q, kp, vp, np.where(bt == bt[1, 0], 99, bt), qo, kl), {}, r"block_table\[1\]\[0\] = 99 is outside \[0, num_blocks = 6\)"),
        ((q, kp, vp, np.where(bt == bt[1, 0], -1, bt), qo, kl), {}, r"block_table\[1\]\[0\] = -1 is outside"),
        ((q, kp, vp, bt.astype(np.int64) + 2**40, qo, kl), {}, r"block_table: entry \[0\]\[0\] = \d+ does not fit int32"),
        ((q, kp, vp, bt, qo[:2], kl), {}, r"q_offsets: expected shape \[B\+1=3\] \(B=2 from kv_lens\), got \(2,\)"),
        ((q, kp, vp, bt, qo.astype(np.float64), kl), {}, r"q_offsets: dtype float64 is not supported; expected int64"),
        ((q, kp, vp, bt, [1, 2, 3], kl), {}, r"q_offsets\[0\] = 1 must be 0"),
        ((q[:3], kp, vp, bt, [0, 4, 3], [10, 5]), {}, r"q_offsets\[2\] = 3 is below q_offsets\[1\] = 4"),
        ((q, kp, vp, bt, [0, 2, -1], [10, 5]), {}, r"q_offsets\[2\] = -1 is below q_offsets\[1\] = 2"),
        ((q, kp, vp, bt, [3, 3, 3], [10, 5]), {}, r"q_offsets\[0\] = 3 must be 0"),
        ((q, kp, vp, bt, qo, kl[:0]), {}, r"kv_lens: expected shape \[B\] with B >= 1"),
        ((q, kp, vp, bt, qo, []), {}, r"kv_lens: expected shape \[B\] with B >= 1"),
        ((q, kp, vp, bt, qo, [10.0, 5.0]), {}, r"kv_lens: dtype float64 is not supported; expected int64"),
        ((q, kp, vp, bt, qo, [10, -1]), {}, r"kv_lens\[1\] = -1 must be >= 0"),
        ((q, kp, vp, bt, qo, [1, 5]), {}, r"sequence 0 has 2 query rows .* kv_lens\[0\] = 1 keys"),
        ((q, kp, vp, bt, qo, [10, 25]), {}, r"kv_lens\[1\] = 25 keys do not fit blocks_per_seq = 3 blocks of block_size = 8"),
        ((q, kp, vp, bt, qo, [[10, 5]]), {}, r"kv_lens: expected 1 dims \[B\]"),
        ((q, kp, vp, bt, qo, kl), {"window": -1}, r"window: must be >= 0"),
        ((q, kp, vp, bt, qo, kl), {"softcap": float("nan")}, r"softcap: must be finite and >= 0"),
        ((q, kp, vp, bt, qo, kl), {"alibi_slopes": [1.0, 2.0]}, r"alibi_slopes: expected shape \[H=4\]"),
        ((q, kp, vp, bt, qo, kl), {"sinks": [0.0, float("nan"), 0.0, 0.0]}, r"options->sinks\[1\] = nan must be finite"),
        ((q, kp, vp, bt, qo, kl), {"scale": 0.0}, r"scale: must not be 0"),
        ((q, kp, vp, bt, qo, kl), {"scale": float("inf")}, r"shape->scale = inf is not finite"),
        ((q, kp, vp, bt, qo, kl), {"out": np.zeros((T, 4, 15), np.float32)}, r"out: expected shape \[T\]\[H\]\[L\] = \(3, 4, 16\), got \(3, 4, 15\)"),
        ((q, kp, vp, bt, qo, kl), {"out": np.zeros((T, 4, 16), np.float64)}, r"out: dtype float64 is not supported"),
        ((q, kp, vp, bt, qo, kl), {"out": np.broadcast_to(np.float32(0), (T, 4, 16))}, r"out: the array is read-only"),
        ((q, kp, vp, bt, qo, kl), {"out": q}, r"out: its memory overlaps q's"),
    ]
    keep = [snapshot(a) for a in (q, kp, vp)]
    for args, kwargs, pattern in bad:
        kwargs = dict(kwargs)
        out = kwargs.pop("out", None)
        if out is None:
            out = np.full((T, 4, 16), 3.0, np.float32)
        target = None if out is q else out
        saved = None if target is None else target.copy()
        with pytest.raises(ValueError, match=pattern):
            headsum.attention_paged(*args, out=out, **kwargs)
        if target is not None and target.flags.writeable:
            assert np.array_equal(target, saved), f"{pattern}: out was written"
        for a, before in zip((q, kp, vp), keep):
            assert unchanged(a, before), f"{pattern}: an input changed"
    # out overlapping a pool.
    buf = np.zeros(kp.size + T * 4 * 16, np.float32)
    pool = buf[: kp.size].reshape(kp.shape)
    pool[...] = kp
    out = buf[kp.size - 16 : kp.size - 16 + T * 64].reshape(T, 4, 16)
    keep_buf = buf.copy()
    with pytest.raises(ValueError, match=r"out: its memory overlaps k_pool's"):
        headsum.attention_paged(q, pool, vp, bt, qo, kl, out=out)
    assert np.array_equal(buf, keep_buf)
    # Not an array; keywords only after the index arrays.
    with pytest.raises(ValueError, match=r"k_pool: expected a NumPy array or a DLPack tensor"):
        headsum.attention_paged(q, "pool", vp, bt, qo, kl)
    with pytest.raises(TypeError):
        headsum.attention_paged(q, kp, vp, bt, qo, kl, True)


def test_write_errors_name_the_argument_and_write_nothing(rng):
    p = Paged(rng, 4, 2, 16, 8, [2, 1], [10, 5])
    kp, vp = p.k_pool, p.v_pool
    bt, qo, kl = p.index()
    kn = rng.standard_normal((3, 2, 16)).astype(np.float32)
    vn = rng.standard_normal((3, 2, 16)).astype(np.float32)
    ro = kp.copy()
    ro.flags.writeable = False
    shared = bt.copy()
    shared[1, 0] = bt[0, 1]  # sequence 1's position 4 is sequence 0's position 12: slot 4 of one block
    bad = [
        ((kn[0], vn, kp, vp, bt, qo, kl), r"k_new: expected 3 dims \[T\]\[Hkv\]\[L\]"),
        ((kn, vn.astype(np.float64), kp, vp, bt, qo, kl), r"v_new: dtype float64 is not supported"),
        ((kn[:2], vn, kp, vp, bt, qo, kl), r"k_new: expected shape \[T=q_offsets\[B\]=3\]\[Hkv=2\]\[L=16\], got \(2, 2, 16\)"),
        ((kn, np.zeros((3, 4, 16), np.float32), kp, vp, bt, qo, kl), r"v_new: expected shape \[T=q_offsets\[B\]=3\]\[Hkv=2\]\[L=16\], got \(3, 4, 16\)"),
        ((kn, vn, ro, vp, bt, qo, kl), r"k_pool: the array is read-only; paged_kv_write writes the new rows into the caller's pools in place"),
        ((kn, vn, kp, np.repeat(vp, 2, axis=3)[..., ::2], bt, qo, kl), r"v_pool: pools are read and written in place, never copied"),
        ((kn, vn, kp, vp[..., ::-1], bt, qo, kl), r"v_pool: pools are read and written in place"),
        ((kn, vn, kp, kp, bt, qo, kl), r"v_pool: its memory meets k_pool's"),
        ((kn, vn, kp, vp.astype(np.float16), bt, qo, kl), r"v_pool: dtype float16 differs from k_pool's float32"),
        ((kn[:2], vn[:2], kp, vp, shared, [0, 1, 2], [13, 5]), r"new rows 0 and 1 would both be written to slot 4 of block"),
        ((kn, vn, kp, vp, np.where(bt == bt[0, 1], 50, bt), qo, kl), r"block_table\[0\]\[1\] = 50 is outside"),
        ((kn, vn, kp, vp, bt, qo, [1, 5]), r"sequence 0 has 2 query rows"),
        ((kn, vn, kp, vp, bt, [0, 3, 1], kl), r"q_offsets\[2\] = 1 is below q_offsets\[1\] = 3"),
        ((kn, vn, kp, vp, bt, [0, 2], kl), r"q_offsets: expected shape \[B\+1=3\]"),
        ((kn, vn, kp, vp, bt, qo, [10, 99]), r"kv_lens\[1\] = 99 keys do not fit"),
        ((kn, vn, kp, vp, bt.astype(bool), qo, kl), r"block_table: dtype bool is not supported"),
        ((kn, vn, kp, np.lib.stride_tricks.as_strided(vp, strides=(0,) + vp.strides[1:]), bt, qo, kl),
         r"v_pool: strides \(in elements\) .* differ|two indices of the array reach the same element"),
    ]
    keep = [snapshot(a) for a in (kp, vp, kn, vn)]
    for args, pattern in bad:
        with pytest.raises(ValueError, match=pattern):
            headsum.paged_kv_write(*args)
        for a, before in zip((kp, vp, kn, vn), keep):
            assert unchanged(a, before), f"{pattern}: an array changed"
    # New rows inside a pool: refused by name.
    with pytest.raises(ValueError, match=r"k_pool: its memory overlaps v_new's"):
        headsum.paged_kv_write(kn, kp[0, :3], kp, vp, bt, qo, kl)
    # Self-overlapping writeable pools (two slots on one element).
    both = np.zeros((16, 16, 2, 16), np.float32)
    alias = np.lib.stride_tricks.as_strided(both, shape=(6, 8, 2, 16), strides=(4 * 16 * 2 * 16, 4 * 16, 4 * 32, 4))
    alias_v = np.lib.stride_tricks.as_strided(both[8:], shape=(6, 8, 2, 16), strides=alias.strides)
    with pytest.raises(ValueError, match=r"k_pool: two indices of the array reach the same element"):
        headsum.paged_kv_write(kn, vn, alias, alias_v, bt, qo, kl)
    assert (both == 0).all()
    assert headsum.paged_kv_write(kn, vn, kp, vp, bt, qo, kl) is None


# --- DLPack (torch) ---------------------------------------------------------


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_torch_tensors(rng, dtype_name):
    torch = torch_or_skip()
    dtype = getattr(torch, dtype_name)
    p = make(rng, "chunked prefill and decode, L=17")
    q = torch.from_numpy(p.q).to(dtype)
    kp = torch.from_numpy(np.ascontiguousarray(p.k_pool)).to(dtype)
    vp = torch.from_numpy(np.ascontiguousarray(p.v_pool)).to(dtype)
    bt = torch.from_numpy(p.block_table)
    qo, kl = torch.from_numpy(p.q_offsets), torch.from_numpy(p.kv_lens)
    before = copies()
    o = headsum.attention_paged(q, kp, vp, bt, qo, kl)
    assert copies() == before
    assert isinstance(o, torch.Tensor) and o.dtype == dtype
    p.q, p.k_pool, p.v_pool = (x.to(torch.float32).numpy() for x in (q, kp, vp))
    ref, bound = p.reference()
    assert_within(o, ref, bound, f"torch {dtype_name}")
    # paged_kv_write into torch pools, in place.
    kn = torch.zeros((int(p.q_offsets[-1]), p.Hkv, p.L), dtype=torch.float32) + 0.5
    headsum.paged_kv_write(kn, kn, kp, vp, bt, qo, kl)
    b, t = 0, int(p.kv_lens[0]) - 1
    assert (kp[p.block_table[b, t // p.bs], t % p.bs] == 0.5).all()


# --- the GIL ---------------------------------------------------------------------


def test_gil_released_during_the_paged_call():
    """As test_settings' check: a long paged call in a thread leaves the main
    thread running."""
    headsum.set_num_threads(1)
    rng = np.random.default_rng(7)
    p = Paged(rng, 8, 8, 64, 16, [1024, 1024], [4096, 4096], shuffle=True)
    assert_releases_gil(lambda: p.attend(causal=False))
