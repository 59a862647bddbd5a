// headsum's Python binding (module headsum._headsum, re-exported by the
// package headsum).  Arrays come in through nanobind's ndarray (NumPy's
// buffer/DLPack export, or any DLPack producer such as PyTorch), are checked
// here (device, dtype, dims, shapes: each message names the argument and the
// shape it expects), and reach the C API without a copy where it can read
// them as they are:
//   * attention and project_heads_sum: the tensor API (headsum_tensor views:
//     float32/float16/bfloat16, any non-negative strides, last dim
//     contiguous); attention's bias likewise, broadcast through zero
//     strides;
//   * the per-head calls, gates and bias, which the C API takes as
//     contiguous float32 only: float32 C-contiguous arrays as they are.
// Anything else (a last dim that is not contiguous, negative strides, a
// 16-bit array for a float32-only call) is staged once into a contiguous
// float32 buffer, and a result that cannot be written in place is written
// to its out= array afterwards (16-bit: rounded to nearest even once).
// _copy_stats() counts these stagings, so tests can prove that a call made
// none.  Every kernel call, staging included, runs with the GIL released.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/test_hooks.h"  // FailAllocationsAfter: the tests' MemoryError
#include "headsum/headsum.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// ---------------------------------------------------------------------------
// Errors

[[noreturn]] void Raise(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw nb::python_error();
}

[[noreturn]] void Invalid(const std::string& message) { Raise(PyExc_ValueError, message); }

// Maps a failed C call to its Python exception with headsum_last_error()
// (thread-local: read on the thread that made the call).
void Check(headsum_status status) {
  if (status == HEADSUM_OK) return;
  std::string message = headsum_last_error();
  switch (status) {
    case HEADSUM_ERR_INVALID_ARGUMENT:
      Raise(PyExc_ValueError, message);
    case HEADSUM_ERR_UNSUPPORTED:
      Raise(PyExc_RuntimeError, message);
    case HEADSUM_ERR_OUT_OF_MEMORY:
      Raise(PyExc_MemoryError, message);
    default:
      Raise(PyExc_RuntimeError, message.empty() ? "headsum: internal error" : message);
  }
}

std::atomic<int64_t> g_copies{0};
std::atomic<int64_t> g_copied_bytes{0};

// ---------------------------------------------------------------------------
// 16-bit floats, converted bit-exactly (no dependence on compiler flags).

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    const float magnitude = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return FromBits(Bits(magnitude) | sign);
  }
  if (exp == 31) return FromBits(sign | 0x7f800000u | (mant << 13));  // inf, NaN
  return FromBits(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Round to nearest even; beyond f16's range gives inf; NaN stays NaN.
uint16_t FloatToHalf(float f) {
  const uint32_t x = Bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or NaN (quiet, top payload bits kept)
    return ax == 0x7f800000u ? (sign | 0x7c00u)
                             : static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x1ffu));
  }
  if (ax >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf
  if (ax < 0x38800000u) {  // below 2^-14: a subnormal half (or zero)
    // f * 2^24 is exact and < 2^10; rint rounds to nearest even.
    const float scaled = FromBits(ax) * 16777216.0f;
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::rint(scaled)));
  }
  ax += 0xfffu + ((ax >> 13) & 1u);  // round to nearest even at bit 13
  return static_cast<uint16_t>(sign | ((ax - (112u << 23)) >> 13));
}

float BfloatToFloat(uint16_t b) { return FromBits(static_cast<uint32_t>(b) << 16); }

uint16_t FloatToBfloat(float f) {
  const uint32_t x = Bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// ---------------------------------------------------------------------------
// Arrays

const char* DtypeName(headsum_dtype dtype) {
  switch (dtype) {
    case HEADSUM_F32:
      return "float32";
    case HEADSUM_F16:
      return "float16";
    case HEADSUM_BF16:
      return "bfloat16";
  }
  return "?";
}

size_t ItemSize(headsum_dtype dtype) { return dtype == HEADSUM_F32 ? 4 : 2; }

std::string DlpackDtypeName(nb::dlpack::dtype dt) {
  const char* kind = "code?";
  switch (static_cast<nb::dlpack::dtype_code>(dt.code)) {
    case nb::dlpack::dtype_code::Int:
      kind = "int";
      break;
    case nb::dlpack::dtype_code::UInt:
      kind = "uint";
      break;
    case nb::dlpack::dtype_code::Float:
      kind = "float";
      break;
    case nb::dlpack::dtype_code::Bfloat:
      kind = "bfloat";
      break;
    case nb::dlpack::dtype_code::Complex:
      kind = "complex";
      break;
    case nb::dlpack::dtype_code::Bool:
      return "bool";
    default:
      break;
  }
  std::string name = kind + std::to_string(dt.bits);
  if (dt.lanes != 1) name += "x" + std::to_string(dt.lanes);
  return name;
}

std::string ShapeString(const int64_t* shape, int ndim) {
  std::string s = "(";
  for (int i = 0; i < ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (ndim == 1) s += ",";
  return s + ")";
}

// A checked array: its dtype, dims and element strides, and the reference
// that keeps its memory alive.  Raw fields only are used with the GIL
// released; `nd` is copied or dropped only while it is held.
struct Array {
  nb::ndarray<nb::ro> nd;
  const char* name = "";
  headsum_dtype dtype = HEADSUM_F32;
  int ndim = 0;
  int64_t shape[4] = {1, 1, 1, 1};
  int64_t strides[4] = {0, 0, 0, 0};  // in elements; 0 where the extent is 1
  char* data = nullptr;               // the element at index 0
  bool torch = false;

  bool present() const { return nd.is_valid(); }
  size_t itemsize() const { return ItemSize(dtype); }
  int64_t size() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  int64_t dim(int i) const { return shape[i]; }
  std::string shape_str() const { return ShapeString(shape, ndim); }
  bool aligned() const { return reinterpret_cast<uintptr_t>(data) % itemsize() == 0; }
  bool c_contiguous() const {
    int64_t expected = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      if (shape[i] != 1 && strides[i] != expected) return false;
      expected *= shape[i];
    }
    return aligned();
  }
  // What the tensor API reads as it is: last dim contiguous, strides >= 0.
  bool viewable() const {
    if (!aligned()) return false;
    for (int i = 0; i < ndim; ++i) {
      if (strides[i] < 0) return false;
    }
    return ndim == 0 || strides[ndim - 1] == 1 || shape[ndim - 1] == 1;
  }
  // Lowest and highest byte the array reaches.
  void byte_range(uintptr_t* lo, uintptr_t* hi) const {
    int64_t lo_off = 0, hi_off = 0;
    for (int i = 0; i < ndim; ++i) {
      const int64_t reach = strides[i] * (shape[i] - 1);
      (reach < 0 ? lo_off : hi_off) += reach;
    }
    const auto base = reinterpret_cast<uintptr_t>(data);
    *lo = base + lo_off * static_cast<int64_t>(itemsize());
    *hi = base + hi_off * static_cast<int64_t>(itemsize()) + itemsize() - 1;
  }
};

PyObject* TorchTensorType() {
  static PyObject* tensor_type = nullptr;  // kept for the process' life
  if (tensor_type) return tensor_type;
  PyObject* torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");
  if (!torch) return nullptr;  // not imported: nothing can be a torch tensor
  PyObject* type = PyObject_GetAttrString(torch, "Tensor");
  if (!type) {
    PyErr_Clear();
    return nullptr;
  }
  tensor_type = type;
  return tensor_type;
}

bool IsTorch(nb::handle h) {
  PyObject* type = TorchTensorType();
  if (!type) return false;
  const int r = PyObject_IsInstance(h.ptr(), type);
  if (r < 0) PyErr_Clear();
  return r == 1;
}

[[noreturn]] void NotAnArray(nb::handle h, const char* name) {
  std::string got = nb::type_name(h.type()).c_str();
  if (nb::hasattr(h, "dtype")) {
    got += " of dtype " + std::string(nb::str(h.attr("dtype")).c_str());
  }
  std::string message = std::string(name) +
                        ": expected a NumPy array or a DLPack tensor (float32, float16 or "
                        "bfloat16, on the CPU), got " +
                        got;
  Invalid(message);
}

PyObject* Cached(const char* module, const char* attr);

// A torch tensor through torch.utils.dlpack.to_dlpack (one C call, ~0.5 us)
// rather than Tensor.__dlpack__ (Python-level checks, ~4 us a tensor): the
// binding's call overhead on torch tensors.  False (nothing raised) when
// torch refuses; the caller then takes the generic path.
bool TorchCapsule(nb::handle h, nb::ndarray<nb::ro>& nd) {
  static PyObject* to_dlpack = Cached("torch.utils.dlpack", "to_dlpack");
  PyObject* capsule = PyObject_CallOneArg(to_dlpack, h.ptr());
  if (!capsule) {
    PyErr_Clear();
    return false;
  }
  return nb::try_cast(nb::steal(capsule), nd, false);
}

// Imports `h` as an array of min_ndim..max_ndim dims; `layout` names the
// expected dims in messages ("[B][H][Sq][L]").
// `writable`: the call writes into the array (a read-only one is refused
// with `why`).
Array Import(nb::handle h, const char* name, int min_ndim, int max_ndim, const char* layout,
             bool writable = false, const char* why = "a result needs a writeable array") {
  Array a;
  a.name = name;
  a.torch = IsTorch(h);
  if (a.torch && TorchCapsule(h, a.nd)) {
    // Imported (torch tensors are writeable).
  } else if (writable) {
    nb::ndarray<> w;
    if (!nb::try_cast(h, w, false)) {
      nb::ndarray<nb::ro> r;
      if (nb::try_cast(h, r, false)) {
        Invalid(std::string(name) + ": the array is read-only; " + why);
      }
      NotAnArray(h, name);
    }
    a.nd = nb::ndarray<nb::ro>(w);
  } else if (!nb::try_cast(h, a.nd, false)) {
    NotAnArray(h, name);
  }
  if (a.nd.device_type() != nb::device::cpu::value) {
    Invalid(std::string(name) + ": the array is on device type " +
            std::to_string(a.nd.device_type()) + "; headsum runs on the CPU");
  }
  const nb::dlpack::dtype dt = a.nd.dtype();
  const bool one_lane = dt.lanes == 1;
  if (one_lane && dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) && dt.bits == 32) {
    a.dtype = HEADSUM_F32;
  } else if (one_lane && dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) &&
             dt.bits == 16) {
    a.dtype = HEADSUM_F16;
  } else if (one_lane && dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) &&
             dt.bits == 16) {
    a.dtype = HEADSUM_BF16;
  } else {
    Invalid(std::string(name) + ": dtype " + DlpackDtypeName(dt) +
            " is not supported; expected float32, float16 or bfloat16");
  }
  const int ndim = static_cast<int>(a.nd.ndim());
  if (ndim < min_ndim || ndim > max_ndim) {
    std::string dims = min_ndim == max_ndim
                           ? std::to_string(min_ndim)
                           : std::to_string(min_ndim) + (max_ndim == min_ndim + 1 ? " or " : " to ") +
                                 std::to_string(max_ndim);
    Invalid(std::string(name) + ": expected " + dims + " dims " + layout + ", got " +
            std::to_string(ndim) + " dims with shape " +
            ShapeString(a.nd.shape_ptr(), ndim));
  }
  a.ndim = ndim;
  for (int i = 0; i < ndim; ++i) {
    a.shape[i] = a.nd.shape_ptr()[i];
    a.strides[i] = a.shape[i] == 1 ? 0 : a.nd.stride_ptr()[i];
  }
  a.data = static_cast<char*>(const_cast<void*>(static_cast<const void*>(a.nd.data())));
  return a;
}

