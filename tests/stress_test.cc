// Concurrency: the C API is called from many application threads at once.
//  - 8 std::threads call every kernel at once, each on its own outputs, for a
//    bounded time, and every result must be bitwise the result computed
//    beforehand on one thread (results are deterministic per target);
//  - the same while another thread keeps changing headsum_set_num_threads
//    (the result does not depend on the thread count);
//  - the same while another thread keeps changing the target: every result
//    must be bitwise one target's result ("a call already running finishes
//    on the target it started with");
//  - headsum_last_error stays per thread while 8 threads fail at once: each
//    thread reads the message of its own last failure, naming its own value.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "headsum/headsum.h"
#include "shapes.h"
#include "test_util.h"

namespace headsum_test {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kThreads = 8;

// One kernel call on fixed, shared, read-only inputs, writing `out_elems`
// floats to the given buffer.
struct Job {
  std::string name;
  size_t out_elems;
  std::function<headsum_status(float* out)> run;
};

struct SharedInputs {
  std::vector<float> q, k, v, scores, heads, wo, bias, gates, dirs;
  headsum_attribution_basis* basis = nullptr;  // shared by every thread
  ~SharedInputs() { headsum_attribution_basis_free(basis); }
};

constexpr int64_t kDirections = 3;

// Shapes that reach every tiling path and are quick: GQA causal with a ragged
// last tile, decode with keys split across work items, MHA with D != H*L.
std::vector<MhaShape> StressShapes() {
  return {
      MhaShape{1, 4, 2, 17, 65, 16, 33, true},
      MhaShape{2, 2, 1, 1, 1025, 16, 17, false},
      MhaShape{1, 3, 0, 20, 20, 7, 96, false},
  };
}

std::vector<Job> JobsFor(const MhaShape& s, uint64_t seed,
                         std::vector<std::shared_ptr<SharedInputs>>* keep) {
  auto in = std::make_shared<SharedInputs>();
  in->q = RandomUniform(s.q_elems(), -1, 1, 16 * seed + 1);
  in->k = RandomUniform(s.kv_elems(), -1, 1, 16 * seed + 2);
  in->v = RandomUniform(s.kv_elems(), -1, 1, 16 * seed + 3);
  in->scores = RandomUniform(s.scores_elems(), -4, 4, 16 * seed + 4);
  in->heads = RandomUniform(s.out_elems(), -1, 1, 16 * seed + 5);
  in->wo = RandomUniform(s.wo_elems(), -1, 1, 16 * seed + 6);
  in->bias = RandomUniform(size_t(s.model_dim), -1, 1, 16 * seed + 7);
  in->gates = RandomUniform(size_t(s.heads), -1.5f, 1.5f, 16 * seed + 8);
  in->dirs = RandomUniform(size_t(kDirections * s.model_dim), -1, 1, 16 * seed + 9);
  keep->push_back(in);
  const headsum_attn_shape a = s.attn();
  const headsum_proj_shape p = s.proj();
  const size_t rows = size_t(s.batch * s.seq_q * s.heads);
  const SharedInputs* x = in.get();
  const std::string at = " at " + s.name();
  return {
      {"qk_scores" + at, s.scores_elems(),
       [=](float* out) { return headsum_qk_scores(&a, x->q.data(), x->k.data(), out); }},
      {"softmax_v" + at, s.out_elems(),
       [=](float* out) { return headsum_softmax_v(&a, x->scores.data(), x->v.data(), out); }},
      {"attention" + at, s.out_elems(),
       [=](float* out) {
         return headsum_attention(&a, x->q.data(), x->k.data(), x->v.data(), out);
       }},
      {"project_heads_sum" + at, s.y_elems(),
       [=](float* out) {
         return headsum_project_heads_sum(&p, x->heads.data(), x->wo.data(), x->bias.data(),
                                          out);
       }},
      {"project_heads_sum_ex(y, per_head, gates)" + at, s.y_elems() + s.per_head_elems(),
       [=](float* out) {
         return headsum_project_heads_sum_ex(&p, x->heads.data(), x->wo.data(), x->bias.data(),
                                             x->gates.data(), out, out + s.y_elems());
       }},
      {"head_attribution" + at, rows * kDirections,
       [=](float* out) {
         return headsum_head_attribution(&p, x->heads.data(), x->wo.data(), x->dirs.data(),
                                         kDirections, out);
       }},
      {"head_attribution_basis (own basis)" + at, rows * kDirections,
       [=](float* out) {
         headsum_attribution_basis* basis = nullptr;
         headsum_status st =
             headsum_attribution_basis_create(&p, x->wo.data(), x->dirs.data(), kDirections,
                                              &basis);
         if (st != HEADSUM_OK) return st;
         st = headsum_head_attribution_basis(&p, x->heads.data(), basis, out);
         headsum_attribution_basis_free(basis);
         return st;
       }},
      {"head_attribution_basis (shared basis)" + at, rows * kDirections,
       [=](float* out) {
         return headsum_head_attribution_basis(&p, x->heads.data(), x->basis, out);
       }},
      {"head_contribution_norms" + at, rows,
       [=](float* out) {
         return headsum_head_contribution_norms(&p, x->heads.data(), x->wo.data(), out);
       }},
  };
}

struct Workload {
  std::vector<std::shared_ptr<SharedInputs>> inputs;
  std::vector<Job> jobs;
};

Workload MakeWorkload() {
  Workload w;
  const std::vector<MhaShape> shapes = StressShapes();
  for (size_t n = 0; n < shapes.size(); ++n) {
    for (Job& j : JobsFor(shapes[n], 70 + n, &w.inputs)) w.jobs.push_back(std::move(j));
  }
  // The shared bases, made once before any thread starts.
  for (size_t n = 0; n < shapes.size(); ++n) {
    const headsum_proj_shape p = shapes[n].proj();
    SharedInputs& in = *w.inputs[n];
    EXPECT_EQ(headsum_attribution_basis_create(&p, in.wo.data(), in.dirs.data(), kDirections,
                                               &in.basis),
              HEADSUM_OK)
        << headsum_last_error();
  }
  return w;
}

// Every job's result on the active target, computed on one thread.
std::vector<std::vector<float>> ExpectedResults(const std::vector<Job>& jobs) {
  EXPECT_EQ(headsum_set_num_threads(1), HEADSUM_OK);
  std::vector<std::vector<float>> expected;
  for (const Job& j : jobs) {
    std::vector<float> out = Sentinels(j.out_elems);
    const headsum_status st = j.run(out.data());
    EXPECT_EQ(st, HEADSUM_OK) << j.name << ": " << StatusName(st) << ": "
                              << headsum_last_error();
    expected.push_back(std::move(out));
  }
  EXPECT_EQ(headsum_set_num_threads(0), HEADSUM_OK);
  return expected;
}

// What the worker threads found.
struct Findings {
  std::mutex mu;
  std::vector<std::string> failures;  // first few
  std::atomic<long> calls{0};
  std::atomic<long> bad{0};
  void Report(const std::string& what) {
    bad.fetch_add(1);
    std::lock_guard<std::mutex> lock(mu);
    if (failures.size() < 10) failures.push_back(what);
  }
};

// Runs the jobs on `workers` threads until `duration` has passed (each thread
// does at least one full round of every job), comparing every result with
// `matches`.  `side` (if any) runs on one more thread until the workers stop.
void Hammer(const std::vector<Job>& jobs, int workers, std::chrono::milliseconds duration,
            const std::function<bool(size_t job, const std::vector<float>& out)>& matches,
            const std::function<void(const std::atomic<bool>& stop)>& side, Findings* f) {
  std::atomic<bool> stop{false};
  std::atomic<int> running{workers};
  const Clock::time_point deadline = Clock::now() + duration;
  std::vector<std::thread> threads;
  for (int t = 0; t < workers; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::vector<float>> outs(jobs.size());
      for (size_t j = 0; j < jobs.size(); ++j) outs[j].resize(jobs[j].out_elems);
      for (size_t round = 0;; ++round) {
        if (round > 0 && Clock::now() >= deadline) break;
        for (size_t n = 0; n < jobs.size(); ++n) {
          const size_t j = (n + size_t(t) * 5 + round) % jobs.size();  // threads out of step
          std::vector<float>& out = outs[j];
          std::fill(out.begin(), out.end(), kSentinel);
          const headsum_status st = jobs[j].run(out.data());
          f->calls.fetch_add(1);
          if (st != HEADSUM_OK) {
            f->Report("thread " + std::to_string(t) + ": " + jobs[j].name + " returned " +
                      StatusName(st) + ": " + headsum_last_error());
          } else if (!matches(j, out)) {
            f->Report("thread " + std::to_string(t) + ", round " + std::to_string(round) +
                      ": " + jobs[j].name + " differs bitwise from the single-threaded result");
          }
        }
      }
      if (running.fetch_sub(1) == 1) stop.store(true);
    });
  }
  std::thread side_thread;
  if (side) side_thread = std::thread([&] { side(stop); });
  for (std::thread& t : threads) t.join();
  stop.store(true);
  if (side_thread.joinable()) side_thread.join();
}

