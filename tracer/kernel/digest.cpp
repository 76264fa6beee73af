// sdctrace's fused CPU digest: the lanes64-v1 fingerprint (tracer/fingerprint.py defines it) and the stats
// that ride along (sum of squares, min, max, NaN and Inf counts), in one pass over each tensor's bytes.
//
// Single-threaded on the caller's thread: training is blocked in the hook while this runs, and a pool of our
// own would spin against the training's OpenMP threads. Work goes in blocks that stay in L1: the block's
// words feed the lane sum, then its elements feed the stats. Every accumulator is split into kLanes
// independent lanes combined in a fixed order, so the compiler vectorises without reassociating and every
// instruction set gives the same bits (the lane sum is exact mod 2^64 anyway; the float stats are not).
#include <torch/extension.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kChunk = int64_t{1} << 18;  // words per weight chunk: fingerprint.py's CHUNK
constexpr int64_t kBlock = 2048;               // words per block; divides kChunk
constexpr int kLanes = 8;

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SDC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SDC_CLONES
#endif

// sum_i x[i] * w[i] (mod 2^64), x sign-extended.
SDC_CLONES uint64_t lane_dot(const int32_t* x, const uint64_t* w, int64_t n) {
  uint64_t acc[kLanes] = {0};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += static_cast<uint64_t>(static_cast<int64_t>(x[i + j])) * w[i + j];
  uint64_t s = 0;
  for (; i < n; ++i) s += static_cast<uint64_t>(static_cast<int64_t>(x[i])) * w[i];
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  return s;
}

typedef double v8d __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
typedef int64_t v8l __attribute__((vector_size(64)));
static_assert(kLanes == 8, "one v8d per lane group");

// Lane j of a tensor's stats takes the elements at positions == j (mod kLanes); the few left at the very end
// go to the tail accumulators. Block boundaries are multiples of kLanes, so the split does not depend on them.
struct Stats {
  v8d sumsq = {0, 0, 0, 0, 0, 0, 0, 0};
  v8d lo = v8d{} + std::numeric_limits<double>::infinity();
  v8d hi = v8d{} - std::numeric_limits<double>::infinity();
  v8l nan = {0, 0, 0, 0, 0, 0, 0, 0};
  v8l inf = {0, 0, 0, 0, 0, 0, 0, 0};  // non-finite, NaN included
  double tail_sumsq = 0, tail_lo = std::numeric_limits<double>::infinity(),
         tail_hi = -std::numeric_limits<double>::infinity();
  int64_t tail_nan = 0, tail_inf = 0;

  // NaN compares false: min and max skip it, and the count has it.
  __attribute__((always_inline)) inline void add(v8d v) {
    const v8d z = v - v;  // NaN where v is NaN or infinite
    sumsq += v * v;
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
    nan -= (v != v);  // a true comparison is -1 in every bit
    inf -= (z != z);  // NaNs too: digest_one takes them out
  }

  void add_tail(double v) {
    const double kInf = std::numeric_limits<double>::infinity();
    tail_sumsq += v * v;
    tail_lo = v < tail_lo ? v : tail_lo;
    tail_hi = v > tail_hi ? v : tail_hi;
    tail_nan += (v != v);
    tail_inf += (v == kInf) | (v == -kInf);
  }
};

SDC_CLONES void stats_f32(const float* x, int64_t n, Stats& s, bool last) {
  Stats a = s;  // a local copy stays in registers
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    v8f f;
    std::memcpy(&f, x + i, sizeof f);
    a.add(__builtin_convertvector(f, v8d));
  }
  TORCH_CHECK(last || i == n, "sdctrace digest: block not a multiple of the lane count");
  for (; i < n; ++i) a.add_tail(x[i]);
  s = a;
}

SDC_CLONES void stats_f64(const double* x, int64_t n, Stats& s, bool last) {
  Stats a = s;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    v8d d;
    std::memcpy(&d, x + i, sizeof d);
    a.add(d);
  }
  TORCH_CHECK(last || i == n, "sdctrace digest: block not a multiple of the lane count");
  for (; i < n; ++i) a.add_tail(x[i]);
  s = a;
}

// Other dtypes convert a block to float64 first (as torch's .double() does), then share the float64 path.
template <typename T>
void stats_converted(const T* x, int64_t n, Stats& s, bool last, std::vector<double>& tmp) {
  tmp.resize(n);
  for (int64_t i = 0; i < n; ++i) tmp[i] = static_cast<double>(x[i]);
  stats_f64(tmp.data(), n, s, last);
}

bool supported(at::ScalarType t) {
  switch (t) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16:
    case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong: case at::kBool:
      return true;
    default:
      return false;
  }
}