std::optional<Array> ImportOptional(nb::handle h, const char* name, int min_ndim, int max_ndim,
                                    const char* layout) {
  if (h.is_none()) return std::nullopt;
  return Import(h, name, min_ndim, max_ndim, layout);
}

// out= must not alias itself (two indices on one element) or any input.
void CheckOutput(const Array& out, std::initializer_list<const Array*> inputs) {
  // Dims by increasing stride; each must step past everything the smaller
  // ones reach (sufficient for no self-overlap; layouts that interleave
  // dims are refused too).
  std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, extent)
  for (int i = 0; i < out.ndim; ++i) {
    if (out.shape[i] > 1) dims.emplace_back(std::llabs(out.strides[i]), out.shape[i]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t reach = 1;
  for (const auto& [stride, extent] : dims) {
    if (stride < reach) {
      Invalid(std::string(out.name) +
              ": two indices of the array reach the same element (strides in elements " +
              ShapeString(out.strides, out.ndim) + ", shape " + out.shape_str() + ")");
    }
    reach = stride * (extent - 1) + reach;
  }
  if (out.size() == 0) return;
  uintptr_t out_lo, out_hi;
  out.byte_range(&out_lo, &out_hi);
  for (const Array* in : inputs) {
    if (!in || !in->present() || in->size() == 0) continue;
    uintptr_t lo, hi;
    in->byte_range(&lo, &hi);
    if (lo <= out_hi && out_lo <= hi) {
      Invalid(std::string(out.name) + ": its memory overlaps " + in->name +
              "'s; write the result to a separate array");
    }
  }
}

float Load(const char* p, headsum_dtype dtype) {
  if (dtype == HEADSUM_F32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return dtype == HEADSUM_F16 ? HalfToFloat(h) : BfloatToFloat(h);
}

void Store(char* p, headsum_dtype dtype, float f) {
  if (dtype == HEADSUM_F32) {
    std::memcpy(p, &f, 4);
    return;
  }
  const uint16_t h = dtype == HEADSUM_F16 ? FloatToHalf(f) : FloatToBfloat(f);
  std::memcpy(p, &h, 2);
}

// Visits every row (last dim) of `a` in row-major order: f(row pointer,
// row index).
template <class F>
void ForEachRow(const Array& a, const F& f) {
  int64_t n[4] = {1, 1, 1, 1}, s[4] = {0, 0, 0, 0};
  const int pad = 4 - a.ndim;
  for (int i = 0; i < a.ndim; ++i) {
    n[pad + i] = a.shape[i];
    s[pad + i] = a.strides[i];
  }
  const int64_t item = static_cast<int64_t>(a.itemsize());
  int64_t row = 0;
  for (int64_t i0 = 0; i0 < n[0]; ++i0) {
    for (int64_t i1 = 0; i1 < n[1]; ++i1) {
      for (int64_t i2 = 0; i2 < n[2]; ++i2, ++row) {
        f(a.data + (i0 * s[0] + i1 * s[1] + i2 * s[2]) * item, row);
      }
    }
  }
}

// `a` as contiguous float32: its own memory when it is that already, else
// one converted copy in `buffer`.  Runs without the GIL.
const float* StageF32(const Array& a, std::vector<float>& buffer) {
  if (a.dtype == HEADSUM_F32 && a.c_contiguous()) return reinterpret_cast<const float*>(a.data);
  const int64_t cols = a.ndim ? a.shape[a.ndim - 1] : 1;
  const int64_t step = (a.ndim ? a.strides[a.ndim - 1] : 0) * static_cast<int64_t>(a.itemsize());
  buffer.resize(static_cast<size_t>(a.size()));
  float* dst = buffer.data();
  ForEachRow(a, [&](const char* src, int64_t row) {
    float* out = dst + row * cols;
    for (int64_t c = 0; c < cols; ++c) out[c] = Load(src + c * step, a.dtype);
  });
  g_copies.fetch_add(1, std::memory_order_relaxed);
  g_copied_bytes.fetch_add(a.size() * 4, std::memory_order_relaxed);
  return dst;
}

// Where a float32 result for `out` is written: `out` itself when it is
// contiguous float32, else `buffer` (then Unstage writes it to `out`).
float* OutputF32(const Array& out, std::vector<float>& buffer) {
  if (out.dtype == HEADSUM_F32 && out.c_contiguous()) return reinterpret_cast<float*>(out.data);
  buffer.resize(static_cast<size_t>(out.size()));
  g_copies.fetch_add(1, std::memory_order_relaxed);
  g_copied_bytes.fetch_add(out.size() * 4, std::memory_order_relaxed);
  return buffer.data();
}

void Unstage(const float* result, const Array& out) {
  if (result == reinterpret_cast<const float*>(out.data)) return;
  const int64_t cols = out.ndim ? out.shape[out.ndim - 1] : 1;
  const int64_t step =
      (out.ndim ? out.strides[out.ndim - 1] : 0) * static_cast<int64_t>(out.itemsize());
  ForEachRow(out, [&](const char* dst, int64_t row) {
    const float* src = result + row * cols;
    for (int64_t c = 0; c < cols; ++c) {
      Store(const_cast<char*>(dst) + c * step, out.dtype, src[c]);
    }
  });
}

// ---------------------------------------------------------------------------
// Results: new NumPy arrays (or torch tensors for torch inputs), or out=.

PyObject* Cached(const char* module, const char* attr) {
  PyObject* m = PyImport_ImportModule(module);
  if (!m) throw nb::python_error();
  PyObject* a = PyObject_GetAttrString(m, attr);
  Py_DECREF(m);
  if (!a) throw nb::python_error();
  return a;  // a new reference, kept for the process' life
}

nb::object NewArray(bool torch, headsum_dtype dtype, const std::vector<int64_t>& shape) {
  nb::tuple dims = nb::steal<nb::tuple>(PyTuple_New(static_cast<Py_ssize_t>(shape.size())));
  for (size_t i = 0; i < shape.size(); ++i) {
    PyTuple_SET_ITEM(dims.ptr(), i, PyLong_FromLongLong(shape[i]));
  }
  if (torch) {
    static PyObject* empty = Cached("torch", "empty");
    static PyObject* f32 = Cached("torch", "float32");
    static PyObject* f16 = Cached("torch", "float16");
    static PyObject* bf16 = Cached("torch", "bfloat16");
    PyObject* dt = dtype == HEADSUM_F32 ? f32 : dtype == HEADSUM_F16 ? f16 : bf16;
    return nb::handle(empty)(dims, "dtype"_a = nb::handle(dt));
  }
  static PyObject* empty = Cached("numpy", "empty");
  static PyObject* f32 = Cached("numpy", "float32");
  static PyObject* f16 = Cached("numpy", "float16");
  // NumPy has no bfloat16: such results are float32.
  PyObject* dt = dtype == HEADSUM_F16 ? f16 : f32;
  return nb::handle(empty)(dims, nb::handle(dt));
}

struct Output {
  nb::object object;  // what the call returns
  Array array;
};

// out= checked against `shape`, or a new array of `shape` and `dtype` in
// the framework of the call's first array.
Output MakeOutput(nb::handle out, const Array& like, headsum_dtype dtype,
                  const std::vector<int64_t>& shape, const char* layout,
                  std::initializer_list<const Array*> inputs) {
  Output o;
  const int ndim = static_cast<int>(shape.size());
  if (out.is_none()) {
    o.object = NewArray(like.torch, dtype, shape);
    o.array = Import(o.object, "out", ndim, ndim, layout, true);
    return o;
  }
  o.array = Import(out, "out", ndim, ndim, layout, true);
  if (!std::equal(shape.begin(), shape.end(), o.array.shape)) {
    Invalid(std::string("out: expected shape ") + layout + " = " +
            ShapeString(shape.data(), ndim) + ", got " + o.array.shape_str());
  }
  CheckOutput(o.array, inputs);
  o.object = nb::borrow(out);
  return o;
}

headsum_dtype ResultDtype(const Array& like) {
  return like.dtype == HEADSUM_BF16 && !like.torch ? HEADSUM_F32 : like.dtype;
}

headsum_tensor View(const Array& a, int64_t s0, int64_t s1, int64_t s2) {
  headsum_tensor t;
  t.data = a.data;
  t.dtype = a.dtype;
  t.strides[0] = s0;
  t.strides[1] = s1;
  t.strides[2] = s2;
  return t;
}
headsum_tensor View4(const Array& a) { return View(a, a.strides[0], a.strides[1], a.strides[2]); }

std::string Dim(const char* name, int64_t value) { return std::string(name) + "=" + std::to_string(value); }

// ---------------------------------------------------------------------------
// What a model adds to the scores (headsum_attn_options)

// A per-head vector [H] (ALiBi slopes, sinks): an array of any float dtype
// or a sequence of numbers (made a float32 array here); None: absent.
std::optional<Array> ImportPerHead(nb::handle h, const char* name, int64_t heads) {
  if (h.is_none()) return std::nullopt;
  nb::object held = nb::borrow(h);
  if (PyList_Check(h.ptr()) || PyTuple_Check(h.ptr())) {
    static PyObject* asarray = Cached("numpy", "asarray");
    static PyObject* f32 = Cached("numpy", "float32");
    held = nb::handle(asarray)(h, nb::handle(f32));
  }
  const std::string layout = "[H=" + std::to_string(heads) + "]";
  Array a = Import(held, name, 1, 1, layout.c_str());
  if (a.dim(0) != heads) {
    Invalid(std::string(name) + ": expected shape " + layout + " = (" + std::to_string(heads) +
            ",), one value per query head, got " + a.shape_str());
  }
  return a;
}

// The keyword options of attention and MHA, checked, with what the C call
// reads: slopes and sinks staged to float32 (when they are not already),
// the bias as a view that broadcasts through zero strides.
struct Options {
  int64_t window = 0;
  float softcap = 0.0f;
  std::optional<Array> slopes, sinks, bias;
  // Filled by Resolve (without the GIL): what headsum_attn_options points at.
  std::vector<float> slope_buffer, sink_buffer, bias_buffer;
  headsum_tensor bias_view{};
  headsum_attn_options c{};

  bool any() const { return window != 0 || softcap != 0.0f || slopes || sinks || bias; }
  std::vector<const Array*> arrays() const {
    return {slopes ? &*slopes : nullptr, sinks ? &*sinks : nullptr, bias ? &*bias : nullptr};
  }
  // The C options (nullptr when there are none).  Runs without the GIL.
  const headsum_attn_options* Resolve() {
    if (!any()) return nullptr;
    c.window = window;
    c.softcap = softcap;
    c.alibi_slopes = slopes ? StageF32(*slopes, slope_buffer) : nullptr;
    c.sinks = sinks ? StageF32(*sinks, sink_buffer) : nullptr;
    c.bias = nullptr;
    if (bias) {
      // Strides of the [B][H][Sq][Skv] view: the array's trailing dims line
      // up with it; a missing or size-1 dim broadcasts (stride 0, as
      // Import leaves extent-1 strides).
      const Array& a = *bias;
      int64_t st[4] = {0, 0, 0, 0};
      void* data = a.data;
      headsum_dtype dtype = a.dtype;
      if (a.viewable()) {
        for (int i = 0; i < a.ndim; ++i) st[4 - a.ndim + i] = a.strides[i];
      } else {  // j not contiguous, or a negative stride: one float32 copy
        data = const_cast<float*>(StageF32(a, bias_buffer));
        dtype = HEADSUM_F32;
        int64_t stride = 1;
        for (int i = a.ndim - 1; i >= 0; --i) {
          st[4 - a.ndim + i] = a.shape[i] == 1 ? 0 : stride;
          stride *= a.shape[i];
        }
      }
      bias_view.data = data;
      bias_view.dtype = dtype;
      bias_view.strides[0] = st[0];
      bias_view.strides[1] = st[1];
      bias_view.strides[2] = st[2];
      c.bias = &bias_view;
    }
    return &c;
  }
};

// window, softcap, alibi_slopes and sinks of a call over `heads` query heads.
Options ImportOptions(int64_t window, double softcap, nb::handle slopes, nb::handle sinks,
                      int64_t heads) {
  Options o;
  if (window < 0) {
    Invalid("window: must be >= 0 (0: no window), got " + std::to_string(window));
  }
  if (!(softcap >= 0.0) || !std::isfinite(softcap)) {
    Invalid("softcap: must be finite and >= 0 (0: no softcap), got " + std::to_string(softcap));
  }
  o.window = window;
  o.softcap = static_cast<float>(softcap);  // past float's range: the C API says so
  o.slopes = ImportPerHead(slopes, "alibi_slopes", heads);
  o.sinks = ImportPerHead(sinks, "sinks", heads);
  return o;
}

// bias broadcastable to [B][H][Sq][Skv] (NumPy's rules: trailing dims line
// up, a dim of 1 or a missing leading one broadcasts), 2 to 4 dims; its
// last dim must be Skv itself: the kernels read j contiguous.
std::optional<Array> ImportBias(nb::handle h, int64_t B, int64_t H, int64_t Sq, int64_t Skv) {
  if (h.is_none()) return std::nullopt;
  const int64_t target[4] = {B, H, Sq, Skv};
  const std::string layout = "broadcastable to [B][H][Sq][Skv] = " + ShapeString(target, 4);
  Array a = Import(h, "bias", 2, 4, layout.c_str());
  bool fits = a.dim(a.ndim - 1) == Skv;
  for (int i = 0; i + 1 < a.ndim; ++i) {
    const int64_t want = target[4 - a.ndim + i];
    fits &= a.dim(i) == want || a.dim(i) == 1;
  }
  if (!fits) {
    Invalid("bias: expected a shape " + layout + " with its last dim Skv=" +
            std::to_string(Skv) + " (j is read contiguously, never broadcast), got " +
            a.shape_str());
  }
  return a;
}

// ---------------------------------------------------------------------------
// attention

nb::object Attention(nb::handle q_, nb::handle k_, nb::handle v_, bool causal,
                     std::optional<double> scale, nb::handle out_, int64_t window,
                     double softcap, nb::handle alibi_slopes_, nb::handle sinks_,
                     nb::handle bias_) {
  const Array q = Import(q_, "q", 4, 4, "[B][H][Sq][L]");
  const Array k = Import(k_, "k", 4, 4, "[B][Hkv][Skv][L]");
  const Array v = Import(v_, "v", 4, 4, "[B][Hkv][Skv][L]");
  const int64_t B = q.dim(0), H = q.dim(1), Sq = q.dim(2), L = q.dim(3);
  const int64_t Hkv = k.dim(1), Skv = k.dim(2);
  if (k.dim(0) != B || k.dim(3) != L || Hkv < 1 || H % Hkv != 0) {
    Invalid("k: expected shape [" + Dim("B", B) + "][Hkv][Skv][" + Dim("L", L) +
            "] with Hkv dividing " + Dim("H", H) + ", got " + k.shape_str());
  }
  if (!std::equal(k.shape, k.shape + 4, v.shape)) {
    Invalid("v: expected the shape of k, " + k.shape_str() + ", got " + v.shape_str());
  }
  float scale_f = 0.0f;  // 0: 1/sqrt(L)
  if (scale) {
    if (*scale == 0.0) Invalid("scale: must not be 0 (None means 1/sqrt(L))");
    scale_f = static_cast<float>(*scale);  // not finite: the C API says so
  }
  Options options = ImportOptions(window, softcap, alibi_slopes_, sinks_, H);
  options.bias = ImportBias(bias_, B, H, Sq, Skv);
  const std::vector<const Array*> extra = options.arrays();
  const Output out = MakeOutput(out_, q, ResultDtype(q), {B, H, Sq, L}, "[B][H][Sq][L]",
                                {&q, &k, &v, extra[0], extra[1], extra[2]});
  const Array& o = out.array;
  headsum_attn_shape shape{B, H, Hkv, Sq, Skv, L, scale_f, causal ? 1 : 0};
  headsum_status status;
  if (q.viewable() && k.viewable() && v.viewable() && o.viewable()) {
    const headsum_tensor tq = View4(q), tk = View4(k), tv = View4(v), to = View4(o);
    nb::gil_scoped_release release;
    status = headsum_attention_tensors_ex(&shape, options.Resolve(), &tq, &tk, &tv, &to);
  } else {
    nb::gil_scoped_release release;
    std::vector<float> qb, kb, vb, ob;
    headsum_tensor tq = headsum_bhsd(const_cast<float*>(StageF32(q, qb)), HEADSUM_F32, H, Sq, L);
    headsum_tensor tk = headsum_bhsd(const_cast<float*>(StageF32(k, kb)), HEADSUM_F32, Hkv, Skv, L);
    headsum_tensor tv = headsum_bhsd(const_cast<float*>(StageF32(v, vb)), HEADSUM_F32, Hkv, Skv, L);
    float* op = OutputF32(o, ob);
    headsum_tensor to = headsum_bhsd(op, HEADSUM_F32, H, Sq, L);
    status = headsum_attention_tensors_ex(&shape, options.Resolve(), &tq, &tk, &tv, &to);
    if (status == HEADSUM_OK) Unstage(op, o);
  }
  Check(status);
  return out.object;
}

// ---------------------------------------------------------------------------
// Ragged batches over a paged KV cache (headsum_attention_paged,
// headsum_paged_kv_write)

// An index array (block_table, q_offsets, kv_lens): a NumPy array or DLPack
// tensor of any integer dtype, or a sequence of ints, copied into int64
// values (they are small: B + 1, B, B * blocks_per_seq).
struct Index {
  std::vector<int64_t> values;
  int64_t shape[2] = {0, 0};
  int ndim = 0;
  std::string shape_str() const { return ShapeString(shape, ndim); }
};

template <class T>
T Read(const char* p) {
  T t;
  std::memcpy(&t, p, sizeof(T));
  return t;
}

Index ImportIndex(nb::handle h, const char* name, int ndim, const std::string& layout,
                  const char* dtype) {
  nb::object held = nb::borrow(h);
  if (PyList_Check(h.ptr()) || PyTuple_Check(h.ptr())) {
    static PyObject* asarray = Cached("numpy", "asarray");
    static PyObject* i64 = Cached("numpy", "int64");
    // NumPy's own dtype (ints stay ints, floats are refused below); an
    // empty sequence as int64 rather than NumPy's float64.
    held = PyObject_Length(h.ptr()) == 0 ? nb::handle(asarray)(h, nb::handle(i64))
                                         : nb::handle(asarray)(h);
  }
  nb::ndarray<nb::ro> nd;
  if (!nb::try_cast(held, nd, false)) {
    Invalid(std::string(name) + ": expected a NumPy array, a DLPack tensor or a sequence of " +
            dtype + " values " + layout + ", got " + nb::type_name(h.type()).c_str());
  }
  if (nd.device_type() != nb::device::cpu::value) {
    Invalid(std::string(name) + ": the array is on device type " +
            std::to_string(nd.device_type()) + "; headsum runs on the CPU");
  }
  const nb::dlpack::dtype dt = nd.dtype();
  const bool is_int = dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Int);
  const bool is_uint = dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::UInt);
  if (dt.lanes != 1 || !(is_int || is_uint) ||
      !(dt.bits == 8 || dt.bits == 16 || dt.bits == 32 || dt.bits == 64)) {
    Invalid(std::string(name) + ": dtype " + DlpackDtypeName(dt) + " is not supported; expected " +
            dtype + " (any integer dtype is converted exactly)");
  }
  if (static_cast<int>(nd.ndim()) != ndim) {
    Invalid(std::string(name) + ": expected " + std::to_string(ndim) + " dims " + layout +
            ", got " + std::to_string(nd.ndim()) + " dims with shape " +
            ShapeString(nd.shape_ptr(), static_cast<int>(nd.ndim())));
  }
  Index x;
  x.ndim = ndim;
  int64_t n[2] = {1, 1}, st[2] = {0, 0};
  for (int i = 0; i < ndim; ++i) {
    x.shape[i] = nd.shape_ptr()[i];
    n[2 - ndim + i] = x.shape[i];
    st[2 - ndim + i] = nd.stride_ptr()[i];
  }
  const int64_t item = dt.bits / 8;
  const char* base = static_cast<const char*>(nd.data());
  x.values.reserve(static_cast<size_t>(n[0] * n[1]));
  for (int64_t i = 0; i < n[0]; ++i) {
    for (int64_t j = 0; j < n[1]; ++j) {
      const char* p = base + (i * st[0] + j * st[1]) * item;
      int64_t value = 0;
      if (is_int) {
        value = dt.bits == 8    ? Read<int8_t>(p)
                : dt.bits == 16 ? Read<int16_t>(p)
                : dt.bits == 32 ? Read<int32_t>(p)
                                : Read<int64_t>(p);
      } else {
        const uint64_t u = dt.bits == 8    ? Read<uint8_t>(p)
                           : dt.bits == 16 ? Read<uint16_t>(p)
                           : dt.bits == 32 ? Read<uint32_t>(p)
                                           : Read<uint64_t>(p);
        if (u > static_cast<uint64_t>(INT64_MAX)) {
          Invalid(std::string(name) + ": value " + std::to_string(u) + " does not fit " + dtype);
        }
        value = static_cast<int64_t>(u);
      }
      x.values.push_back(value);
    }
  }
  return x;
}