std::string Summary(Findings& f) {
  std::string s = std::to_string(f.bad.load()) + " of " + std::to_string(f.calls.load()) +
                  " calls failed or differed";
  for (const std::string& x : f.failures) s += "\n  " + x;
  return s;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class Stress : public TargetTest {
 protected:
  void TearDown() override {
    EXPECT_EQ(headsum_set_num_threads(0), HEADSUM_OK);
    TargetTest::TearDown();
  }
};

TEST_P(Stress, EightThreadsCallingEveryKernelAtOnceGetTheSingleThreadedResult) {
  const Workload w = MakeWorkload();
  const auto expected = ExpectedResults(w.jobs);
  Findings f;
  Hammer(w.jobs, kThreads, std::chrono::milliseconds(250),
         [&](size_t j, const std::vector<float>& out) { return SameBits(out, expected[j]); },
         nullptr, &f);
  EXPECT_EQ(f.bad.load(), 0) << Summary(f);
  std::printf("[ STRESS   ] %s: %ld calls on %d threads\n", GetParam().c_str(), f.calls.load(),
              kThreads);
}

TEST_P(Stress, ChangingTheThreadCountWhileOthersRunChangesNoResult) {
  const Workload w = MakeWorkload();
  const auto expected = ExpectedResults(w.jobs);
  Findings f;
  std::atomic<long> changes{0};
  Hammer(w.jobs, kThreads - 1, std::chrono::milliseconds(150),
         [&](size_t j, const std::vector<float>& out) { return SameBits(out, expected[j]); },
         [&](const std::atomic<bool>& stop) {
           const int counts[] = {1, 2, 3, 8, 0, 5, 1, 16};
           for (size_t n = 0; !stop.load(); ++n) {
             if (headsum_set_num_threads(counts[n % 8]) != HEADSUM_OK) {
               f.Report(std::string("headsum_set_num_threads failed: ") + headsum_last_error());
             }
             changes.fetch_add(1);
             std::this_thread::sleep_for(std::chrono::microseconds(200));
           }
         },
         &f);
  EXPECT_EQ(f.bad.load(), 0) << Summary(f);
  EXPECT_GT(changes.load(), 0);
}

HEADSUM_INSTANTIATE_FOR_COMPILED_TARGETS(Stress);

// Not per target: one thread cycles through every runnable target while the
// others run; a call finishes on the target it started with, so each result
// is bitwise the result of some target.
TEST(StressTargets, ChangingTheTargetWhileOthersRunGivesSomeTargetsExactResult) {
  std::vector<std::string> runnable;
  for (const std::string& t : CompiledTargetNames()) {
    if (headsum_set_target(t.c_str()) == HEADSUM_OK) runnable.push_back(t);
  }
  ASSERT_EQ(headsum_set_target(nullptr), HEADSUM_OK);
  if (runnable.size() < 2) GTEST_SKIP() << "fewer than two runnable targets";
  Workload w = MakeWorkload();
  // Creating a basis and using it are two calls, which may run on different
  // targets: no single target's result to compare with.
  w.jobs.erase(std::remove_if(w.jobs.begin(), w.jobs.end(),
                              [](const Job& j) {
                                return j.name.find("(own basis)") != std::string::npos;
                              }),
               w.jobs.end());
  std::vector<std::vector<std::vector<float>>> expected;  // [target][job]
  for (const std::string& t : runnable) {
    ASSERT_EQ(headsum_set_target(t.c_str()), HEADSUM_OK);
    expected.push_back(ExpectedResults(w.jobs));
  }
  Findings f;
  Hammer(w.jobs, kThreads - 1, std::chrono::milliseconds(400),
         [&](size_t j, const std::vector<float>& out) {
           for (const auto& per_target : expected) {
             if (SameBits(out, per_target[j])) return true;
           }
           return false;
         },
         [&](const std::atomic<bool>& stop) {
           for (size_t n = 0; !stop.load(); ++n) {
             if (headsum_set_target(runnable[n % runnable.size()].c_str()) != HEADSUM_OK) {
               f.Report(std::string("headsum_set_target failed: ") + headsum_last_error());
             }
             std::this_thread::sleep_for(std::chrono::microseconds(100));
           }
         },
         &f);
  EXPECT_EQ(headsum_set_target(nullptr), HEADSUM_OK);
  EXPECT_EQ(f.bad.load(), 0) << Summary(f);
}

// Each thread fails with its own values, over and over, in several functions;
// right after each failure (and after a successful call that follows it) its
// headsum_last_error names its own value, never another thread's.
TEST(StressLastError, ConcurrentFailuresEachReadTheirOwnMessage) {
  std::atomic<long> checked{0}, wrong{0};
  std::mutex mu;
  std::vector<std::string> examples;
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(300);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const float one = 1.0f;
      float sink[4] = {0, 0, 0, 0};
      const headsum_attn_shape ok_attn = MhaShape{1, 1, 1, 1, 1, 1, 1, false}.attn();
      for (long n = 0; n < 200 || Clock::now() < deadline; ++n) {
        // A value no other thread uses: -(1000000 * (t + 1) + n).
        const int64_t bad = -(int64_t{1000000} * (t + 1) + n % 1000000);
        headsum_status st = HEADSUM_OK;
        std::string arg;
        switch (n % 4) {
          case 0: {
            const headsum_attn_shape s = MhaShape{1, 1, 1, 1, 1, bad, 1, false}.attn();
            st = headsum_qk_scores(&s, &one, &one, sink);
            arg = "head_dim";
            break;
          }
          case 1: {
            const headsum_attn_shape s = MhaShape{1, 1, 1, 1, bad, 1, 1, false}.attn();
            st = headsum_softmax_v(&s, &one, &one, sink);
            arg = "seq_kv";
            break;
          }
          case 2: {
            const headsum_proj_shape p = {1, 1, 1, 1, bad};
            st = headsum_project_heads_sum(&p, &one, &one, nullptr, sink);
            arg = "model_dim";
            break;
          }
          default:
            st = headsum_set_num_threads(int(bad));
            arg = "n";
            break;
        }
        std::string msg = headsum_last_error();
        const std::string value = std::to_string(bad);
        bool ok = st == HEADSUM_ERR_INVALID_ARGUMENT && msg.find(value) != std::string::npos;
        // The message of the last failure survives a successful call.
        if (ok && n % 8 == 1) {
          ok = headsum_attention(&ok_attn, &one, &one, &one, sink) == HEADSUM_OK;
          msg = headsum_last_error();
          ok = ok && msg.find(value) != std::string::npos;
        }
        checked.fetch_add(1);
        if (!ok) {
          wrong.fetch_add(1);
          std::lock_guard<std::mutex> lock(mu);
          if (examples.size() < 8) {
            examples.push_back("thread " + std::to_string(t) + " (" + arg + " = " + value +
                               "): status " + StatusName(st) + ", message \"" + msg + "\"");
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(headsum_set_num_threads(0), HEADSUM_OK);
  std::string list;
  for (const std::string& e : examples) list += "\n  " + e;
  EXPECT_EQ(wrong.load(), 0) << wrong.load() << " of " << checked.load()
                             << " messages were not the thread's own:" << list;
  std::printf("[ STRESS   ] %ld failing calls checked on %d threads\n", checked.load(),
              kThreads);
}

}  // namespace
}  // namespace headsum_test
