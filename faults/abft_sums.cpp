// sdctrace's ABFT check of one (batched) product C = beta*D + alpha*A@B on the CPU (faults/abft.py defines it):
// the column sums of C against alpha*(1^T A) B + beta*(1^T D), the row sums against alpha*A (B 1) + beta*(D 1),
// the same checksums over |A|, |B|, |D| for the bound, and the verdict, in float64.
//
// Each operand is read in its own dtype and strides: A once, B twice, C once, D once, with no float64 copy of
// any of them. A large product's passes are split in blocks over torch's intra-op threads (`checks`).
// What the kernel uses of torch, header by header: torch/extension.h (the whole C++ frontend) took 29 of the
// 32 s each kernel took to compile.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace py = pybind11;

namespace {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// No x86-64-v4 clone: its 8-wide float64 reductions ran 15% slower than AVX2's on a training step's operands.
#define SDC_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define SDC_CLONES
#endif

template <typename T>
inline double f64(T v) { return static_cast<double>(static_cast<float>(v)); }  // exact for float, half, bfloat16
template <>
inline double f64<double>(double v) { return v; }

// A batch of r x s matrices: element (q, i, j) at p[q * sq + i * sr + j * ss].
template <typename T>
struct Mat {
  const T* p;
  int64_t batch, r, s, sq, sr, ss;
  const T* at(int64_t q) const { return p + q * sq; }
  Mat t() const { return {p, batch, s, r, sq, ss, sr}; }
};

template <typename T>
Mat<T> mat(const at::Tensor& x, bool transposed = false) {
  const T* p = x.data_ptr<T>();
  Mat<T> m = x.dim() == 3 ? Mat<T>{p, x.size(0), x.size(1), x.size(2), x.stride(0), x.stride(1), x.stride(2)}
                          : Mat<T>{p, 1, x.size(0), x.size(1), 0, x.stride(0), x.stride(1)};
  return transposed ? m.t() : m;
}

// x (..., s) as one matrix (rows, s), where its leading dimensions fold into one stride (no copy, no op run).
bool foldable(const at::Tensor& x) {
  for (int64_t d = 0; d + 2 < x.dim(); ++d)
    if (x.size(d) != 1 && x.stride(d) != x.stride(d + 1) * x.size(d + 1)) return false;
  return x.dim() >= 1;
}

template <typename T>
Mat<T> folded(const at::Tensor& x) {
  int64_t r = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) r *= x.size(d);
  return {x.data_ptr<T>(), 1, r, x.size(-1), 0, x.dim() >= 2 ? x.stride(-2) : 0, x.stride(-1)};
}

// Over one r x s matrix X:  W:  out[i] += sum_j x_ij w[j],  out_abs[i] += sum_j |x_ij| w_abs[j]
//                           CS: cs[j] += sum_i x_ij,         cs_abs[j] += sum_i |x_ij|
// (the sums over |X| only with ABS), one row (or, column-major, one column) at a time. Blocks of four rows read
// fewer float64 vectors per element but ran 1.8x slower on a training step's operands.
template <typename T, bool W, bool CS, bool ABS>
SDC_CLONES void pass(const T* x, int64_t r, int64_t s, int64_t sr, int64_t ss, const double* w, const double* w_abs,
                     double* out, double* out_abs, double* cs, double* cs_abs) {
  if (ss == 1) {
    for (int64_t i = 0; i < r; ++i) {
      const T* xi = x + i * sr;
      double acc = 0, acc_abs = 0;
#pragma omp simd reduction(+ : acc, acc_abs)
      for (int64_t j = 0; j < s; ++j) {
        const double v = f64(xi[j]), m = std::fabs(v);
        if constexpr (W) { acc += v * w[j]; if constexpr (ABS) acc_abs += m * w_abs[j]; }
        if constexpr (CS) { cs[j] += v; if constexpr (ABS) cs_abs[j] += m; }
      }
      if constexpr (W) { out[i] += acc; if constexpr (ABS) out_abs[i] += acc_abs; }
    }
  } else if (sr == 1) {  // column-major: walk the columns, each contiguous
    for (int64_t j = 0; j < s; ++j) {
      const T* xj = x + j * ss;
      const double wj = W ? w[j] : 0, wj_abs = W && ABS ? w_abs[j] : 0;
      double acc = 0, acc_abs = 0;
#pragma omp simd reduction(+ : acc, acc_abs)
      for (int64_t i = 0; i < r; ++i) {
        const double v = f64(xj[i]), m = std::fabs(v);
        if constexpr (W) { out[i] += v * wj; if constexpr (ABS) out_abs[i] += m * wj_abs; }
        if constexpr (CS) { acc += v; if constexpr (ABS) acc_abs += m; }
      }
      if constexpr (CS) { cs[j] += acc; if constexpr (ABS) cs_abs[j] += acc_abs; }
    }
  } else {
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < s; ++j) {
        const double v = f64(x[i * sr + j * ss]), m = std::fabs(v);
        if constexpr (W) { out[i] += v * w[j]; if constexpr (ABS) out_abs[i] += m * w_abs[j]; }
        if constexpr (CS) { cs[j] += v; if constexpr (ABS) cs_abs[j] += m; }
      }
  }
}