// Whether two arrays of one shape and strides share a byte: an element of b
// minus one of a is (b - a) + sum_i stride_i d_i bytes, |d_i| < extent_i.
// Dims that do not interleave (checked by CheckOutput first) leave at most
// two d_i to try per dim, largest stride first.  K and V halves of one
// [blocks][2][...] buffer (FlashInfer's layout) do not meet.
int64_t FloorDiv(int64_t a, int64_t b) { return a / b - (a % b != 0 && (a < 0) != (b < 0)); }
int64_t CeilDiv(int64_t a, int64_t b) { return -FloorDiv(-a, b); }

bool Meet(const Array& a, const Array& b) {
  const int64_t item = static_cast<int64_t>(a.itemsize());
  std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride| in bytes, extent), largest first
  for (int i = 0; i < a.ndim; ++i) {
    if (a.shape[i] > 1) dims.emplace_back(std::llabs(a.strides[i]) * item, a.shape[i]);
  }
  if (a.size() == 0) return false;
  std::sort(dims.rbegin(), dims.rend());
  std::vector<int64_t> reach(dims.size() + 1, item - 1);  // what dims i.. reach past 0
  for (size_t i = dims.size(); i-- > 0;) {
    reach[i] = reach[i + 1] + dims[i].first * (dims[i].second - 1);
  }
  const int64_t gap = static_cast<int64_t>(reinterpret_cast<uintptr_t>(b.data) -
                                           reinterpret_cast<uintptr_t>(a.data));
  const auto search = [&](const auto& self, int64_t d, size_t i) -> bool {
    if (i == dims.size()) return std::llabs(d) < item;
    const int64_t s = dims[i].first, rest = reach[i + 1];
    // d + s * k within [-rest, rest], |k| < extent.
    const int64_t lo = std::max<int64_t>(-(dims[i].second - 1), CeilDiv(-rest - d, s));
    const int64_t hi = std::min<int64_t>(dims[i].second - 1, FloorDiv(rest - d, s));
    if (hi - lo > 8) return true;  // not expected after CheckOutput; refuse rather than guess
    for (int64_t k = lo; k <= hi; ++k) {
      const int64_t r = d + s * k;
      if (r >= -rest && r <= rest && self(self, r, i + 1)) return true;
    }
    return false;
  };
  if (std::llabs(gap) > reach[0]) return false;
  return search(search, gap, 0);
}

