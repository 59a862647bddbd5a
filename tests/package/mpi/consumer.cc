// C++ against the installed headsum::mpi: a small layer whose heads are
// split across the ranks (one kv group each), run with
// headsum_mha_forward_allreduce and checked on every rank against the whole
// layer's headsum_mha_forward.
#include <headsum/headsum_mpi.h>

#include <cmath>
#include <cstdio>
#include <vector>

namespace {

constexpr int64_t kDm = 16, kH = 4, kHkv = 2, kL = 8, kS = 5;

float Value(int64_t i, int64_t j, float phase) {
  return 0.25f * std::sin(0.37f * float(i) + 0.11f * float(j) + phase);
}

// A [rows][cols] matrix of Value(i, j + col0), i.e. columns col0.. of the
// whole one.
std::vector<float> Matrix(int64_t rows, int64_t cols, int64_t col0, float phase) {
  std::vector<float> m(size_t(rows * cols));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) m[size_t(i * cols + j)] = Value(i, j + col0, phase);
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  int failed = 0;
  if (kHkv % ranks != 0) {
    if (rank == 0) std::fprintf(stderr, "MPI consumer: needs a rank count dividing %d\n", int(kHkv));
    MPI_Finalize();
    return 1;
  }
  const headsum_mha_config config = {kDm, kH, kHkv, kL, 1, 10000.0f, HEADSUM_F32, HEADSUM_F32};
  const int64_t per = kH / ranks, group = kH / kHkv;
  const int64_t h0 = rank * per, kv0 = h0 / group, kv_per = per / group;

  // The whole layer's weights (wq, wk, wv column blocks per head; wo's row
  // blocks per head are its whole rows), and this rank's slices of them.
  const std::vector<float> wq = Matrix(kDm, kH * kL, 0, 0.0f);
  const std::vector<float> wk = Matrix(kDm, kHkv * kL, 0, 1.0f);
  const std::vector<float> wv = Matrix(kDm, kHkv * kL, 0, 2.0f);
  std::vector<float> wo(static_cast<size_t>(kH * kL * kDm));
  for (size_t i = 0; i < wo.size(); ++i) wo[i] = Value(int64_t(i) / kDm, int64_t(i) % kDm, 3.0f);
  std::vector<float> bo(static_cast<size_t>(kDm));
  for (int64_t j = 0; j < kDm; ++j) bo[size_t(j)] = 0.1f * float(j);
  const std::vector<float> wq_s = Matrix(kDm, per * kL, h0 * kL, 0.0f);
  const std::vector<float> wk_s = Matrix(kDm, kv_per * kL, kv0 * kL, 1.0f);
  const std::vector<float> wv_s = Matrix(kDm, kv_per * kL, kv0 * kL, 2.0f);
  const std::vector<float> wo_s(wo.begin() + h0 * kL * kDm, wo.begin() + (h0 + per) * kL * kDm);

  std::vector<float> x(size_t(kS * kDm));
  for (size_t i = 0; i < x.size(); ++i) x[i] = Value(int64_t(i), 7, 4.0f);
  std::vector<float> y(x.size()), y_ref(x.size());

  headsum_mha *shard = nullptr, *whole = nullptr;
  if (headsum_mha_create_shard(&config, h0, h0 + per, wq_s.data(), wk_s.data(), wv_s.data(),
                               wo_s.data(), nullptr, nullptr, nullptr, bo.data(),
                               &shard) != HEADSUM_OK ||
      headsum_mha_create(&config, wq.data(), wk.data(), wv.data(), wo.data(), nullptr, nullptr,
                         nullptr, bo.data(), &whole) != HEADSUM_OK ||
      headsum_mha_forward(whole, nullptr, 1, kS, x.data(), y_ref.data()) != HEADSUM_OK) {
    std::fprintf(stderr, "rank %d: %s\n", rank, headsum_last_error());
    failed = 1;
  }
  // Collective: every rank calls it, even one whose shard failed (it then
  // refuses on every rank).
  if (headsum_mha_forward_allreduce(shard, nullptr, 1, kS, x.data(), y.data(),
                                    MPI_COMM_WORLD) != HEADSUM_OK) {
    std::fprintf(stderr, "rank %d: forward_allreduce: %s\n", rank, headsum_last_error());
    failed = 1;
  }
  for (size_t i = 0; !failed && i < y.size(); ++i) {
    if (!(std::fabs(y[i] - y_ref[i]) <= 1e-5f + 1e-4f * std::fabs(y_ref[i]))) {
      std::fprintf(stderr, "rank %d: y[%zu] = %g, the whole layer gives %g\n", rank, i,
                   double(y[i]), double(y_ref[i]));
      failed = 1;
    }
  }
  headsum_mha_free(shard);
  headsum_mha_free(whole);
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && !any_failed) {
    std::printf("MPI consumer: headsum %s, %d ranks: the all-reduced layer matches\n",
                headsum_version(), ranks);
  }
  MPI_Finalize();
  return any_failed;
}
