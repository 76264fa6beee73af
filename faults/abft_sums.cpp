// sdctrace's ABFT check of one (batched) product C = beta*D + alpha*A@B on the CPU (faults/abft.py defines it):
// the column sums of C against alpha*(1^T A) B + beta*(1^T D), the row sums against alpha*A (B 1) + beta*(D 1),
// the same checksums over |A|, |B|, |D| for the bound, and the verdict, in float64.
//
// Each operand is read in its own dtype and strides: A once, B twice, C once, D once, with no float64 copy of
// any of them. Single-threaded on the caller's thread, like the digest kernel: the training waits on the
// check, and a pool of our own would spin against the training's OpenMP threads.
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace py = pybind11;

namespace {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SDC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SDC_CLONES
#endif
// The blocks below are inlined into each clone of `pass`, so they are compiled for its instruction set.
#define SDC_INLINE inline __attribute__((always_inline))

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
// Four rows (or columns) at a time, so each load and store of a float64 vector serves four elements.

// Rows 0..3 of a row-major X (unit column stride).
template <typename T, bool W, bool CS, bool ABS>
SDC_INLINE void four_rows(const T* x, int64_t s, int64_t sr, const double* w, const double* w_abs, double* out,
                      double* out_abs, double* cs, double* cs_abs) {
  const T *x0 = x, *x1 = x + sr, *x2 = x + 2 * sr, *x3 = x + 3 * sr;
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0, b0 = 0, b1 = 0, b2 = 0, b3 = 0;
#pragma omp simd reduction(+ : a0, a1, a2, a3, b0, b1, b2, b3)
  for (int64_t j = 0; j < s; ++j) {
    const double v0 = f64(x0[j]), v1 = f64(x1[j]), v2 = f64(x2[j]), v3 = f64(x3[j]);
    const double m0 = std::fabs(v0), m1 = std::fabs(v1), m2 = std::fabs(v2), m3 = std::fabs(v3);
    if constexpr (W) {
      const double wj = w[j], wj_abs = ABS ? w_abs[j] : 0;
      a0 += v0 * wj; a1 += v1 * wj; a2 += v2 * wj; a3 += v3 * wj;
      if constexpr (ABS) { b0 += m0 * wj_abs; b1 += m1 * wj_abs; b2 += m2 * wj_abs; b3 += m3 * wj_abs; }
    }
    if constexpr (CS) {
      cs[j] += (v0 + v1) + (v2 + v3);
      if constexpr (ABS) cs_abs[j] += (m0 + m1) + (m2 + m3);
    }
  }
  if constexpr (W) {
    out[0] += a0; out[1] += a1; out[2] += a2; out[3] += a3;
    if constexpr (ABS) { out_abs[0] += b0; out_abs[1] += b1; out_abs[2] += b2; out_abs[3] += b3; }
  }
}

// Columns 0..3 of a column-major X (unit row stride).
template <typename T, bool W, bool CS, bool ABS>
SDC_INLINE void four_cols(const T* x, int64_t r, int64_t ss, const double* w, const double* w_abs, double* out,
                      double* out_abs, double* cs, double* cs_abs) {
  const T *x0 = x, *x1 = x + ss, *x2 = x + 2 * ss, *x3 = x + 3 * ss;
  const double w0 = W ? w[0] : 0, w1 = W ? w[1] : 0, w2 = W ? w[2] : 0, w3 = W ? w[3] : 0;
  const bool wa = W && ABS;
  const double u0 = wa ? w_abs[0] : 0, u1 = wa ? w_abs[1] : 0, u2 = wa ? w_abs[2] : 0, u3 = wa ? w_abs[3] : 0;
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0, b0 = 0, b1 = 0, b2 = 0, b3 = 0;
#pragma omp simd reduction(+ : a0, a1, a2, a3, b0, b1, b2, b3)
  for (int64_t i = 0; i < r; ++i) {
    const double v0 = f64(x0[i]), v1 = f64(x1[i]), v2 = f64(x2[i]), v3 = f64(x3[i]);
    const double m0 = std::fabs(v0), m1 = std::fabs(v1), m2 = std::fabs(v2), m3 = std::fabs(v3);
    if constexpr (W) {
      out[i] += (v0 * w0 + v1 * w1) + (v2 * w2 + v3 * w3);
      if constexpr (ABS) out_abs[i] += (m0 * u0 + m1 * u1) + (m2 * u2 + m3 * u3);
    }
    if constexpr (CS) {
      a0 += v0; a1 += v1; a2 += v2; a3 += v3;
      if constexpr (ABS) { b0 += m0; b1 += m1; b2 += m2; b3 += m3; }
    }
  }
  if constexpr (CS) {
    cs[0] += a0; cs[1] += a1; cs[2] += a2; cs[3] += a3;
    if constexpr (ABS) { cs_abs[0] += b0; cs_abs[1] += b1; cs_abs[2] += b2; cs_abs[3] += b3; }
  }
}

template <typename T, bool W, bool CS, bool ABS>
SDC_CLONES void pass(const T* x, int64_t r, int64_t s, int64_t sr, int64_t ss, const double* w, const double* w_abs,
                     double* out, double* out_abs, double* cs, double* cs_abs) {
  int64_t i = 0, j = 0;
  if (ss == 1)
    for (; i + 4 <= r; i += 4)
      four_rows<T, W, CS, ABS>(x + i * sr, s, sr, w, w_abs, out + (W ? i : 0), out_abs + (W && ABS ? i : 0), cs,
                               cs_abs);
  else if (sr == 1)
    for (; j + 4 <= s; j += 4)
      four_cols<T, W, CS, ABS>(x + j * ss, r, ss, w + (W ? j : 0), w_abs + (W && ABS ? j : 0), out, out_abs,
                               cs + (CS ? j : 0), cs_abs + (CS && ABS ? j : 0));
  // What the blocks left: the last rows or columns, or all of a matrix with neither stride 1.
  for (int64_t i2 = i; i2 < r; ++i2)
    for (int64_t j2 = j; j2 < s; ++j2) {
      const double v = f64(x[i2 * sr + j2 * ss]), m = std::fabs(v);
      if constexpr (W) { out[i2] += v * w[j2]; if constexpr (ABS) out_abs[i2] += m * w_abs[j2]; }
      if constexpr (CS) { cs[j2] += v; if constexpr (ABS) cs_abs[j2] += m; }
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

// Work is split into at most kBlocks blocks of rows (of A and C) or columns per product, a fixed split whatever the
// thread count, so the sums are added in the same order on every machine. Below kParallelWork elements read,
// waking the training's thread pool costs more than it saves: the caller's thread does it all.
constexpr int64_t kBlocks = 8;
constexpr int64_t kMinRows = 64;
constexpr int64_t kParallelWork = int64_t{1} << 17;

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
  const bool parallel = batch * (m * k + 2 * k * n + m * n) >= kParallelWork;
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

bool supported(const at::Tensor& x, at::ScalarType dtype) {
  return x.device().is_cpu() && x.layout() == at::kStrided && x.scalar_type() == dtype && !x.is_neg() &&
         !x.is_conj();
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