// The pools and the index arrays, checked.
struct Paged {
  Array k_pool, v_pool;
  Index block_table, q_offsets, kv_lens;
  std::vector<int32_t> table;
  int64_t batch = 0, rows = 0, kv_heads = 0, head_dim = 0;

  // The C structs over them (pointing into this object).
  headsum_paged_kv Kv() const {
    headsum_paged_kv kv;
    kv.k = k_pool.data;
    kv.v = v_pool.data;
    kv.dtype = k_pool.dtype;
    kv.num_blocks = k_pool.dim(0);
    kv.block_size = k_pool.dim(1);
    kv.strides[0] = k_pool.strides[0];
    kv.strides[1] = k_pool.strides[1];
    kv.strides[2] = k_pool.strides[2];
    kv.block_table = table.data();
    kv.blocks_per_seq = block_table.shape[1];
    return kv;
  }
  headsum_batch_shape Shape(int64_t heads, float scale, bool causal) const {
    return headsum_batch_shape{batch,     heads, kv_heads, head_dim, scale, causal ? 1 : 0,
                               q_offsets.values.data(), kv_lens.values.data()};
  }
};

constexpr const char* kPoolLayout = "[num_blocks][block_size][Hkv][L]";

Paged ImportPaged(nb::handle k_pool_, nb::handle v_pool_, nb::handle block_table_,
                  nb::handle q_offsets_, nb::handle kv_lens_, bool written) {
  Paged p;
  const char* why = "paged_kv_write writes the new rows into the caller's pools in place";
  p.k_pool = Import(k_pool_, "k_pool", 4, 4, kPoolLayout, written, why);
  p.v_pool = Import(v_pool_, "v_pool", 4, 4, kPoolLayout, written, why);
  const Array& k = p.k_pool;
  const Array& v = p.v_pool;
  for (const Array* a : {&k, &v}) {
    if (!a->viewable()) {
      Invalid(std::string(a->name) +
              ": pools are read and written in place, never copied: the last dim (L) must be "
              "contiguous, the strides non-negative and the data aligned (strides in elements " +
              ShapeString(a->strides, a->ndim) + ", shape " + a->shape_str() + ")");
    }
  }
  if (v.dtype != k.dtype) {
    Invalid(std::string("v_pool: dtype ") + DtypeName(v.dtype) + " differs from k_pool's " +
            DtypeName(k.dtype) + "; the pools share one dtype");
  }
  if (!std::equal(k.shape, k.shape + 4, v.shape)) {
    Invalid("v_pool: expected the shape of k_pool, " + k.shape_str() + ", got " + v.shape_str());
  }
  if (!std::equal(k.strides, k.strides + 4, v.strides)) {
    Invalid("v_pool: strides (in elements) " + ShapeString(v.strides, 4) + " differ from k_pool's " +
            ShapeString(k.strides, 4) + "; the pools share one layout");
  }
  p.kv_heads = k.dim(2);
  p.head_dim = k.dim(3);
  p.kv_lens = ImportIndex(kv_lens_, "kv_lens", 1, "[B]", "int64");
  p.batch = p.kv_lens.shape[0];
  if (p.batch < 1) {
    Invalid("kv_lens: expected shape [B] with B >= 1 (the keys of each sequence), got " +
            p.kv_lens.shape_str());
  }
  const std::string b1 = "[B+1=" + std::to_string(p.batch + 1) + "]";
  p.q_offsets = ImportIndex(q_offsets_, "q_offsets", 1, b1, "int64");
  if (p.q_offsets.shape[0] != p.batch + 1) {
    Invalid("q_offsets: expected shape " + b1 + " (B=" + std::to_string(p.batch) +
            " from kv_lens), got " + p.q_offsets.shape_str());
  }
  // T = q_offsets[B] when the offsets are valid; otherwise (-1) the C call
  // names the offset at fault, before reading or writing anything.
  const std::vector<int64_t>& qo = p.q_offsets.values;
  const bool offsets_valid = qo[0] == 0 && std::is_sorted(qo.begin(), qo.end());
  p.rows = offsets_valid ? qo.back() : -1;
  const std::string table_layout = "[B=" + std::to_string(p.batch) + "][blocks_per_seq]";
  p.block_table = ImportIndex(block_table_, "block_table", 2, table_layout, "int32");
  if (p.block_table.shape[0] != p.batch || p.block_table.shape[1] < 1) {
    Invalid("block_table: expected shape " + table_layout + " with blocks_per_seq >= 1, got " +
            p.block_table.shape_str());
  }
  p.table.resize(p.block_table.values.size());
  for (size_t i = 0; i < p.table.size(); ++i) {
    const int64_t e = p.block_table.values[i];
    if (e < INT32_MIN || e > INT32_MAX) {
      const int64_t per = p.block_table.shape[1];
      Invalid("block_table: entry [" + std::to_string(static_cast<int64_t>(i) / per) + "][" +
              std::to_string(static_cast<int64_t>(i) % per) + "] = " + std::to_string(e) +
              " does not fit int32");
    }
    p.table[i] = static_cast<int32_t>(e);
  }
  return p;
}