// Row sums (rs) and column sums (cs) of one r x s matrix, and with ABS those of |X|: a pass weighted by ones.
template <typename T, bool ABS>
void sums(const T* x, int64_t r, int64_t s, int64_t sr, int64_t ss, double* rs, double* cs, double* rs_abs,
          double* cs_abs) {
  const std::vector<double> ones(s, 1.0);
  pass<T, true, true, ABS>(x, r, s, sr, ss, ones.data(), ones.data(), rs, rs_abs, cs, cs_abs);
}

// residual[c], bound[c] for every check c: the batch's column checks (q * n + j), then its row checks (q * m + i).
struct Checks {
  int64_t batch, m, k, n;
  std::vector<double> residual, bound;
};

// D broadcast to (batch, m, n): its size-1 dimensions are summed as that many copies, never materialised.
template <typename T>
void add_bias(const at::Tensor& d, double beta, Checks& out) {
  TORCH_CHECK(d.dim() <= 3, "sdctrace abft: a bias of ", d.dim(), " dimensions");
  int64_t size[3] = {1, 1, 1}, stride[3] = {0, 0, 0};
  for (int64_t x = 0; x < d.dim(); ++x) {
    size[3 - d.dim() + x] = d.size(x);
    stride[3 - d.dim() + x] = d.size(x) == 1 ? 0 : d.stride(x);
  }
  const int64_t m = out.m, n = out.n, dm = size[1], dn = size[2];
  TORCH_CHECK((size[0] == 1 || size[0] == out.batch) && (dm == 1 || dm == m) && (dn == 1 || dn == n),
              "sdctrace abft: a bias of shape ", d.sizes(), " for a product of ", out.batch, " x ", m, " x ", n);
  // Copies of a row or column; none when the other dimension is empty (a sum over nothing, even of inf, is 0).
  const double col_copies = dm == 1 ? static_cast<double>(m) : 1, row_copies = dn == 1 ? static_cast<double>(n) : 1;
  std::vector<double> rs(dm), cs(dn), rs_abs(dm), cs_abs(dn);
  const T* p = d.data_ptr<T>();
  for (int64_t q = 0; q < out.batch; ++q) {
    if (q == 0 || size[0] != 1) {
      std::fill(rs.begin(), rs.end(), 0.0); std::fill(cs.begin(), cs.end(), 0.0);
      std::fill(rs_abs.begin(), rs_abs.end(), 0.0); std::fill(cs_abs.begin(), cs_abs.end(), 0.0);
      sums<T, true>(p + q * stride[0], dm, dn, stride[1], stride[2], rs.data(), cs.data(), rs_abs.data(),
                    cs_abs.data());
    }
    double* res = out.residual.data();
    double* bnd = out.bound.data();
    if (m > 0)
      for (int64_t j = 0; j < n; ++j) {
        const int64_t from = dn == 1 ? 0 : j;
        res[q * n + j] += beta * (cs[from] * col_copies);
        bnd[q * n + j] += std::fabs(beta) * (cs_abs[from] * col_copies);
      }
    res += out.batch * n;
    bnd += out.batch * n;
    if (n > 0)
      for (int64_t i = 0; i < m; ++i) {
        const int64_t from = dm == 1 ? 0 : i;
        res[q * m + i] += beta * (rs[from] * row_copies);
        bnd[q * m + i] += std::fabs(beta) * (rs_abs[from] * row_copies);
      }
  }
}

// Each pass over an operand is cut into at most kBlocks blocks (of A's and C's rows, of B's rows or columns), a split
// that depends on the shape alone: the partial sums add up in block order, so the bits are the same whatever the
// thread count. Blocks run on torch's intra-op threads, idle while the training waits on the check (a pool of our
// own would spin against them); below kParallelWork elements read, waking them costs more than it saves.
constexpr int64_t kBlocks = 8;
constexpr int64_t kMinRows = 64;
constexpr int64_t kParallelWork = int64_t{1} << 16;

