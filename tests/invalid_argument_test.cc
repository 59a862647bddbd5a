// Every public function checks its arguments first.  An invalid call returns
// HEADSUM_ERR_INVALID_ARGUMENT (HEADSUM_ERR_UNSUPPORTED for an unknown target
// name), headsum_last_error() names the argument and its value, and no
// output is written.  The order in which a function checks its arguments is
// its own business: a call with one fault must name that argument; a call
// whose dims overflow only has to name one of them.
#include <cctype>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "headsum/headsum.h"
#include "test_util.h"

namespace headsum_test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t k2e31 = int64_t{1} << 31;
constexpr int64_t k2e32 = int64_t{1} << 32;
constexpr int64_t k2e40 = int64_t{1} << 40;

// Generous buffers: even if a faulty call were accepted, small dims would not
// run off the end (the sentinel check then reports it).
constexpr size_t kBufferElems = 1 << 14;

bool IsIdentChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// `word` as a whole identifier: "heads" is not found inside "kv_heads".
bool MentionsWord(const std::string& text, const std::string& word) {
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
    const bool left_ok = at == 0 || !IsIdentChar(text[at - 1]);
    const bool right_ok = at + word.size() == text.size() || !IsIdentChar(text[at + word.size()]);
    if (left_ok && right_ok) return true;
  }
  return false;
}