// Token rows [T][n][L] as the C call indexes them: strides {unused, head, token}.
headsum_tensor Rows(const Array& a) { return View(a, 0, a.strides[1], a.strides[0]); }

// [T][heads][L] rows: T = q_offsets[B] (when valid), L the pools'.
void CheckRows(const Array& a, const Paged& p, int64_t heads, const char* heads_name) {
  const bool fits =
      (p.rows < 0 || a.dim(0) == p.rows) && a.dim(1) == heads && a.dim(2) == p.head_dim;
  if (!fits) {
    Invalid(std::string(a.name) + ": expected shape [T=q_offsets[B]=" + std::to_string(p.rows) +
            "][" + Dim(heads_name, heads) + "][" + Dim("L", p.head_dim) + "], got " +
            a.shape_str());
  }
}

float ScaleOf(std::optional<double> scale) {
  if (!scale) return 0.0f;  // 0: 1/sqrt(L)
  if (*scale == 0.0) Invalid("scale: must not be 0 (None means 1/sqrt(L))");
  return static_cast<float>(*scale);  // not finite: the C API says so
}

nb::object AttentionPaged(nb::handle q_, nb::handle k_pool_, nb::handle v_pool_,
                          nb::handle block_table_, nb::handle q_offsets_, nb::handle kv_lens_,
                          bool causal, std::optional<double> scale, int64_t window,
                          double softcap, nb::handle alibi_slopes_, nb::handle sinks_,
                          nb::handle out_) {
  const Array q = Import(q_, "q", 3, 3, "[T][H][L]");
  const Paged p = ImportPaged(k_pool_, v_pool_, block_table_, q_offsets_, kv_lens_, false);
  const int64_t H = q.dim(1);
  if (p.head_dim != q.dim(2) || p.kv_heads < 1 || H % p.kv_heads != 0) {
    Invalid("k_pool: expected shape [num_blocks][block_size][Hkv][" + Dim("L", q.dim(2)) +
            "] with Hkv dividing " + Dim("H", H) + " (from q), got " + p.k_pool.shape_str());
  }
  CheckRows(q, p, H, "H");
  const float scale_f = ScaleOf(scale);
  Options options = ImportOptions(window, softcap, alibi_slopes_, sinks_, H);
  const std::vector<const Array*> extra = options.arrays();
  const int64_t T = p.rows < 0 ? q.dim(0) : p.rows;  // invalid offsets: refused by the C call
  const Output out = MakeOutput(out_, q, ResultDtype(q), {T, H, p.head_dim}, "[T][H][L]",
                                {&q, &p.k_pool, &p.v_pool, extra[0], extra[1]});
  const Array& o = out.array;
  const headsum_batch_shape shape = p.Shape(H, scale_f, causal);
  const headsum_paged_kv kv = p.Kv();
  headsum_status status;
  {
    nb::gil_scoped_release release;
    // q and out in place when the C call reads them as they are, else
    // staged (the pools are always read in place).
    std::vector<float> qb, ob;
    headsum_tensor tq = Rows(q), to = Rows(o);
    if (!q.viewable()) {
      tq = headsum_tensor{const_cast<float*>(StageF32(q, qb)), HEADSUM_F32, {0, p.head_dim, H * p.head_dim}};
    }
    float* op = nullptr;
    if (!o.viewable()) {
      op = OutputF32(o, ob);
      to = headsum_tensor{op, HEADSUM_F32, {0, p.head_dim, H * p.head_dim}};
    }
    status = headsum_attention_paged(&shape, options.Resolve(), &tq, &kv, &to);
    if (status == HEADSUM_OK && op) Unstage(op, o);
  }
  Check(status);
  return out.object;
}

void PagedKvWrite(nb::handle k_new_, nb::handle v_new_, nb::handle k_pool_, nb::handle v_pool_,
                  nb::handle block_table_, nb::handle q_offsets_, nb::handle kv_lens_) {
  const Array kn = Import(k_new_, "k_new", 3, 3, "[T][Hkv][L]");
  const Array vn = Import(v_new_, "v_new", 3, 3, "[T][Hkv][L]");
  const Paged p = ImportPaged(k_pool_, v_pool_, block_table_, q_offsets_, kv_lens_, true);
  CheckRows(kn, p, p.kv_heads, "Hkv");
  CheckRows(vn, p, p.kv_heads, "Hkv");
  // The pools are written: neither may reach one element twice, meet the
  // new rows, or share an element with the other.
  CheckOutput(p.k_pool, {&kn, &vn});
  CheckOutput(p.v_pool, {&kn, &vn});
  if (Meet(p.k_pool, p.v_pool)) {
    Invalid("v_pool: its memory meets k_pool's; K and V need pools of their own (or disjoint "
            "halves of one buffer)");
  }
  const headsum_batch_shape shape = p.Shape(p.kv_heads, 0.0f, true);
  const headsum_paged_kv kv = p.Kv();
  headsum_status status;
  {
    nb::gil_scoped_release release;
    std::vector<float> kb, vb;
    headsum_tensor tk = Rows(kn), tv = Rows(vn);
    const int64_t row = p.kv_heads * p.head_dim;
    if (!kn.viewable()) {
      tk = headsum_tensor{const_cast<float*>(StageF32(kn, kb)), HEADSUM_F32, {0, p.head_dim, row}};
    }
    if (!vn.viewable()) {
      tv = headsum_tensor{const_cast<float*>(StageF32(vn, vb)), HEADSUM_F32, {0, p.head_dim, row}};
    }
    status = headsum_paged_kv_write(&shape, &kv, &tk, &tv);
  }
  Check(status);
}

// ---------------------------------------------------------------------------
// The projection and the per-head calls

struct Proj {
  Array o, wo;
  headsum_proj_shape shape;
};

Proj ImportProj(nb::handle o_, nb::handle wo_) {
  Proj p;
  p.o = Import(o_, "o", 4, 4, "[B][H][S][L]");
  p.wo = Import(wo_, "wo", 2, 2, "[H*L][D]");
  const int64_t B = p.o.dim(0), H = p.o.dim(1), S = p.o.dim(2), L = p.o.dim(3);
  if (p.wo.dim(0) != H * L) {
    Invalid("wo: expected shape [H*L=" + std::to_string(H * L) + "][D] (" + Dim("H", H) + ", " +
            Dim("L", L) + " from o), got " + p.wo.shape_str());
  }
  p.shape = headsum_proj_shape{B, S, H, L, p.wo.dim(1)};
  return p;
}

std::optional<Array> ImportVector(nb::handle h, const char* name, const char* layout,
                                  int64_t n) {
  std::optional<Array> a = ImportOptional(h, name, 1, 1, layout);
  if (a && a->dim(0) != n) {
    Invalid(std::string(name) + ": expected shape " + layout + " = (" + std::to_string(n) +
            ",), got " + a->shape_str());
  }
  return a;
}

nb::object ProjectHeadsSum(nb::handle o_, nb::handle wo_, nb::handle bias_, nb::handle gates_,
                           nb::handle out_) {
  const Proj p = ImportProj(o_, wo_);
  const headsum_proj_shape& s = p.shape;
  const std::string d_layout = "[D=" + std::to_string(s.model_dim) + "]";
  const std::string h_layout = "[H=" + std::to_string(s.heads) + "]";
  const std::optional<Array> bias = ImportVector(bias_, "bias", d_layout.c_str(), s.model_dim);
  const std::optional<Array> gates = ImportVector(gates_, "gates", h_layout.c_str(), s.heads);
  const Output out =
      MakeOutput(out_, p.o, ResultDtype(p.o), {s.batch, s.seq, s.model_dim}, "[B][S][D]",
                 {&p.o, &p.wo, bias ? &*bias : nullptr, gates ? &*gates : nullptr});
  const Array& y = out.array;
  headsum_status status;
  if (!gates && p.o.viewable() && p.wo.viewable() && y.viewable()) {
    const headsum_tensor th = View4(p.o), tw = View(p.wo, 0, 0, p.wo.strides[0]),
                         ty = View(y, y.strides[0], 0, y.strides[1]);
    nb::gil_scoped_release release;
    std::vector<float> bb;
    const float* bp = bias ? StageF32(*bias, bb) : nullptr;
    status = headsum_project_heads_sum_tensors(&s, &th, &tw, bp, &ty);
  } else {
    nb::gil_scoped_release release;
    std::vector<float> ob, wb, bb, gb, yb;
    const float* op = StageF32(p.o, ob);
    const float* wp = StageF32(p.wo, wb);
    const float* bp = bias ? StageF32(*bias, bb) : nullptr;
    const float* gp = gates ? StageF32(*gates, gb) : nullptr;
    float* yp = OutputF32(y, yb);
    status = headsum_project_heads_sum_ex(&s, op, wp, bp, gp, yp, nullptr);
    if (status == HEADSUM_OK) Unstage(yp, y);
  }
  Check(status);
  return out.object;
}

nb::object HeadContributions(nb::handle o_, nb::handle wo_, nb::handle out_) {
  const Proj p = ImportProj(o_, wo_);
  const headsum_proj_shape& s = p.shape;
  const Output out = MakeOutput(out_, p.o, HEADSUM_F32, {s.batch, s.seq, s.heads, s.model_dim},
                                "[B][S][H][D]", {&p.o, &p.wo});
  headsum_status status;
  {
    nb::gil_scoped_release release;
    std::vector<float> ob, wb, cb;
    const float* op = StageF32(p.o, ob);
    const float* wp = StageF32(p.wo, wb);
    float* cp = OutputF32(out.array, cb);
    status = headsum_project_heads_sum_ex(&s, op, wp, nullptr, nullptr, nullptr, cp);
    if (status == HEADSUM_OK) Unstage(cp, out.array);
  }
  Check(status);
  return out.object;
}