void stats_block(const at::Tensor& t, const uint8_t* bytes, int64_t n, Stats& s, bool last, std::vector<double>& tmp) {
  switch (t.scalar_type()) {
    case at::kFloat: return stats_f32(reinterpret_cast<const float*>(bytes), n, s, last);
    case at::kDouble: return stats_f64(reinterpret_cast<const double*>(bytes), n, s, last);
    case at::kHalf: return stats_converted(reinterpret_cast<const at::Half*>(bytes), n, s, last, tmp);
    case at::kBFloat16: return stats_converted(reinterpret_cast<const at::BFloat16*>(bytes), n, s, last, tmp);
    case at::kByte: return stats_converted(reinterpret_cast<const uint8_t*>(bytes), n, s, last, tmp);
    case at::kBool: return stats_converted(reinterpret_cast<const uint8_t*>(bytes), n, s, last, tmp);
    case at::kChar: return stats_converted(reinterpret_cast<const int8_t*>(bytes), n, s, last, tmp);
    case at::kShort: return stats_converted(reinterpret_cast<const int16_t*>(bytes), n, s, last, tmp);
    case at::kInt: return stats_converted(reinterpret_cast<const int32_t*>(bytes), n, s, last, tmp);
    case at::kLong: return stats_converted(reinterpret_cast<const int64_t*>(bytes), n, s, last, tmp);
    default: TORCH_CHECK(false, "sdctrace digest: no stats for dtype ", t.scalar_type());
  }
}

int64_t bits(double v) {
  int64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// One tensor's digest parts: lane sum, L2 (float64 bits), min and max (float64 bits), NaN count, Inf count.
void digest_one(const at::Tensor& input, const uint64_t* w, const uint64_t* r, int64_t r_len, int64_t* out,
                std::vector<double>& tmp) {
  const at::Tensor t = input.contiguous();
  const int64_t nbytes = t.numel() * static_cast<int64_t>(t.element_size());
  const int64_t words = (nbytes + 3) / 4;
  const int64_t chunks = std::max<int64_t>(1, (words + kChunk - 1) / kChunk);
  TORCH_CHECK(chunks <= r_len, "sdctrace digest: chunk table too short (", r_len, " < ", chunks, ")");
  const uint8_t* base = static_cast<const uint8_t*>(t.data_ptr());
  const int64_t elem = t.element_size();
  alignas(64) int32_t buf[kBlock];
  Stats s;
  uint64_t h = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    uint64_t chunk_sum = 0;
    const int64_t first = c * kChunk, stop = std::min(words, first + kChunk);
    for (int64_t b = first; b < stop; b += kBlock) {
      const int64_t n = std::min(kBlock, stop - b);
      const uint8_t* p = base + b * 4;
      const int64_t have = std::min(n * 4, nbytes - b * 4);  // bytes present; the last word may be partial
      const int32_t* x = reinterpret_cast<const int32_t*>(p);
      if (have != n * 4 || reinterpret_cast<uintptr_t>(p) % alignof(int32_t) != 0) {
        std::memset(buf, 0, sizeof buf);
        std::memcpy(buf, p, have);
        x = buf;
      }
      chunk_sum += lane_dot(x, w + (b - first), n);
      const int64_t e = have / elem;
      stats_block(t, p, e, s, /*last=*/b + n >= words, tmp);
    }
    h += chunk_sum * r[c];
  }
  double sumsq = 0, lo = s.tail_lo, hi = s.tail_hi;
  int64_t nan = s.tail_nan, inf = s.tail_inf;
  for (int j = 0; j < kLanes; ++j) {
    sumsq += s.sumsq[j];
    lo = s.lo[j] < lo ? s.lo[j] : lo;
    hi = s.hi[j] > hi ? s.hi[j] : hi;
    nan += s.nan[j];
    inf += s.inf[j] - s.nan[j];
  }
  sumsq += s.tail_sumsq;
  if (t.numel() == 0) lo = hi = 0;
  out[0] = static_cast<int64_t>(h);
  out[1] = bits(std::sqrt(sumsq));
  out[2] = bits(lo);
  out[3] = bits(hi);
  out[4] = nan;
  out[5] = inf;
}

}  // namespace

// Digest parts of every tensor, int64[n, 6]; the GIL is released while the bytes are read.
at::Tensor digest_many(const std::vector<at::Tensor>& tensors, const at::Tensor& w, const at::Tensor& r) {
  TORCH_CHECK(w.scalar_type() == at::kLong && w.is_contiguous() && w.numel() == kChunk, "sdctrace digest: bad W table");
  TORCH_CHECK(r.scalar_type() == at::kLong && r.is_contiguous(), "sdctrace digest: bad R table");
  for (const auto& t : tensors) {
    TORCH_CHECK(t.device().is_cpu(), "sdctrace digest: CPU tensors only, found ", t.device());
    TORCH_CHECK(supported(t.scalar_type()), "sdctrace digest: unsupported dtype ", t.scalar_type());
  }
  at::Tensor out = at::empty({static_cast<int64_t>(tensors.size()), 6}, at::kLong);
  const auto* wp = reinterpret_cast<const uint64_t*>(w.data_ptr<int64_t>());
  const auto* rp = reinterpret_cast<const uint64_t*>(r.data_ptr<int64_t>());
  int64_t* op = out.data_ptr<int64_t>();
  {
    pybind11::gil_scoped_release release;
    std::vector<double> tmp;
    for (size_t i = 0; i < tensors.size(); ++i) digest_one(tensors[i], wp, rp, r.numel(), op + 6 * i, tmp);
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("digest_many", &digest_many, "lanes64-v1 fingerprints and stats of CPU tensors, int64[n, 6]");
  m.attr("CHUNK") = kChunk;
}
