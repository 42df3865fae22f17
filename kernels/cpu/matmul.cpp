#include <algorithm>
#include <thread>
#include <vector>

#include "kernels/cpu/dot.hpp"
#include "kernels/cpu_ops.hpp"

namespace rlserve::kernels {

namespace {

// Rows of w sharing one pass over a row of x (see kernels/cpu/dot.hpp for the register budget).
constexpr int64_t k_rows = 4;
// Rows of w per cache panel: 64 rows of k floats are walked for every row of x before moving on,
// so the panel stays in L2 (k = 4096: 1 MiB) while x streams.
constexpr int64_t k_panel = 64;
// Below this many multiply-adds a thread costs more to start than it saves.
constexpr int64_t k_work_per_thread = int64_t{1} << 21;

// Columns [j0, j1) of y for every row.
void matmul_columns(const matmul_args& a, int64_t j0, int64_t j1) {
  for (int64_t jp = j0; jp < j1; jp += k_panel) {
    const int64_t jp_end = std::min(jp + k_panel, j1);
    for (int64_t i = 0; i < a.m; ++i) {
      const float* x = a.x + i * a.k;
      float* y = a.y + i * a.n;
      int64_t j = jp;
      for (; j + k_rows <= jp_end; j += k_rows)
        cpu::dot_rows<k_rows>(x, a.w + j * a.k, a.k, a.k, y + j);
      for (; j < jp_end; ++j)
        cpu::dot_rows<1>(x, a.w + j * a.k, a.k, a.k, y + j);
    }
  }
}

} // namespace

kernel_status matmul_can_implement(const matmul_args& args) {
  if (args.m < 0 || args.n < 0 || args.k < 0 || args.threads < 0)
    return kernel_status::invalid_problem;
  if (args.m > 0 && args.n > 0 && (args.x == nullptr || args.w == nullptr || args.y == nullptr))
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

kernel_status matmul_cpu(const matmul_args& args) {
  if (auto s = matmul_can_implement(args); s != kernel_status::ok)
    return s;
  if (args.m == 0 || args.n == 0)
    return kernel_status::ok;
  int64_t threads = args.threads;
  if (threads == 0) {
    const int64_t work = args.m * args.n * std::max<int64_t>(args.k, 1);
    const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
    threads = std::clamp<int64_t>(work / k_work_per_thread, 1, hw);
  }
  // Each thread owns whole groups of k_rows columns so the blocking (and the result) is the same
  // as with one thread.
  threads = std::min(threads, (args.n + k_rows - 1) / k_rows);
  if (threads <= 1) {
    matmul_columns(args, 0, args.n);
    return kernel_status::ok;
  }
  const int64_t groups = (args.n + k_rows - 1) / k_rows;
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  int64_t j0 = 0;
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t g1 = groups * (t + 1) / threads;
    const int64_t j1 = std::min(args.n, g1 * k_rows);
    if (t + 1 == threads)
      matmul_columns(args, j0, j1); // the calling thread takes the last share
    else {
      try {
        pool.emplace_back(matmul_columns, std::cref(args), j0, j1);
      } catch (...) { // no thread to be had: do this share here rather than fail the forward
        matmul_columns(args, j0, j1);
      }
    }
    j0 = j1;
  }
  for (auto& th : pool)
    th.join();
  return kernel_status::ok;
}

} // namespace rlserve::kernels