nb::object HeadContributionNorms(nb::handle o_, nb::handle wo_, nb::handle out_) {
  const Proj p = ImportProj(o_, wo_);
  const headsum_proj_shape& s = p.shape;
  const Output out = MakeOutput(out_, p.o, HEADSUM_F32, {s.batch, s.seq, s.heads}, "[B][S][H]",
                                {&p.o, &p.wo});
  headsum_status status;
  {
    nb::gil_scoped_release release;
    std::vector<float> ob, wb, nb_;
    const float* op = StageF32(p.o, ob);
    const float* wp = StageF32(p.wo, wb);
    float* np_ = OutputF32(out.array, nb_);
    status = headsum_head_contribution_norms(&s, op, wp, np_);
    if (status == HEADSUM_OK) Unstage(np_, out.array);
  }
  Check(status);
  return out.object;
}

// directions [R][D] or one direction [D] (then the result has no R dim).
Array ImportDirections(nb::handle h, int64_t model_dim) {
  const std::string layout = "[R][D=" + std::to_string(model_dim) + "] or [D=" +
                             std::to_string(model_dim) + "]";
  Array d = Import(h, "directions", 1, 2, layout.c_str());
  if (d.dim(d.ndim - 1) != model_dim) {
    Invalid("directions: expected shape " + layout + " (D from wo), got " + d.shape_str());
  }
  return d;
}

std::vector<int64_t> AttributionShape(const headsum_proj_shape& s, const Array& directions) {
  if (directions.ndim == 1) return {s.batch, s.seq, s.heads};
  return {s.batch, s.seq, s.heads, directions.dim(0)};
}

nb::object HeadAttribution(nb::handle o_, nb::handle wo_, nb::handle directions_,
                           nb::handle out_) {
  const Proj p = ImportProj(o_, wo_);
  const headsum_proj_shape& s = p.shape;
  const Array d = ImportDirections(directions_, s.model_dim);
  const int64_t R = d.ndim == 1 ? 1 : d.dim(0);
  const Output out =
      MakeOutput(out_, p.o, HEADSUM_F32, AttributionShape(s, d),
                 d.ndim == 1 ? "[B][S][H]" : "[B][S][H][R]", {&p.o, &p.wo, &d});
  headsum_status status;
  {
    nb::gil_scoped_release release;
    std::vector<float> ob, wb, db, ab;
    const float* op = StageF32(p.o, ob);
    const float* wp = StageF32(p.wo, wb);
    const float* dp = StageF32(d, db);
    float* ap = OutputF32(out.array, ab);
    status = headsum_head_attribution(&s, op, wp, dp, R, ap);
    if (status == HEADSUM_OK) Unstage(ap, out.array);
  }
  Check(status);
  return out.object;
}

// The reusable attribution basis (headsum_attribution_basis_create).
class AttributionBasis {
 public:
  AttributionBasis(nb::handle wo_, nb::handle directions_, int64_t heads) {
    const Array wo = Import(wo_, "wo", 2, 2, "[H*L][D]");
    if (heads < 1 || wo.dim(0) % heads != 0) {
      Invalid("heads: must be >= 1 and divide wo's " + std::to_string(wo.dim(0)) +
              " rows (H*L), got " + std::to_string(heads));
    }
    const Array d = ImportDirections(directions_, wo.dim(1));
    heads_ = heads;
    head_dim_ = wo.dim(0) / heads;
    model_dim_ = wo.dim(1);
    n_directions_ = d.ndim == 1 ? 1 : d.dim(0);
    single_ = d.ndim == 1;
    const headsum_proj_shape shape{1, 1, heads_, head_dim_, model_dim_};
    headsum_status status;
    {
      nb::gil_scoped_release release;
      std::vector<float> wb, db;
      const float* wp = StageF32(wo, wb);
      const float* dp = StageF32(d, db);
      status = headsum_attribution_basis_create(&shape, wp, dp, n_directions_, &basis_);
    }
    Check(status);
  }
  ~AttributionBasis() { headsum_attribution_basis_free(basis_); }
  AttributionBasis(const AttributionBasis&) = delete;
  AttributionBasis& operator=(const AttributionBasis&) = delete;

  nb::object Call(nb::handle o_, nb::handle out_) const {
    const Array o = Import(o_, "o", 4, 4, "[B][H][S][L]");
    if (o.dim(1) != heads_ || o.dim(3) != head_dim_) {
      Invalid("o: expected shape [B][" + Dim("H", heads_) + "][S][" + Dim("L", head_dim_) +
              "] (the basis'), got " + o.shape_str());
    }
    const headsum_proj_shape s{o.dim(0), o.dim(2), heads_, head_dim_, model_dim_};
    std::vector<int64_t> shape = {s.batch, s.seq, s.heads};
    if (!single_) shape.push_back(n_directions_);
    const Output out = MakeOutput(out_, o, HEADSUM_F32, shape,
                                  single_ ? "[B][S][H]" : "[B][S][H][R]", {&o});
    headsum_status status;
    {
      nb::gil_scoped_release release;
      std::vector<float> ob, ab;
      const float* op = StageF32(o, ob);
      float* ap = OutputF32(out.array, ab);
      status = headsum_head_attribution_basis(&s, op, basis_, ap);
      if (status == HEADSUM_OK) Unstage(ap, out.array);
    }
    Check(status);
    return out.object;
  }

  int64_t heads_ = 0, head_dim_ = 0, model_dim_ = 0, n_directions_ = 0;
  bool single_ = false;
  headsum_attribution_basis* basis_ = nullptr;
};

// ---------------------------------------------------------------------------
// The whole layer (headsum_mha_*) and its KV cache

headsum_dtype StorageDtype(const char* arg, const std::string& name) {
  if (name == "float32") return HEADSUM_F32;
  if (name == "float16") return HEADSUM_F16;
  if (name == "bfloat16") return HEADSUM_BF16;
  Invalid(std::string(arg) + ": expected \"float32\", \"float16\" or \"bfloat16\", got \"" +
          name + "\"");
}

class KvCache {
 public:
  KvCache(headsum_kv_cache* cache, int64_t batch, int64_t capacity)
      : cache_(cache), batch_(batch), capacity_(capacity) {}
  ~KvCache() { headsum_kv_cache_free(cache_); }
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int64_t Length() const { return headsum_kv_cache_length(cache_); }
  void Reset() {
    Claim claim(*this);
    headsum_kv_cache_reset(cache_);
  }
  void Truncate(int64_t length) {
    Claim claim(*this);
    Check(headsum_kv_cache_truncate(cache_, length));
  }

  // A cache serves one call at a time (the GIL is released during calls).
  struct Claim {
    explicit Claim(KvCache& c) : cache(c) {
      if (cache.busy_.exchange(true)) {
        Raise(PyExc_RuntimeError, "cache: in use by another call (a cache serves one call at a time)");
      }
    }
    ~Claim() { cache.busy_.store(false); }
    KvCache& cache;
  };

  headsum_kv_cache* cache_;
  int64_t batch_, capacity_;
  std::atomic<bool> busy_{false};
};

class Layer {
 public:
  Layer(nb::handle wq_, nb::handle wk_, nb::handle wv_, nb::handle wo_, int64_t heads,
        std::optional<int64_t> kv_heads, bool causal, double rope_theta, nb::handle bq_,
        nb::handle bk_, nb::handle bv_, nb::handle bo_, const std::string& weight_dtype,
        const std::string& cache_dtype, int64_t window, double softcap,
        nb::handle alibi_slopes_, nb::handle sinks_) {
    if (heads < 1) Invalid("heads: must be >= 1, got " + std::to_string(heads));
    const Array wq = Import(wq_, "wq", 2, 2, "[Dm][H*L]");
    if (wq.dim(1) % heads != 0) {
      Invalid("wq: expected shape [Dm][H*L] with H=" + std::to_string(heads) +
              " dividing its columns, got " + wq.shape_str());
    }
    const int64_t Dm = wq.dim(0), L = wq.dim(1) / heads;
    const int64_t Hkv = kv_heads ? *kv_heads : heads;
    if (Hkv < 1 || heads % Hkv != 0) {
      Invalid("kv_heads: must divide heads=" + std::to_string(heads) + ", got " +
              std::to_string(Hkv));
    }
    const std::string kv_cols = std::to_string(Hkv * L);
    const std::string kv_layout = "[Dm=" + std::to_string(Dm) + "][Hkv*L=" + kv_cols + "]";
    const Array wk = Import(wk_, "wk", 2, 2, kv_layout.c_str());
    const Array wv = Import(wv_, "wv", 2, 2, kv_layout.c_str());
    for (const Array* w : {&wk, &wv}) {
      if (w->dim(0) != Dm || w->dim(1) != Hkv * L) {
        Invalid(std::string(w->name) + ": expected shape " + kv_layout + ", got " + w->shape_str());
      }
    }
    const std::string wo_layout =
        "[H*L=" + std::to_string(heads * L) + "][Dm=" + std::to_string(Dm) + "]";
    const Array wo = Import(wo_, "wo", 2, 2, wo_layout.c_str());
    if (wo.dim(0) != heads * L || wo.dim(1) != Dm) {
      Invalid("wo: expected shape " + wo_layout + ", got " + wo.shape_str());
    }
    const std::string q_len = "[H*L=" + std::to_string(heads * L) + "]";
    const std::string kv_len = "[Hkv*L=" + kv_cols + "]";
    const std::string d_len = "[Dm=" + std::to_string(Dm) + "]";
    const std::optional<Array> bq = ImportVector(bq_, "bq", q_len.c_str(), heads * L);
    const std::optional<Array> bk = ImportVector(bk_, "bk", kv_len.c_str(), Hkv * L);
    const std::optional<Array> bv = ImportVector(bv_, "bv", kv_len.c_str(), Hkv * L);
    const std::optional<Array> bo = ImportVector(bo_, "bo", d_len.c_str(), Dm);
    Options options = ImportOptions(window, softcap, alibi_slopes_, sinks_, heads);
    window_ = options.window;
    softcap_ = options.softcap;
    config_ = headsum_mha_config{Dm,
                                 heads,
                                 Hkv,
                                 L,
                                 causal ? 1 : 0,
                                 static_cast<float>(rope_theta),
                                 StorageDtype("weight_dtype", weight_dtype),
                                 StorageDtype("cache_dtype", cache_dtype)};
    headsum_status status;
    {
      nb::gil_scoped_release release;
      std::vector<float> b[8];
      auto staged = [&](const std::optional<Array>& a, std::vector<float>& buf) {
        return a ? StageF32(*a, buf) : nullptr;
      };
      // The options are copied by the layer: a layer without them is the
      // plain one.
      status = headsum_mha_create_ex(&config_, options.Resolve(), StageF32(wq, b[0]),
                                     StageF32(wk, b[1]), StageF32(wv, b[2]), StageF32(wo, b[3]),
                                     staged(bq, b[4]), staged(bk, b[5]), staged(bv, b[6]),
                                     staged(bo, b[7]), &mha_);
    }
    Check(status);
  }
  ~Layer() { headsum_mha_free(mha_); }
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  KvCache* NewCache(int64_t batch, int64_t capacity) {
    headsum_kv_cache* cache = nullptr;
    headsum_status status;
    {
      nb::gil_scoped_release release;
      status = headsum_kv_cache_create(mha_, batch, capacity, &cache);
    }
    Check(status);
    return new KvCache(cache, batch, capacity);
  }