// `value` printed as a decimal integer: not part of a longer number.
bool MentionsInteger(const std::string& text, int64_t value) {
  const std::string digits = std::to_string(value);
  for (size_t at = text.find(digits); at != std::string::npos; at = text.find(digits, at + 1)) {
    const bool left_ok =
        at == 0 || !(std::isdigit(static_cast<unsigned char>(text[at - 1])) ||
                     (value >= 0 && text[at - 1] == '-'));
    const size_t end = at + digits.size();
    const bool right_ok = end == text.size() ||
                          !(std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.');
    if (left_ok && right_ok) return true;
  }
  return false;
}

std::string Lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// How a non-finite scale shows in the message: "nan", "inf" or "-inf".
bool MentionsFloat(const std::string& text, float value) {
  const std::string t = Lower(text);
  if (std::isnan(value)) return t.find("nan") != std::string::npos;
  if (value < 0) return t.find("-inf") != std::string::npos;
  return t.find("inf") != std::string::npos;
}

// What a failed call must have said.
struct Expectation {
  std::vector<std::string> args;  // the message names one of these (empty: any)
  enum class Value { kNone, kInteger, kFloat } value_kind = Value::kNone;
  std::vector<int64_t> int_values;  // the message shows one of these
  float float_value = 0;
};

Expectation NamesArg(const std::string& arg) {
  Expectation e;
  e.args = {arg};
  return e;
}
Expectation NamesArgAndValue(const std::string& arg, int64_t value) {
  Expectation e = NamesArg(arg);
  e.value_kind = Expectation::Value::kInteger;
  e.int_values = {value};
  return e;
}
Expectation NamesArgAndValue(const std::string& arg, float value) {
  Expectation e = NamesArg(arg);
  e.value_kind = Expectation::Value::kFloat;
  e.float_value = value;
  return e;
}
Expectation NamesOneOf(std::vector<std::string> args) {
  Expectation e;
  e.args = std::move(args);
  return e;
}
// Overflow: no single argument is at fault.  The message may name a dim or
// the tensor whose element count overflows, and shows one of the values.
Expectation NamesOneOfWithOneOfValues(std::vector<std::string> args,
                                      std::vector<int64_t> values) {
  Expectation e = NamesOneOf(std::move(args));
  e.value_kind = Expectation::Value::kInteger;
  e.int_values = std::move(values);
  return e;
}

// Sets this thread's last error to a message that cannot be mistaken for the
// one under test, so we see that the call under test replaced it.
constexpr const char* kPrimerTarget = "primer_target_xyz";
void PrimeLastError() { (void)headsum_set_target(kPrimerTarget); }

// Checks status, message and untouched outputs of one invalid call.
void ExpectRejected(const std::string& what, headsum_status status, headsum_status want,
                    const Expectation& e, const std::vector<std::vector<float>*>& outputs) {
  SCOPED_TRACE(what);
  EXPECT_EQ(status, want) << "got " << StatusName(status);
  const char* raw = headsum_last_error();
  ASSERT_NE(raw, nullptr);
  const std::string msg = raw;
  EXPECT_FALSE(msg.empty()) << "headsum_last_error() is empty";
  EXPECT_EQ(msg.find(kPrimerTarget), std::string::npos)
      << "headsum_last_error() still holds the previous failure: \"" << msg << "\"";
  if (!e.args.empty()) {
    bool named = false;
    for (const auto& a : e.args) named = named || MentionsWord(msg, a);
    std::string list;
    for (const auto& a : e.args) list += (list.empty() ? "" : " or ") + a;
    EXPECT_TRUE(named) << "message \"" << msg << "\" does not name " << list;
  }
  if (e.value_kind == Expectation::Value::kInteger) {
    bool shown = false;
    std::string list;
    for (const int64_t v : e.int_values) {
      shown = shown || MentionsInteger(msg, v);
      list += (list.empty() ? "" : " or ") + std::to_string(v);
    }
    EXPECT_TRUE(shown) << "message \"" << msg << "\" does not show the value " << list;
  } else if (e.value_kind == Expectation::Value::kFloat) {
    EXPECT_TRUE(MentionsFloat(msg, e.float_value))
        << "message \"" << msg << "\" does not show the value " << e.float_value;
  }
  for (size_t o = 0; o < outputs.size(); ++o) {
    size_t written = 0;
    for (float x : *outputs[o]) written += !(x == kSentinel);
    EXPECT_EQ(written, 0u) << "output #" << o << " was written on a failed call";
  }
}

// ---- the attention family ----------------------------------------------------------

struct AttnApi {
  const char* function;
  std::vector<const char*> inputs;  // pointer argument names, in order
  const char* output;
  bool onednn;
  headsum_status (*call)(const headsum_attn_shape*, const float* const* in, float* out);
};

std::vector<AttnApi> AttentionApis() {
  return {
      {"headsum_qk_scores", {"q", "k"}, "scores", false,
       [](const headsum_attn_shape* s, const float* const* in, float* out) {
         return headsum_qk_scores(s, in[0], in[1], out);
       }},
      {"headsum_softmax_v", {"scores", "v"}, "out", false,
       [](const headsum_attn_shape* s, const float* const* in, float* out) {
         return headsum_softmax_v(s, in[0], in[1], out);
       }},
      {"headsum_attention", {"q", "k", "v"}, "out", false,
       [](const headsum_attn_shape* s, const float* const* in, float* out) {
         return headsum_attention(s, in[0], in[1], in[2], out);
       }},
      {"headsum_qk_scores_onednn", {"q", "k"}, "scores", true,
       [](const headsum_attn_shape* s, const float* const* in, float* out) {
         return headsum_qk_scores_onednn(s, in[0], in[1], out);
       }},
      {"headsum_softmax_v_onednn", {"scores", "v"}, "out", true,
       [](const headsum_attn_shape* s, const float* const* in, float* out) {
         return headsum_softmax_v_onednn(s, in[0], in[1], out);
       }},
      {"headsum_attention_onednn", {"q", "k", "v"}, "out", true,
       [](const headsum_attn_shape* s, const float* const* in, float* out) {
         return headsum_attention_onednn(s, in[0], in[1], in[2], out);
       }},
  };
}

// A valid call: B=2, H=4, Hkv=2, Sq=3, Skv=5, L=8, causal.
headsum_attn_shape ValidAttnShape() { return MhaShape{2, 4, 2, 3, 5, 8, 1, true}.attn(); }

// One invalid variant of the valid call.
struct AttnFault {
  std::string what;
  headsum_attn_shape shape = ValidAttnShape();
  bool null_shape = false;
  int null_input = -1;  // index into AttnApi::inputs
  bool null_output = false;
  Expectation expect;
};

std::vector<AttnFault> AttnFaults(const AttnApi& api) {
  std::vector<AttnFault> faults;
  {
    AttnFault f;
    f.what = "shape = NULL";
    f.null_shape = true;
    f.expect = NamesArg("shape");
    faults.push_back(f);
  }
  for (size_t i = 0; i < api.inputs.size(); ++i) {
    AttnFault f;
    f.what = std::string(api.inputs[i]) + " = NULL";
    f.null_input = int(i);
    f.expect = NamesArg(api.inputs[i]);
    faults.push_back(f);
  }
  {
    AttnFault f;
    f.what = std::string(api.output) + " = NULL";
    f.null_output = true;
    f.expect = NamesArg(api.output);
    faults.push_back(f);
  }
  struct Field {
    const char* name;
    int64_t headsum_attn_shape::*member;
  };
  const Field dims[] = {{"batch", &headsum_attn_shape::batch},
                        {"heads", &headsum_attn_shape::heads},
                        {"seq_q", &headsum_attn_shape::seq_q},
                        {"seq_kv", &headsum_attn_shape::seq_kv},
                        {"head_dim", &headsum_attn_shape::head_dim}};
  for (const Field& field : dims) {
    for (const int64_t bad : {int64_t{0}, int64_t{-1}, int64_t{-98765}}) {
      AttnFault f;
      f.what = std::string(field.name) + " = " + std::to_string(bad);
      f.shape.*field.member = bad;
      // heads alone is wrong: kv_heads 0 means "= heads", not a second fault
      if (field.member == &headsum_attn_shape::heads) f.shape.kv_heads = 0;
      f.expect = NamesArgAndValue(field.name, bad);
      faults.push_back(f);
    }
  }
  for (const int64_t bad : {int64_t{-1}, int64_t{-98765}, int64_t{3}, int64_t{8}}) {
    AttnFault f;  // heads = 4: 3 does not divide it, 8 exceeds it
    f.what = "kv_heads = " + std::to_string(bad) + " with heads = 4";
    f.shape.kv_heads = bad;
    f.expect = NamesArgAndValue("kv_heads", bad);
    faults.push_back(f);
  }
  for (const float bad : {kNaN, kInf, -kInf}) {
    AttnFault f;
    f.what = "scale = " + std::to_string(bad);
    f.shape.scale = bad;
    f.expect = NamesArgAndValue("scale", bad);
    faults.push_back(f);
  }
  // An overflow message may name a dim or the tensor that would be too large.
  std::vector<std::string> dims_or_tensors = {"batch",  "heads",  "kv_heads",
                                              "seq_q",  "seq_kv", "head_dim"};
  dims_or_tensors.insert(dims_or_tensors.end(), api.inputs.begin(), api.inputs.end());
  dims_or_tensors.push_back(api.output);
  {
    AttnFault f;
    f.what = "every dim 2^40 (element counts overflow int64)";
    f.shape = {k2e40, k2e40, k2e40, k2e40, k2e40, k2e40, 0.0f, 1};
    f.expect = NamesOneOfWithOneOfValues(dims_or_tensors, {k2e40});
    faults.push_back(f);
  }
  {
    AttnFault f;  // 2^32 * (2^32 + 1) wraps to 2^32 in 64-bit arithmetic
    f.what = "batch = 2^32, heads = 2^32 + 1 (product wraps to a small count)";
    f.shape = {k2e32, k2e32 + 1, 0, 1, 1, 1, 0.0f, 0};
    f.expect = NamesOneOfWithOneOfValues(dims_or_tensors, {k2e32, k2e32 + 1});
    faults.push_back(f);
  }
  {
    AttnFault f;  // Q has 2^62 elements: fits int64, but 2^64 bytes overflow size_t
    f.what = "seq_q = head_dim = 2^31 (Q's byte size overflows size_t)";
    f.shape = {1, 1, 1, k2e31, 1, k2e31, 0.0f, 0};
    f.expect = NamesOneOfWithOneOfValues(dims_or_tensors, {k2e31});
    faults.push_back(f);
  }
  return faults;
}

class InvalidArguments : public testing::Test {
 protected:
  void TearDown() override {
    headsum_set_target(nullptr);
    headsum_set_num_threads(0);
  }
};

void CheckAttnApi(const AttnApi& api) {
  std::vector<std::vector<float>> inputs;
  for (size_t i = 0; i < api.inputs.size(); ++i) {
    inputs.push_back(RandomUniform(kBufferElems, -1, 1, 900 + i));
  }
  for (const AttnFault& f : AttnFaults(api)) {
    std::vector<float> out = Sentinels(kBufferElems);
    std::vector<const float*> in;
    for (size_t i = 0; i < inputs.size(); ++i) {
      in.push_back(int(i) == f.null_input ? nullptr : inputs[i].data());
    }
    PrimeLastError();
    const headsum_status st = api.call(f.null_shape ? nullptr : &f.shape, in.data(),
                                       f.null_output ? nullptr : out.data());
    ExpectRejected(std::string(api.function) + " with " + f.what, st,
                   HEADSUM_ERR_INVALID_ARGUMENT, f.expect, {&out});
  }
}

// Whether the function serves a valid call (the oneDNN twins return
// UNSUPPORTED when built without oneDNN).
bool Serves(const AttnApi& api) {
  const headsum_attn_shape shape = ValidAttnShape();
  std::vector<float> a = RandomUniform(kBufferElems, -1, 1, 1), b = a, c = a;
  std::vector<float> out(kBufferElems);
  const float* in[3] = {a.data(), b.data(), c.data()};
  return api.call(&shape, in, out.data()) != HEADSUM_ERR_UNSUPPORTED;
}

TEST_F(InvalidArguments, AttentionKernelsRejectNullPointersBadDimsScalesAndOverflow) {
  for (const AttnApi& api : AttentionApis()) {
    if (api.onednn) continue;
    SCOPED_TRACE(api.function);
    CheckAttnApi(api);
  }
}

TEST_F(InvalidArguments, OnednnAttentionTwinsRejectNullPointersBadDimsScalesAndOverflow) {
  int checked = 0;
  for (const AttnApi& api : AttentionApis()) {
    if (!api.onednn || !Serves(api)) continue;
    SCOPED_TRACE(api.function);
    CheckAttnApi(api);
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "built without oneDNN (HEADSUM_WITH_ONEDNN=OFF)";
}

// ---- the projection family -----------------------------------------------------------

// All pointer arguments any projection function takes.
struct ProjArgs {
  const headsum_proj_shape* shape;
  const float *heads, *wo, *bias, *gates, *directions;
  int64_t n_directions;
  float *y, *per_head, *out;
  headsum_wo_packed** packed;  // headsum_wo_pack's output
};

// A handle that no valid call would produce: headsum_wo_pack must leave it.
headsum_wo_packed* const kUntouchedHandle = reinterpret_cast<headsum_wo_packed*>(0x5A5A50);

headsum_proj_shape ValidProjShape();

// Wo packed for ValidProjShape(), for the calls that take a packed Wo (kept
// for the whole test program).
const headsum_wo_packed* ValidPackedWo() {
  static const headsum_wo_packed* packed = [] {
    const headsum_proj_shape shape = ValidProjShape();
    const std::vector<float> wo = RandomUniform(kBufferElems, -1, 1, 6);
    headsum_wo_packed* made = nullptr;
    if (headsum_wo_pack(&shape, wo.data(), &made) != HEADSUM_OK) ADD_FAILURE() << headsum_last_error();
    return made;
  }();
  return packed;
}

struct ProjApi {
  const char* function;
  std::vector<const char*> required;  // pointers that must not be NULL
  std::vector<const char*> outputs;   // which of y, per_head, out it writes
  bool onednn;
  bool takes_directions;
  headsum_status (*call)(const ProjArgs&);
};

std::vector<ProjApi> ProjectionApis() {
  return {
      {"headsum_project_heads_sum", {"shape", "heads", "wo", "y"}, {"y"}, false, false,
       [](const ProjArgs& a) {
         return headsum_project_heads_sum(a.shape, a.heads, a.wo, a.bias, a.y);
       }},
      {"headsum_concat_project_onednn", {"shape", "heads", "wo", "y"}, {"y"}, true, false,
       [](const ProjArgs& a) {
         return headsum_concat_project_onednn(a.shape, a.heads, a.wo, a.bias, a.y);
       }},
      {"headsum_project_heads_sum_ex", {"shape", "heads", "wo"}, {"y", "per_head"}, false, false,
       [](const ProjArgs& a) {
         return headsum_project_heads_sum_ex(a.shape, a.heads, a.wo, a.bias, a.gates, a.y,
                                             a.per_head);
       }},
      {"headsum_head_attribution", {"shape", "heads", "wo", "directions", "out"}, {"out"}, false,
       true,
       [](const ProjArgs& a) {
         return headsum_head_attribution(a.shape, a.heads, a.wo, a.directions, a.n_directions,
                                         a.out);
       }},
      {"headsum_head_contribution_norms", {"shape", "heads", "wo", "out"}, {"out"}, false, false,
       [](const ProjArgs& a) {
         return headsum_head_contribution_norms(a.shape, a.heads, a.wo, a.out);
       }},
      // wo: the packed handle (NULL when the fault nulls wo).
      {"headsum_project_heads_sum_packed", {"shape", "heads", "wo", "y"}, {"y"}, false, false,
       [](const ProjArgs& a) {
         return headsum_project_heads_sum_packed(a.shape, a.heads,
                                                 a.wo ? ValidPackedWo() : nullptr, a.bias, a.y);
       }},
      {"headsum_wo_pack", {"shape", "wo", "packed"}, {}, false, false,
       [](const ProjArgs& a) { return headsum_wo_pack(a.shape, a.wo, a.packed); }},
  };
}

// A valid call: B=2, S=3, H=4, L=5, D=6, R=2.
headsum_proj_shape ValidProjShape() { return {2, 3, 4, 5, 6}; }

struct ProjBuffers {
  ProjBuffers()
      : heads(RandomUniform(kBufferElems, -1, 1, 1)),
        wo(RandomUniform(kBufferElems, -1, 1, 2)),
        bias(RandomUniform(kBufferElems, -1, 1, 3)),
        gates(RandomUniform(kBufferElems, -1, 1, 4)),
        directions(RandomUniform(kBufferElems, -1, 1, 5)),
        y(Sentinels(kBufferElems)),
        per_head(Sentinels(kBufferElems)),
        out(Sentinels(kBufferElems)) {}
  // Valid arguments for `shape`, every optional pointer given.
  ProjArgs Args(const headsum_proj_shape* shape) {
    return {shape,    heads.data(),    wo.data(),  bias.data(), gates.data(), directions.data(),
            2,        y.data(),        per_head.data(), out.data(), &packed};
  }
  std::vector<float> heads, wo, bias, gates, directions, y, per_head, out;
  headsum_wo_packed* packed = kUntouchedHandle;
};

void SetNull(ProjArgs& a, const std::string& name) {
  if (name == "shape") a.shape = nullptr;
  if (name == "heads") a.heads = nullptr;
  if (name == "wo") a.wo = nullptr;
  if (name == "bias") a.bias = nullptr;
  if (name == "gates") a.gates = nullptr;
  if (name == "directions") a.directions = nullptr;
  if (name == "y") a.y = nullptr;
  if (name == "per_head") a.per_head = nullptr;
  if (name == "out") a.out = nullptr;
  if (name == "packed") a.packed = nullptr;
}

struct ProjFault {
  std::string what;
  headsum_proj_shape shape = ValidProjShape();
  std::vector<std::string> null_args;
  int64_t n_directions = 2;
  Expectation expect;
};

std::vector<ProjFault> ProjFaults(const ProjApi& api) {
  std::vector<ProjFault> faults;
  for (const char* name : api.required) {
    ProjFault f;
    f.what = std::string(name) + " = NULL";
    f.null_args = {name};
    f.expect = NamesArg(name);
    faults.push_back(f);
  }
  if (api.outputs.size() == 2) {
    ProjFault f;
    f.what = "y = NULL and per_head = NULL";
    f.null_args = {"y", "per_head"};
    f.expect = NamesOneOf({"y", "per_head"});
    faults.push_back(f);
  }
  struct Field {
    const char* name;
    int64_t headsum_proj_shape::*member;
  };
  const Field dims[] = {{"batch", &headsum_proj_shape::batch},
                        {"seq", &headsum_proj_shape::seq},
                        {"heads", &headsum_proj_shape::heads},
                        {"head_dim", &headsum_proj_shape::head_dim},
                        {"model_dim", &headsum_proj_shape::model_dim}};
  for (const Field& field : dims) {
    for (const int64_t bad : {int64_t{0}, int64_t{-1}, int64_t{-98765}}) {
      ProjFault f;
      f.what = std::string(field.name) + " = " + std::to_string(bad);
      f.shape.*field.member = bad;
      f.expect = NamesArgAndValue(field.name, bad);
      faults.push_back(f);
    }
  }
  if (api.takes_directions) {
    for (const int64_t bad : {int64_t{0}, int64_t{-1}, int64_t{-98765}}) {
      ProjFault f;
      f.what = "n_directions = " + std::to_string(bad);
      f.n_directions = bad;
      f.expect = NamesArgAndValue("n_directions", bad);
      faults.push_back(f);
    }
    ProjFault f;  // directions [R][D] with R = 2^62, D = 1: 2^64 bytes
    f.what = "n_directions = 2^62 (directions' byte size overflows size_t)";
    f.shape = {1, 1, 1, 1, 1};
    f.n_directions = int64_t{1} << 62;
    f.expect = NamesOneOfWithOneOfValues({"n_directions", "model_dim", "directions", "out"},
                                         {int64_t{1} << 62});
    faults.push_back(f);
  }
  // An overflow message may name a dim or the tensor that would be too large.
  std::vector<std::string> dims_or_tensors = {"batch", "seq", "heads", "head_dim", "model_dim",
                                              "wo"};
  dims_or_tensors.insert(dims_or_tensors.end(), api.outputs.begin(), api.outputs.end());
  {
    ProjFault f;
    f.what = "every dim 2^40 (element counts overflow int64)";
    f.shape = {k2e40, k2e40, k2e40, k2e40, k2e40};
    f.expect = NamesOneOfWithOneOfValues(dims_or_tensors, {k2e40});
    faults.push_back(f);
  }
  {
    ProjFault f;  // 2^32 * (2^32 + 1) wraps to 2^32 in 64-bit arithmetic
    f.what = "batch = 2^32, seq = 2^32 + 1 (product wraps to a small count)";
    f.shape = {k2e32, k2e32 + 1, 1, 1, 1};
    f.expect = NamesOneOfWithOneOfValues(dims_or_tensors, {k2e32, k2e32 + 1});
    faults.push_back(f);
  }
  {
    ProjFault f;  // O has 2^62 elements: fits int64, 2^64 bytes overflow size_t
    f.what = "seq = head_dim = 2^31 (O's byte size overflows size_t)";
    f.shape = {1, k2e31, 1, k2e31, 1};
    f.expect = NamesOneOfWithOneOfValues(dims_or_tensors, {k2e31});
    faults.push_back(f);
  }
  {
    ProjFault f;  // Wo has H*L*D = 2^62 elements
    f.what = "head_dim = model_dim = 2^31 (Wo's byte size overflows size_t)";
    f.shape = {1, 1, 1, k2e31, k2e31};
    f.expect = NamesOneOfWithOneOfValues(dims_or_tensors, {k2e31});
    faults.push_back(f);
  }
  return faults;
}

void CheckProjApi(const ProjApi& api) {
  for (const ProjFault& f : ProjFaults(api)) {
    ProjBuffers buf;
    ProjArgs args = buf.Args(&f.shape);
    args.n_directions = f.n_directions;
    for (const auto& name : f.null_args) SetNull(args, name);
    PrimeLastError();
    const headsum_status st = api.call(args);
    ExpectRejected(std::string(api.function) + " with " + f.what, st,
                   HEADSUM_ERR_INVALID_ARGUMENT, f.expect, {&buf.y, &buf.per_head, &buf.out});
    EXPECT_EQ(buf.packed, kUntouchedHandle) << api.function << " with " << f.what
                                            << " wrote its handle";
  }
}

TEST_F(InvalidArguments, ProjectionKernelsRejectNullPointersBadDimsAndOverflow) {
  for (const ProjApi& api : ProjectionApis()) {
    if (api.onednn) continue;
    SCOPED_TRACE(api.function);
    CheckProjApi(api);
  }
}

TEST_F(InvalidArguments, ConcatProjectOnednnRejectsNullPointersBadDimsAndOverflow) {
  for (const ProjApi& api : ProjectionApis()) {
    if (!api.onednn) continue;
    ProjBuffers buf;
    const headsum_proj_shape shape = ValidProjShape();
    if (api.call(buf.Args(&shape)) == HEADSUM_ERR_UNSUPPORTED) {
      GTEST_SKIP() << "built without oneDNN (HEADSUM_WITH_ONEDNN=OFF)";
    }
    CheckProjApi(api);
  }
}

// The NULLs the contract allows: bias (no bias), head_gates (all 1), and one
// (not both) of y and per_head.
TEST_F(InvalidArguments, OptionalPointersMayBeNull) {
  const headsum_proj_shape shape = ValidProjShape();
  for (const ProjApi& api : ProjectionApis()) {
    SCOPED_TRACE(api.function);
    const bool is_ex = api.outputs.size() == 2;
    std::vector<std::vector<std::string>> nullable = {{"bias"}};
    if (is_ex) nullable = {{"bias"}, {"gates"}, {"y"}, {"per_head"}, {"bias", "gates", "y"}};
    for (const auto& names : nullable) {
      ProjBuffers buf;
      ProjArgs args = buf.Args(&shape);
      for (const auto& n : names) SetNull(args, n);
      const headsum_status st = api.call(args);
      if (buf.packed != kUntouchedHandle) headsum_wo_free(buf.packed);
      if (api.onednn && st == HEADSUM_ERR_UNSUPPORTED) continue;
      std::string list;
      for (const auto& n : names) list += n + " ";
      EXPECT_EQ(st, HEADSUM_OK) << "with NULL " << list << ": " << StatusName(st) << ": "
                                << headsum_last_error();
    }
  }
}

// A packed Wo serves only the heads, head_dim and model_dim it was packed
// for; any other shape is rejected, naming the dims and both values.
TEST_F(InvalidArguments, PackedWoRejectsAnotherShape) {
  struct Mismatch {
    const char* dim;
    int64_t headsum_proj_shape::*member;
    int64_t value;
  };
  for (const Mismatch& m : {Mismatch{"heads", &headsum_proj_shape::heads, 2},
                            Mismatch{"head_dim", &headsum_proj_shape::head_dim, 7},
                            Mismatch{"model_dim", &headsum_proj_shape::model_dim, 9}}) {
    headsum_proj_shape shape = ValidProjShape();
    const int64_t packed_value = shape.*m.member;
    shape.*m.member = m.value;
    ProjBuffers buf;
    PrimeLastError();
    const headsum_status st = headsum_project_heads_sum_packed(&shape, buf.heads.data(),
                                                               ValidPackedWo(), nullptr,
                                                               buf.y.data());
    Expectation e = NamesArgAndValue(m.dim, m.value);
    ExpectRejected(std::string("project_heads_sum_packed with ") + m.dim + " = " +
                       std::to_string(m.value),
                   st, HEADSUM_ERR_INVALID_ARGUMENT, e, {&buf.y});
    EXPECT_TRUE(MentionsInteger(headsum_last_error(), packed_value))
        << "message \"" << headsum_last_error() << "\" does not show the packed " << m.dim
        << " = " << packed_value;
  }
}

// ---- the global settings -------------------------------------------------------------

TEST_F(InvalidArguments, NegativeThreadCountIsRejected) {
  for (const int bad : {-1, -98765}) {
    PrimeLastError();
    const headsum_status st = headsum_set_num_threads(bad);
    Expectation e;
    e.value_kind = Expectation::Value::kInteger;
    e.int_values = {bad};
    ExpectRejected("headsum_set_num_threads(" + std::to_string(bad) + ")", st,
                   HEADSUM_ERR_INVALID_ARGUMENT, e, {});
  }
  for (const int ok : {0, 1, 2, 8, 0}) EXPECT_EQ(headsum_set_num_threads(ok), HEADSUM_OK) << ok;
}

TEST_F(InvalidArguments, UnknownTargetNameIsUnsupportedAndKeepsTheTarget) {
  const std::string before = headsum_active_target();
  for (const char* bad : {"bogus", "", "avx2_but_not_really", "SCALAR "}) {
    PrimeLastError();
    const headsum_status st = headsum_set_target(bad);
    Expectation e;  // the message shows the name (a value, not an integer)
    ExpectRejected(std::string("headsum_set_target(\"") + bad + "\")", st,
                   HEADSUM_ERR_UNSUPPORTED, e, {});
    if (*bad != '\0') {
      EXPECT_NE(std::string(headsum_last_error()).find(bad), std::string::npos)
          << "message \"" << headsum_last_error() << "\" does not show the name " << bad;
    }
    EXPECT_EQ(before, headsum_active_target()) << "after set_target(\"" << bad << "\")";
  }
}

}  // namespace
}  // namespace headsum_test