inline int64_t block_start(int64_t size, int64_t blocks, int64_t b) { return size * b / blocks; }

template <typename T>
Checks checks(const Mat<T>& a, const Mat<T>& b, const Mat<T>& c, const c10::optional<at::Tensor>& d, double alpha,
              double beta, double scale) {
  const int64_t batch = a.batch, m = a.r, k = a.s, n = b.s;
  TORCH_CHECK(b.batch == batch && b.r == k && c.batch == batch && c.r == m && c.s == n,
              "sdctrace abft: operands of ", batch, " x ", m, " x ", k, ", ", b.batch, " x ", b.r, " x ", n,
              " and a result of ", c.batch, " x ", c.r, " x ", c.s);
  const int64_t total = batch * (n + m);
  Checks out{batch, m, k, n, std::vector<double>(total), std::vector<double>(total)};
  double* res = out.residual.data();  // the expected checksums until the last loop below
  double* bnd = out.bound.data();     // the magnitude checksums until then
  const int64_t blocks = batch >= kBlocks ? 1 : std::clamp<int64_t>(std::max(m, n) / kMinRows, 1, kBlocks);
  const int64_t tasks = batch * blocks;
  const bool parallel = batch * (m * k + 2 * k * n + m * n) >= kParallelWork && !at::in_parallel_region();
  auto run_tasks = [&](auto&& task) {
    auto range = [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) task(t / blocks, t % blocks);
    };
    if (parallel)
      at::parallel_for(0, tasks, 1, range);
    else
      range(0, tasks);
  };
  const Mat<T> bt = b.t();  // (n x k): its column sums are B 1
  std::vector<double> b_rows(2 * batch * k);  // per product: B 1, then |B| 1
  std::vector<double> a_parts(2 * tasks * k), c_parts(tasks * n);  // per block: 1^T A, 1^T |A|; 1^T C
  std::vector<double> c_sums(total), ones(std::max(n, int64_t{1}), 1.0);
  run_tasks([&](int64_t q, int64_t blk) {  // B 1 over a block of B's rows
    const int64_t k0 = block_start(k, blocks, blk), k1 = block_start(k, blocks, blk + 1);
    double* sums = b_rows.data() + 2 * q * k;
    pass<T, false, true, true>(bt.at(q) + k0 * bt.ss, n, k1 - k0, bt.sr, bt.ss, nullptr, nullptr, nullptr, nullptr,
                               sums + k0, sums + k + k0);
  });
  run_tasks([&](int64_t q, int64_t blk) {  // a block of A's and C's rows
    const int64_t i0 = block_start(m, blocks, blk), i1 = block_start(m, blocks, blk + 1);
    const double* sums = b_rows.data() + 2 * q * k;
    double* a_part = a_parts.data() + 2 * (q * blocks + blk) * k;
    pass<T, true, true, true>(a.at(q) + i0 * a.sr, i1 - i0, k, a.sr, a.ss, sums, sums + k, res + batch * n + q * m + i0,
                              bnd + batch * n + q * m + i0, a_part, a_part + k);
    pass<T, true, true, false>(c.at(q) + i0 * c.sr, i1 - i0, n, c.sr, c.ss, ones.data(), nullptr,
                               c_sums.data() + batch * n + q * m + i0, nullptr, c_parts.data() + (q * blocks + blk) * n,
                               nullptr);
  });
  for (int64_t q = 0; q < batch; ++q)  // the blocks' column sums, in block order
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const double* a_part = a_parts.data() + 2 * (q * blocks + blk) * k;
      double* a_sums = a_parts.data() + 2 * q * blocks * k;
      if (blk > 0)
        for (int64_t x = 0; x < 2 * k; ++x) a_sums[x] += a_part[x];
      const double* c_part = c_parts.data() + (q * blocks + blk) * n;
      for (int64_t j = 0; j < n; ++j) c_sums[q * n + j] += c_part[j];
    }
  run_tasks([&](int64_t q, int64_t blk) {  // (1^T A) B over a block of B's columns
    const int64_t j0 = block_start(n, blocks, blk), j1 = block_start(n, blocks, blk + 1);
    const double* a_sums = a_parts.data() + 2 * q * blocks * k;
    pass<T, true, false, true>(bt.at(q) + j0 * bt.sr, j1 - j0, k, bt.sr, bt.ss, a_sums, a_sums + k,
                               res + q * n + j0, bnd + q * n + j0, nullptr, nullptr);
  });
  if (alpha != 1)
    for (int64_t x = 0; x < total; ++x) { res[x] *= alpha; bnd[x] *= std::fabs(alpha); }
  if (d.has_value()) add_bias<T>(*d, beta, out);
  for (int64_t x = 0; x < total; ++x) {
    res[x] = std::fabs(c_sums[x] - res[x]);
    bnd[x] *= scale;
  }
  return out;
}