  nb::object Forward(nb::handle x_, KvCache* cache, nb::handle out_) const {
    const std::string layout = "[B][S][Dm=" + std::to_string(config_.model_dim) + "]";
    const Array x = Import(x_, "x", 3, 3, layout.c_str());
    if (x.dim(2) != config_.model_dim) {
      Invalid("x: expected shape " + layout + ", got " + x.shape_str());
    }
    const int64_t B = x.dim(0), S = x.dim(1);
    Output out;
    const bool in_place = !out_.is_none() && out_.ptr() == x_.ptr();
    if (in_place) {  // y may be x: the C API reads x before writing y
      out.array = Import(out_, "out", 3, 3, layout.c_str(), true);
      out.object = nb::borrow(out_);
    } else {
      out = MakeOutput(out_, x, HEADSUM_F32, {B, S, config_.model_dim}, "[B][S][Dm]", {&x});
    }
    std::optional<KvCache::Claim> claim;
    if (cache) claim.emplace(*cache);
    headsum_status status;
    {
      nb::gil_scoped_release release;
      std::vector<float> xb, yb;
      const float* xp = StageF32(x, xb);
      float* yp = OutputF32(out.array, yb);
      status = headsum_mha_forward(mha_, cache ? cache->cache_ : nullptr, B, S, xp, yp);
      if (status == HEADSUM_OK) Unstage(yp, out.array);
    }
    Check(status);
    return out.object;
  }

  headsum_mha_config config_;
  int64_t window_ = 0;
  float softcap_ = 0.0f;
  headsum_mha* mha_ = nullptr;
};

// ---------------------------------------------------------------------------
// Dispatch and threads

void SetTarget(std::optional<std::string> name) {
  Check(headsum_set_target(name ? name->c_str() : nullptr));
}

std::vector<std::string> CompiledTargets() {
  const int n = headsum_compiled_targets(nullptr, 0);
  std::vector<const char*> names(static_cast<size_t>(std::max(n, 0)));
  const int got = headsum_compiled_targets(names.data(), n);
  return std::vector<std::string>(names.begin(), names.begin() + std::min(n, got));
}

void SetNumThreads(int n) { Check(headsum_set_num_threads(n)); }

}  // namespace

NB_MODULE(_headsum, m) {
  m.doc() = "headsum's compiled core; use the package `headsum`.";
  m.attr("__version__") = headsum_version();

  m.def("attention", &Attention, "q"_a.none(), "k"_a.none(), "v"_a.none(), nb::kw_only(), "causal"_a = false,
        "scale"_a = nb::none(), "out"_a = nb::none(), "window"_a = 0, "softcap"_a = 0.0,
        "alibi_slopes"_a = nb::none(), "sinks"_a = nb::none(), "bias"_a = nb::none(),
        R"(attention(q, k, v, *, causal=False, scale=None, out=None, window=0, softcap=0.0,
          alibi_slopes=None, sinks=None, bias=None) -> array

O = softmax(scale * Q K^T + mask) V per head, without materializing the
scores (flash-style online softmax).

q    [B][H][Sq][L]      k, v  [B][Hkv][Skv][L]   (Hkv divides H: MHA, GQA, MQA)
returns / out  [B][H][Sq][L]
alibi_slopes, sinks  [H]     bias  broadcastable to [B][H][Sq][Skv]

What a model adds to the scores.  Query row i sits at position
p = i + (Skv - Sq) (bottom-right, as causal is), key j at j.  Per score, in
this order: s = scale q.k; s = softcap * tanh(s / softcap) if softcap > 0;
s += alibi_slopes[h] * (j - p); s += bias[b][h][i][j]; then masked keys
are removed (causal: j > p; window > 0: causal calls see
p - window < j <= p, others |j - p| < window); sinks[h] joins each row's
softmax denominator only (exp(sinks[h] - max)).  A row that sees no key
gives zeros.  bias follows NumPy broadcasting from 2, 3 or 4 dims (a
key-padding mask [B][1][1][Skv], a per-head term [1][H][Sq][Skv] or
[H][Sq][Skv], one [Sq][Skv] for all), size-1 dims read with stride 0,
never copied; its last dim must be Skv and contiguous (else one float32
copy); -inf removes a key; any dtype the other arrays take.
alibi_slopes and sinks: float arrays or sequences of H numbers, finite.

Arrays: NumPy float32/float16 or DLPack tensors (torch float32/float16/
bfloat16) on the CPU, any strides; read in place (no copy) when each one's
last dim is contiguous and its strides are non-negative, else staged once
through a float32 copy.  The result has q's dtype (float32 for a bfloat16
q that is not a torch tensor) and q's framework (a torch tensor for a torch
q); out= may be any writeable float32/float16/bfloat16 array of that shape,
written in place (a 16-bit result is the float32 one rounded once).
causal: query i sees key j when j <= i + (Skv - Sq) (bottom-right aligned).
scale: None means 1/sqrt(L).  The GIL is released while the kernel runs.
Raises ValueError for bad arguments (the message names the argument and the
expected shape), RuntimeError when the build or CPU cannot serve the call,
MemoryError when memory runs out.)");

  m.def("attention_paged", &AttentionPaged, "q"_a.none(), "k_pool"_a.none(), "v_pool"_a.none(),
        "block_table"_a.none(), "q_offsets"_a.none(), "kv_lens"_a.none(), nb::kw_only(),
        "causal"_a = true, "scale"_a = nb::none(), "window"_a = 0, "softcap"_a = 0.0,
        "alibi_slopes"_a = nb::none(), "sinks"_a = nb::none(), "out"_a = nb::none(),
        R"(attention_paged(q, k_pool, v_pool, block_table, q_offsets, kv_lens, *, causal=True,
                scale=None, window=0, softcap=0.0, alibi_slopes=None, sinks=None,
                out=None) -> array

Attention of a ragged batch over a paged KV cache (vLLM, FlashInfer):
sequence b owns query rows q_offsets[b] .. q_offsets[b+1]-1 (n_b of them,
possibly none) and attends over its first kv_lens[b] keys; its rows are its
last positions, so row r sits at p = kv_lens[b] - n_b + (r - q_offsets[b])
(causal is bottom-right aligned: decode steps, prefill, chunked prefill and
their mix are one call).  Token t of sequence b is slot t % block_size of
block block_table[b][t // block_size]; blocks may be shared (a common
prefix), entries past a sequence's blocks are never read.

q            [T][H][L], T = q_offsets[B]
k_pool, v_pool  [num_blocks][block_size][Hkv][L], Hkv dividing H; any
             non-negative strides with L contiguous, one dtype and the same
             strides for both (a [num_blocks][Hkv][block_size][L] pool
             passes as pool.transpose(0, 2, 1, 3)); read in place, never
             copied
block_table  [B][blocks_per_seq] int32    q_offsets [B+1] int64
kv_lens      [B] int64 (B from kv_lens)
returns / out  [T][H][L]
Index arrays: NumPy arrays, DLPack tensors or sequences of any integer
dtype, converted exactly (a small copy); block_table entries must fit
int32.  Pools and q: float32/float16/bfloat16 (bfloat16 through DLPack,
e.g. torch).  q and out are read/written in place when their last dim is
contiguous (else staged once through float32).  The result has q's dtype
(float32 for a bfloat16 q that is not a torch tensor) and framework, as
attention(); out= may be any writeable array of that shape.
window, softcap, alibi_slopes [H], sinks [H]: as attention() takes them,
positions as above.  scale: None means 1/sqrt(L).  The GIL is released
while the kernel runs.  Raises ValueError naming the argument (the C
library's checks: q_offsets from 0 and non-decreasing, n_b <= kv_lens[b],
block_table entries in [0, num_blocks), blocks_per_seq * block_size
covering kv_lens[b]); nothing is written on failure.)");

  m.def("paged_kv_write", &PagedKvWrite, "k_new"_a.none(), "v_new"_a.none(), "k_pool"_a.none(),
        "v_pool"_a.none(), "block_table"_a.none(), "q_offsets"_a.none(), "kv_lens"_a.none(),
        R"(paged_kv_write(k_new, v_new, k_pool, v_pool, block_table, q_offsets, kv_lens) -> None

Writes each sequence's n_b = q_offsets[b+1] - q_offsets[b] new K and V rows
into its cache positions kv_lens[b] - n_b .. kv_lens[b] - 1 of the pools,
converted to the pools' dtype (round to nearest even): how an engine
appends a step before attention_paged.  kv_lens counts the keys after the
write.

k_new, v_new  [T][Hkv][L] (T = q_offsets[B]), float32/float16/bfloat16,
              read in place (last dim not contiguous: staged once)
k_pool, v_pool  [num_blocks][block_size][Hkv][L], as attention_paged takes
              them; written IN PLACE: they must be writeable, L contiguous,
              never copied
block_table, q_offsets, kv_lens  as attention_paged
Refused (ValueError, naming the argument, nothing written): read-only or
non-contiguous pools, pools that meet each other or k_new/v_new, two rows
written to one slot (a shared block written by two sequences), and every
rule of attention_paged.  The GIL is released during the write.)");

  m.def("project_heads_sum", &ProjectHeadsSum, "o"_a.none(), "wo"_a.none(), "bias"_a = nb::none(),
        "gates"_a = nb::none(), nb::kw_only(), "out"_a = nb::none(),
        R"(project_heads_sum(o, wo, bias=None, gates=None, *, out=None) -> array

Y[b][s][:] = sum_h gates[h] * O[b][h][s][:] @ Wo[h] + bias, reading O head
by head (no concatenated copy); Wo[h] is rows h*L .. h*L+L-1 of wo.

o [B][H][S][L]   wo [H*L][D]   bias [D] or None   gates [H] or None (all 1)
returns / out  [B][S][D], o's dtype and framework (as attention).

Without gates, o, wo and out are read/written in place in any dtype
(float32/float16/bfloat16) with a contiguous last dim.  With gates the C
API takes contiguous float32 only: o and wo that are not float32
C-contiguous are converted once to a float32 copy.  bias and gates are
float32 vectors (others are converted, a copy of D or H values).)");

  m.def("head_contributions", &HeadContributions, "o"_a.none(), "wo"_a.none(), nb::kw_only(),
        "out"_a = nb::none(),
        R"(head_contributions(o, wo, *, out=None) -> float32 array

C[b][s][h][:] = O[b][h][s][:] @ Wo[h], each head's own contribution to Y
(ungated, no bias): the [B][S][H][D] tensor that TransformerLens-style tools
materialize.  head_attribution and head_contribution_norms answer the usual
questions about it without writing it.

o [B][H][S][L]   wo [H*L][D]   returns / out [B][S][H][D] (float32)
o and wo are read in place when float32 C-contiguous; otherwise (16-bit,
strided) each is converted once to a contiguous float32 copy.)");

  m.def("head_attribution", &HeadAttribution, "o"_a.none(), "wo"_a.none(), "directions"_a.none(), nb::kw_only(),
        "out"_a = nb::none(),
        R"(head_attribution(o, wo, directions, *, out=None) -> float32 array

A[b][s][h][r] = (O[b][h][s][:] @ Wo[h]) . directions[r], computed as
O_h . (Wo[h] directions[r]) without materializing the contributions.

o [B][H][S][L]   wo [H*L][D]   directions [R][D] (or one direction [D])
returns / out  [B][S][H][R] (float32; [B][S][H] for a 1-D direction)
Inputs are read in place when float32 C-contiguous, else converted once
to a contiguous float32 copy.  For fixed wo and directions across many
calls, AttributionBasis computes Wo[h] directions[r] once.)");

  m.def("head_contribution_norms", &HeadContributionNorms, "o"_a.none(), "wo"_a.none(), nb::kw_only(),
        "out"_a = nb::none(),
        R"(head_contribution_norms(o, wo, *, out=None) -> float32 array

N[b][s][h] = || O[b][h][s][:] @ Wo[h] ||_2, without writing [B][S][H][D].

o [B][H][S][L]   wo [H*L][D]   returns / out  [B][S][H] (float32)
Inputs are read in place when float32 C-contiguous, else converted once
to a contiguous float32 copy.)");

  nb::class_<AttributionBasis>(m, "AttributionBasis",
                               R"(AttributionBasis(wo, directions, heads)

head_attribution for a wo and directions that stay fixed across calls:
basis[h][r][:] = Wo[h] @ directions[r] is computed once (O(H L D R)); each
call basis(o) then costs O(B S H L R).

wo [H*L][D]   directions [R][D] (or [D])   heads: H
basis(o, *, out=None) -> [B][S][H][R] float32 ([B][S][H] for a 1-D
direction), o [B][H][S][L].  Inputs that are not float32 C-contiguous are
converted once to a contiguous float32 copy.)")
      .def(nb::init<nb::handle, nb::handle, int64_t>(), "wo"_a.none(), "directions"_a.none(), "heads"_a)
      .def("__call__", &AttributionBasis::Call, "o"_a.none(), nb::kw_only(), "out"_a = nb::none(),
           "Attribution of o [B][H][S][L] along the basis' directions: [B][S][H][R].")
      .def_ro("heads", &AttributionBasis::heads_, "H")
      .def_ro("head_dim", &AttributionBasis::head_dim_, "L")
      .def_ro("model_dim", &AttributionBasis::model_dim_, "D")
      .def_ro("n_directions", &AttributionBasis::n_directions_, "R");

  nb::class_<KvCache>(m, "KVCache",
                      R"(A layer's KV cache: K (after RoPE) and V of up to `capacity` tokens for
`batch` sequences, in the layer's cache_dtype.  Made by MHA.new_cache; one
call at a time uses it.)")
      .def_ro("batch", &KvCache::batch_)
      .def_ro("capacity", &KvCache::capacity_)
      .def_prop_ro("length", &KvCache::Length, "Tokens held.")
      .def("__len__", &KvCache::Length)
      .def("reset", &KvCache::Reset, "Hold 0 tokens again.")
      .def("truncate", &KvCache::Truncate, "length"_a,
           "Keep the first `length` tokens (a rejected draft, a rewound prompt).");

  nb::class_<Layer>(m, "MHA",
                    R"(MHA(wq, wk, wv, wo, heads=8, kv_heads=None, causal=True, rope_theta=0.0,
    bq=None, bk=None, bv=None, bo=None, weight_dtype="float32",
    cache_dtype="float32", window=0, softcap=0.0, alibi_slopes=None,
    sinks=None)

The whole attention layer: x -> x @ [Wq Wk Wv] (+ biases) -> rotary
positions on Q and K (rope_theta > 0; rotate-half, as Llama) -> attention
(GQA when kv_heads < heads) -> y = sum_h O_h @ Wo[h] + bo.

wq [Dm][H*L]   wk, wv [Dm][Hkv*L]   wo [H*L][Dm]   bq [H*L]   bk, bv [Hkv*L]
bo [Dm]; L is wq's columns / heads.  The weights are copied (rounded to
weight_dtype) and packed: the arrays may change or go after.
mha(x, cache=None, *, out=None) -> y [B][S][Dm] float32 for x [B][S][Dm]:
with a cache (mha.new_cache(batch, capacity)) the S tokens follow the ones
it holds (positions len .. len+S-1) and are appended; without one, x
attends to itself.  x is read in place when float32 C-contiguous (else
converted once); out may be x itself.  The GIL is released during the
call.
window, softcap, alibi_slopes [H], sinks [H]: what the model adds to the
scores, as attention() takes them (a Mistral or gpt-oss sliding layer, Gemma
2's softcap, BLOOM's ALiBi, gpt-oss's sinks), copied at creation; the
queries sit at their cache positions.)")
      .def(nb::init<nb::handle, nb::handle, nb::handle, nb::handle, int64_t,
                    std::optional<int64_t>, bool, double, nb::handle, nb::handle, nb::handle,
                    nb::handle, const std::string&, const std::string&, int64_t, double,
                    nb::handle, nb::handle>(),
           "wq"_a.none(), "wk"_a.none(), "wv"_a.none(), "wo"_a.none(), "heads"_a = 8,
           "kv_heads"_a = nb::none(), "causal"_a = true, "rope_theta"_a = 0.0,
           "bq"_a = nb::none(), "bk"_a = nb::none(), "bv"_a = nb::none(), "bo"_a = nb::none(),
           "weight_dtype"_a = "float32", "cache_dtype"_a = "float32", "window"_a = 0,
           "softcap"_a = 0.0, "alibi_slopes"_a = nb::none(), "sinks"_a = nb::none())
      .def("__call__", &Layer::Forward, "x"_a.none(), "cache"_a = nb::none(), nb::kw_only(),
           "out"_a = nb::none(), "y [B][S][Dm] (float32) for x [B][S][Dm].")
      .def("new_cache", &Layer::NewCache, "batch"_a = 1, "capacity"_a = 4096,
           nb::keep_alive<0, 1>(), "A KV cache for `batch` sequences of up to `capacity` tokens.")
      .def_prop_ro("model_dim", [](const Layer& l) { return l.config_.model_dim; })
      .def_prop_ro("heads", [](const Layer& l) { return l.config_.heads; })
      .def_prop_ro("kv_heads", [](const Layer& l) { return l.config_.kv_heads; })
      .def_prop_ro("head_dim", [](const Layer& l) { return l.config_.head_dim; })
      .def_prop_ro("causal", [](const Layer& l) { return l.config_.causal != 0; })
      .def_prop_ro("rope_theta", [](const Layer& l) { return l.config_.rope_theta; })
      .def_prop_ro("window", [](const Layer& l) { return l.window_; })
      .def_prop_ro("softcap", [](const Layer& l) { return l.softcap_; });

  m.def("set_target", &SetTarget, "name"_a = nb::none(),
        R"(set_target(name=None)

Restricts dispatch to the named target ("AVX3", "AVX2", "SSE4", ...; see
compiled_targets()); None returns to the best one this CPU runs.  A name
this build did not compile or this CPU cannot run raises RuntimeError and
changes nothing.  Process-wide.)");
  m.def("active_target", &headsum_active_target,
        "active_target() -> str: the target the kernels run on now.");
  m.def("compiled_targets", &CompiledTargets,
        "compiled_targets() -> list[str]: the targets this build compiled, best first.");
  m.def("set_num_threads", &SetNumThreads, "n"_a,
        R"(set_num_threads(n)

Threads each call uses (OpenMP); 0 restores the default.  Process-wide.
A negative n raises ValueError.)");

  m.def(
      "_fail_allocations_after", [](long n) { headsum::testing::FailAllocationsAfter(n); }, "n"_a,
      "Tests only: the library's next n allocations succeed, later ones fail (n < 0: none fail).");
  m.def(
      "_copy_stats",
      [] { return std::make_pair(g_copies.load(), g_copied_bytes.load()); },
      "(copies, bytes): float32 stagings the binding has made (tests use it to prove zero-copy).");
}