// A CPU tensor whose bytes are there to read: not a Python subclass (fake, functional) nor a lazy view.
bool supported(const at::Tensor& x, at::ScalarType dtype) {
  return x.device().is_cpu() && x.layout() == at::kStrided && x.scalar_type() == dtype && x.has_storage() &&
         !x.key_set().has(c10::DispatchKey::Python) && !x.is_neg() && !x.is_conj();
}

// The checks of one call, or none when the kernel does not take these tensors (the caller then uses torch ops).
// `linear`: a is (..., k) and b is a weight (n, k), as aten.linear takes them; otherwise a, b, c are 2-D or 3-D.
c10::optional<Checks> run(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                          const c10::optional<at::Tensor>& d, double alpha, double beta, double scale, bool linear) {
  const auto dtype = c.scalar_type();
  if (!(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16)) return {};
  if (!supported(a, dtype) || !supported(b, dtype) || !supported(c, dtype)) return {};
  if (d.has_value() && !supported(*d, dtype)) return {};
  if (linear) {
    TORCH_CHECK(b.dim() == 2, "sdctrace abft: linear of ", a.sizes(), " by ", b.sizes());
    if (!foldable(a) || !foldable(c)) return {};
  } else {
    TORCH_CHECK(a.dim() == b.dim() && a.dim() == c.dim() && (a.dim() == 2 || a.dim() == 3),
                "sdctrace abft: operands of ", a.sizes(), ", ", b.sizes(), " and a result of ", c.sizes());
  }
  c10::optional<Checks> out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "abft_checks", [&] {
    using M = Mat<scalar_t>;
    const M ma = linear ? folded<scalar_t>(a) : mat<scalar_t>(a), mc = linear ? folded<scalar_t>(c) : mat<scalar_t>(c);
    out = checks<scalar_t>(ma, mat<scalar_t>(b, linear), mc, d, alpha, beta, scale);
  });
  return out;
}

// (m, k, n, residual, bound, flagged) at the worst check, or None. The worst is torch.argmax's over the scores
// inf (over a finite bound), else residual / bound where bound > 0, else 0; NaN counts as the largest and the
// first of equals wins, as with torch.argmax.
py::object check(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, const c10::optional<at::Tensor>& d,
                 double alpha, double beta, double scale, bool linear) {
  c10::optional<Checks> got;
  {
    py::gil_scoped_release release;
    got = run(a, b, c, d, alpha, beta, scale, linear);
  }
  if (!got) return py::none();
  const Checks& x = *got;
  double residual = 0, bound = 0, worst = -1;
  bool flagged = false;
  for (size_t i = 0; i < x.residual.size(); ++i) {
    const double r = x.residual[i], u = x.bound[i];
    const bool bad = std::isfinite(u) && !(r <= u);
    const double score = bad ? std::numeric_limits<double>::infinity() : (u > 0 ? r / u : 0.0);
    flagged = flagged || bad;
    if (std::isnan(worst)) continue;
    if (std::isnan(score) || score > worst) { worst = score; residual = r; bound = u; }
  }
  return py::make_tuple(x.m, x.k, x.n, residual, bound, flagged);
}

// Every check's (residual, bound) as float64 tensors, or None: what `check` reduces, for tests.
py::object residuals(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                     const c10::optional<at::Tensor>& d, double alpha, double beta, double scale, bool linear) {
  auto got = run(a, b, c, d, alpha, beta, scale, linear);
  if (!got) return py::none();
  const auto size = static_cast<int64_t>(got->residual.size());
  auto residual = at::empty({size}, at::kDouble), bound = at::empty({size}, at::kDouble);
  std::copy(got->residual.begin(), got->residual.end(), residual.data_ptr<double>());
  std::copy(got->bound.begin(), got->bound.end(), bound.data_ptr<double>());
  return py::make_tuple(residual, bound);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("check", &check, "the worst ABFT check of one product: (m, k, n, residual, bound, flagged), or None");
  m.def("residuals", &residuals, "every ABFT check's residual and bound, or None");
}
