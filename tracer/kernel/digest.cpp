// sdctrace's fused CPU digest: the lanes64-v1 fingerprint (tracer/fingerprint.py defines it) and the stats
// that ride along (sum of squares, min, max, NaN and Inf counts), in one pass over each tensor's bytes (and a
// second over a block that holds a NaN or an Inf, to count them).
//
// Work items of a batch run on torch's own intra-op threads, idle while training is blocked in the hook (a pool
// of our own would spin against them). Work goes in blocks that stay in L1: the block's
// words feed the lane sum, then its elements feed the stats. Every accumulator is split into kLanes
// independent lanes combined in a fixed order, so the compiler vectorises without reassociating and every
// instruction set gives the same bits (the lane sum is exact mod 2^64 anyway; the float stats are not).
// What the kernel uses of torch, header by header: torch/extension.h (the whole C++ frontend) took 29 of the
// 32 s each kernel took to compile.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/utils/pybind.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>
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
static_assert(kLanes == 8, "one v8d per lane group");

// Lane j of a chunk's stats takes the elements at positions == j (mod kLanes); the few left at the very end of
// the tensor go to the tail. Block boundaries are multiples of kLanes, so the split does not depend on them.
// Stored as plain arrays (no over-aligned members: it lives in std::vector); `Acc` holds them in registers.
struct Stats {
  double sumsq[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  double lo[kLanes], hi[kLanes];
  int64_t nan = 0;
  int64_t inf = 0;  // non-finite, NaN included: `combine` takes NaNs out
  double tail_sumsq = 0, tail_lo = std::numeric_limits<double>::infinity(),
         tail_hi = -std::numeric_limits<double>::infinity();

  Stats() {
    for (int j = 0; j < kLanes; ++j) {
      lo[j] = std::numeric_limits<double>::infinity();
      hi[j] = -std::numeric_limits<double>::infinity();
    }
  }

  void add_tail(double v) {
    tail_sumsq += v * v;
    tail_lo = v < tail_lo ? v : tail_lo;
    tail_hi = v > tail_hi ? v : tail_hi;
    count(v);
  }

  void count(double v) {
    const double kInf = std::numeric_limits<double>::infinity();
    nan += (v != v);
    inf += (v != v) | (v == kInf) | (v == -kInf);
  }
};

// A block's sum of squares, min and max in registers. The NaN and Inf counts are not kept per element: a
// block's sum of squares is finite unless an element is not (or a float64 beyond 1e154 overflows it), so only
// such a block is read again to count them (`recount`), and the loop does half the work.
struct Acc {
  v8d sumsq = {}, lo, hi;

  __attribute__((always_inline)) inline explicit Acc(const Stats& s) {
    std::memcpy(&lo, s.lo, sizeof lo);
    std::memcpy(&hi, s.hi, sizeof hi);
  }

  // NaN compares false: min and max skip it.
  __attribute__((always_inline)) inline void add(v8d v) {
    sumsq += v * v;
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }

  // True when the block needs its counts taken.
  __attribute__((always_inline)) inline bool store(Stats& s) const {
    double total = 0;
    for (int j = 0; j < kLanes; ++j) {
      s.sumsq[j] += sumsq[j];
      total += sumsq[j];
    }
    std::memcpy(s.lo, &lo, sizeof lo);
    std::memcpy(s.hi, &hi, sizeof hi);
    return !std::isfinite(total);
  }
};

template <typename T>
void recount(const T* x, int64_t n, Stats& s) {
  for (int64_t i = 0; i < n; ++i) s.count(static_cast<double>(x[i]));
}

typedef float v16f __attribute__((vector_size(64)));

// Sixteen floats at a time: min and max stay in float lanes (twice as many per register); only the sum of
// squares widens to float64, in two accumulators so the adds do not wait on each other. Element i + j and
// i + 8 + j both go to lane j.
SDC_CLONES void stats_f32(const float* x, int64_t n, Stats& s, bool last) {
  Acc a(s);
  v16f lo = v16f{} + std::numeric_limits<float>::infinity(), hi = -lo;
  v8d odd = {};
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    v16f f;
    std::memcpy(&f, x + i, sizeof f);
    const v8d d0 = __builtin_convertvector(__builtin_shufflevector(f, f, 0, 1, 2, 3, 4, 5, 6, 7), v8d);
    const v8d d1 = __builtin_convertvector(__builtin_shufflevector(f, f, 8, 9, 10, 11, 12, 13, 14, 15), v8d);
    a.sumsq += d0 * d0;
    odd += d1 * d1;
    lo = f < lo ? f : lo;
    hi = f > hi ? f : hi;
  }
  a.sumsq += odd;
  for (int j = 0; j < kLanes; ++j) {
    const double l = std::min(lo[j], lo[j + kLanes]), h = std::max(hi[j], hi[j + kLanes]);
    a.lo[j] = l < a.lo[j] ? l : a.lo[j];
    a.hi[j] = h > a.hi[j] ? h : a.hi[j];
  }
  for (; i + kLanes <= n; i += kLanes) {
    v8f f;
    std::memcpy(&f, x + i, sizeof f);
    a.add(__builtin_convertvector(f, v8d));
  }
  if (a.store(s)) recount(x, i, s);
  TORCH_CHECK(last || i == n, "sdctrace digest: block not a multiple of the lane count");
  for (; i < n; ++i) s.add_tail(x[i]);
}

SDC_CLONES void stats_f64(const double* x, int64_t n, Stats& s, bool last) {
  Acc a(s);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    v8d d;
    std::memcpy(&d, x + i, sizeof d);
    a.add(d);
  }
  if (a.store(s)) recount(x, i, s);
  TORCH_CHECK(last || i == n, "sdctrace digest: block not a multiple of the lane count");
  for (; i < n; ++i) s.add_tail(x[i]);
}

// Other dtypes convert a block to float64 first (as torch's .double() does), then share the float64 path.
template <typename T>
void stats_converted(const T* x, int64_t n, Stats& s, bool last, std::vector<double>& tmp) {
  tmp.resize(n);
  for (int64_t i = 0; i < n; ++i) tmp[i] = static_cast<double>(x[i]);
  stats_f64(tmp.data(), n, s, last);
}

// A supported dtype's name as Python prints it after "torch."; nullptr for a dtype the kernel does not take.
const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kByte: return "uint8";
    case at::kChar: return "int8";
    case at::kShort: return "int16";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kBool: return "bool";
    default: return nullptr;
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

// The bytes of one tensor, contiguous, in logical order.
struct Input {
  at::Tensor t;
  const uint8_t* base;
  int64_t nbytes, words, groups;
};

// Words [g * kGroup, (g + 1) * kGroup) of a tensor: one work item, read front to back, its weights read from L3 as
// it goes. (Items that each took one slice of every chunk, to keep that slice of the weight table in L2, digested
// a 256 MB float32 tensor at 10.8 GB/s on one core of an AMD EPYC; front to back, 15.2 GB/s.)
constexpr int64_t kGroup = 16 * kBlock;
constexpr int64_t kParallelWords = 2 * kGroup;  // 256 KiB: two work items
static_assert(kChunk % kBlock == 0, "blocks tile a chunk");

// One work item's result: its part of the tensor's lane sum (chunk weights applied) and its stats.
struct Part {
  Stats stats;
  uint64_t lane = 0;
};

void digest_group(const Input& in, int64_t g, const uint64_t* w, const uint64_t* r, Part& part,
                  std::vector<double>& tmp) {
  alignas(64) int32_t buf[kBlock];
  const int64_t elem = in.t.element_size();
  const int64_t first = g * kGroup, stop = std::min(in.words, first + kGroup);
  uint64_t lane = 0;
  for (int64_t b = first; b < stop; b += kBlock) {
    const int64_t n = std::min(kBlock, stop - b);
    const uint8_t* p = in.base + b * 4;
    const int64_t have = std::min(n * 4, in.nbytes - b * 4);  // bytes present; the last word may be partial
    const int32_t* x = reinterpret_cast<const int32_t*>(p);
    if (have != n * 4 || reinterpret_cast<uintptr_t>(p) % alignof(int32_t) != 0) {
      std::memset(buf, 0, sizeof buf);
      std::memcpy(buf, p, have);
      x = buf;
    }
    lane += lane_dot(x, w + b % kChunk, n) * r[b / kChunk];  // a block lies in one chunk
    stats_block(in.t, p, have / elem, part.stats, /*last=*/b + n >= in.words, tmp);
  }
  part.lane = lane;
}

// splitmix64's finaliser, as fingerprint.py's mix64.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// A tensor's digest from its work items, combined in item order: the fingerprint (its lane sum mixed with
// `meta_hash`), NaN and Inf counts into `ints`; L2 and absmax (NaN when a NaN was seen) into `floats`.
void combine(const Input& in, const Part* parts, uint64_t meta_hash, int64_t* ints, double* floats) {
  double sumsq = 0, lo = std::numeric_limits<double>::infinity(), hi = -lo;
  int64_t nan = 0, inf = 0;
  for (int64_t g = 0; g < in.groups; ++g) {
    const Stats& s = parts[g].stats;
    for (int j = 0; j < kLanes; ++j) {
      sumsq += s.sumsq[j];
      lo = s.lo[j] < lo ? s.lo[j] : lo;
      hi = s.hi[j] > hi ? s.hi[j] : hi;
    }
    nan += s.nan;
    inf += s.inf - s.nan;
    sumsq += s.tail_sumsq;
    lo = s.tail_lo < lo ? s.tail_lo : lo;
    hi = s.tail_hi > hi ? s.tail_hi : hi;
  }
  uint64_t h = 0;  // addition mod 2^64: any order gives these bits
  for (int64_t g = 0; g < in.groups; ++g) h += parts[g].lane;
  if (in.t.numel() == 0) lo = hi = 0;
  ints[0] = static_cast<int64_t>(mix64(h ^ meta_hash));
  ints[1] = nan;
  ints[2] = inf;
  floats[0] = std::sqrt(sumsq);
  floats[1] = nan ? std::numeric_limits<double>::quiet_NaN() : std::max(std::fabs(lo), std::fabs(hi));
}

// Whether the kernel may read `t`'s bytes: a tensor subclass that dispatches its ops in Python (a wrapper such as
// DTensor, AsyncCollectiveTensor) may have no storage of its own, and reading its data pointer reads garbage or
// crashes; torch ops, which go through its dispatch, digest it instead (fingerprint.py).
bool own_bytes(const at::Tensor& t) {
  return t.has_storage() && !t.unsafeGetTensorImpl()->is_python_dispatch();
}

// The digests of `tensors` (CPU, supported dtypes): fingerprint, NaN and Inf counts into `ints` (three per tensor),
// L2 and absmax into `floats` (two per tensor), `meta_hashes` being fingerprint.py's hash of each tensor's dtype
// and shape. The work items (`digest_group`) run on torch's own intra-op threads (idle while training waits for
// this) and combine in a fixed order, so the bits do not depend on the thread count. The GIL (held by the
// caller) is released while the bytes of work for both threads are read; a smaller call keeps it (giving it up
// and taking it back cost a traced tiny step 0.6 ms over its 32 activation digests).
void digest_into(const std::vector<at::Tensor>& tensors, const at::Tensor& w, const at::Tensor& r,
                 const uint64_t* meta_hashes, int64_t* ints, double* floats) {
  at::NoGradGuard no_grad;  // contiguous() of a tensor that requires grad records nothing
  std::vector<Input> inputs;
  std::vector<int64_t> first_part;  // index of each tensor's first work item
  int64_t items = 0, total_words = 0;
  inputs.reserve(tensors.size());
  for (const auto& t : tensors) {
    TORCH_CHECK(t.device().is_cpu(), "sdctrace digest: CPU tensors only, found ", t.device());
    TORCH_CHECK(dtype_name(t.scalar_type()) != nullptr, "sdctrace digest: unsupported dtype ", t.scalar_type());
    TORCH_CHECK(own_bytes(t), "sdctrace digest: a tensor subclass that dispatches in Python has no bytes of its own "
                "to read; fingerprint.py digests it with torch ops");
    at::Tensor c = t.contiguous();
    const int64_t nbytes = c.numel() * static_cast<int64_t>(c.element_size());
    const int64_t words = (nbytes + 3) / 4;
    const int64_t chunks = std::max<int64_t>(1, (words + kChunk - 1) / kChunk);
    const int64_t groups = std::max<int64_t>(1, (words + kGroup - 1) / kGroup);
    TORCH_CHECK(chunks <= r.numel(), "sdctrace digest: chunk table too short (", r.numel(), " < ", chunks, ")");
    inputs.push_back({c, static_cast<const uint8_t*>(c.data_ptr()), nbytes, words, groups});
    first_part.push_back(items);
    items += groups;
    total_words += words;
  }
  std::vector<int64_t> owner(items);
  std::vector<Part> parts(items);
  for (size_t i = 0, k = 0; i < inputs.size(); ++i)
    for (int64_t g = 0; g < inputs[i].groups; ++g, ++k) owner[k] = static_cast<int64_t>(i);
  const auto* wp = reinterpret_cast<const uint64_t*>(w.data_ptr<int64_t>());
  const auto* rp = reinterpret_cast<const uint64_t*>(r.data_ptr<int64_t>());
  // From two work items on, the pool's second thread pays for its wake-up even inside a training step (a tiny
  // step's digests: 2.4 ms on this thread alone, 1.5 ms split). One item stays here, with the GIL.
  const bool split = total_words >= kParallelWords;
  std::optional<pybind11::gil_scoped_release> release;
  if (split) release.emplace();
  auto run = [&](int64_t begin, int64_t end) {
    std::vector<double> tmp;
    for (int64_t k = begin; k < end; ++k) {
      const int64_t i = owner[k];
      digest_group(inputs[i], k - first_part[i], wp, rp, parts[k], tmp);
    }
  };
  if (split)
    at::parallel_for(0, items, 1, run);
  else
    run(0, items);
  for (size_t i = 0; i < inputs.size(); ++i)
    combine(inputs[i], parts.data() + first_part[i], meta_hashes[i], ints + 3 * i, floats + 2 * i);
}

void check_tables(const at::Tensor& w, const at::Tensor& r) {
  TORCH_CHECK(w.scalar_type() == at::kLong && w.is_contiguous() && w.numel() == kChunk, "sdctrace digest: bad W table");
  TORCH_CHECK(r.scalar_type() == at::kLong && r.is_contiguous(), "sdctrace digest: bad R table");
}

// The digest of every tensor as (fingerprint, NaN count, Inf count, L2, absmax) tuples: plain Python values (a
// traced step digests its activations one at a time, and two result tensors and their conversion cost more
// than a small tensor's bytes).
pybind11::list digest_many(const std::vector<at::Tensor>& tensors, const at::Tensor& w, const at::Tensor& r,
                           const std::vector<uint64_t>& meta_hashes) {
  check_tables(w, r);
  TORCH_CHECK(meta_hashes.size() == tensors.size(), "sdctrace digest: one meta hash per tensor");
  const size_t n = tensors.size();
  std::vector<int64_t> ints(3 * n);
  std::vector<double> floats(2 * n);
  digest_into(tensors, w, r, meta_hashes.data(), ints.data(), floats.data());
  pybind11::list rows(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t* k = ints.data() + 3 * i;
    const double* f = floats.data() + 2 * i;
    rows[i] = pybind11::make_tuple(static_cast<uint64_t>(k[0]), k[1], k[2], f[0], f[1]);
  }
  return rows;
}

// The tables `digest_held` and `digest_held_many` digest with: fingerprint.py's, registered by `use_tables`. Never freed, so that no
// destructor runs at interpreter exit.
std::pair<at::Tensor, at::Tensor>* held_tables = nullptr;

void use_tables(const at::Tensor& w, const at::Tensor& r) {
  check_tables(w, r);
  if (held_tables == nullptr)
    held_tables = new std::pair<at::Tensor, at::Tensor>(w, r);
  else
    *held_tables = {w, r};
}


// fingerprint.py's tensor_meta of `t` (its text into `meta`, its hash returned), computed here so that a hook's
// digest runs no Python around it (each line of which, between a pass's large ops, runs out of cache at several
// microseconds). False for what `digest_held` does not take: a tensor that is not a contiguous CPU tensor of a
// supported dtype, or one longer than the registered tables cover, whose caller takes the general path.
bool held_meta(const at::Tensor& t, uint64_t& hash, std::string& meta) {
  const char* name = dtype_name(t.scalar_type());
  if (held_tables == nullptr || name == nullptr || !t.device().is_cpu() || !t.is_contiguous() || !own_bytes(t))
    return false;
  const int64_t words = (t.numel() * static_cast<int64_t>(t.element_size()) + 3) / 4;
  if (std::max<int64_t>(1, (words + kChunk - 1) / kChunk) > held_tables->second.numel()) return false;
  constexpr uint64_t kPrime = 0x100000001B3ULL;
  uint64_t h = 0xCBF29CE484222325ULL;  // FNV-1a over "torch." and the name, as fingerprint.py
  for (const char* c : {"torch.", name})
    for (; *c; ++c) h = (h ^ static_cast<uint8_t>(*c)) * kPrime;
  meta = std::string(name) + "[";
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t size = t.size(d);
    h = mix64(h * kPrime + static_cast<uint64_t>(size) + 1);
    meta += (d ? "," : "") + std::to_string(size);
  }
  meta += "]";
  hash = mix64(h ^ (static_cast<uint64_t>(t.dim()) << 56));
  return true;
}

// The digests and metas of `tensors` as (fingerprint, NaN count, Inf count, L2, absmax, meta) tuples, in one
// pass over all of them, or None when `held_meta` refuses any one of them.
pybind11::object digest_held_many(const std::vector<at::Tensor>& tensors) {
  const size_t n = tensors.size();
  std::vector<uint64_t> hashes(n);
  std::vector<std::string> metas(n);
  for (size_t i = 0; i < n; ++i)
    if (!held_meta(tensors[i], hashes[i], metas[i])) return pybind11::none();
  std::vector<int64_t> ints(3 * n);
  std::vector<double> floats(2 * n);
  const auto [w, r] = *held_tables;  // held here: another thread may register new tables while the GIL is released
  digest_into(tensors, w, r, hashes.data(), ints.data(), floats.data());
  pybind11::list rows(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t* k = ints.data() + 3 * i;
    const double* f = floats.data() + 2 * i;
    rows[i] = pybind11::make_tuple(static_cast<uint64_t>(k[0]), k[1], k[2], f[0], f[1], metas[i]);
  }
  return std::move(rows);
}

// One tensor's `digest_held_many`: what a hook calls.
pybind11::object digest_held(const at::Tensor& t) {
  uint64_t hash;
  std::string meta;
  if (!held_meta(t, hash, meta)) return pybind11::none();
  int64_t ints[3];
  double floats[2];
  const auto [w, r] = *held_tables;
  digest_into({t}, w, r, &hash, ints, floats);
  return pybind11::make_tuple(static_cast<uint64_t>(ints[0]), ints[1], ints[2], floats[0], floats[1], meta);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("digest_many", &digest_many, "lanes64-v1 fingerprints and stats of CPU tensors");
  m.def("use_tables", &use_tables, "register the weight tables digest_held and digest_held_many use");
  m.def("digest_held", &digest_held, "one tensor's digest and meta, or None");
  m.def("digest_held_many", &digest_held_many, "the digests and metas of many tensors, or None");
  m.attr("CHUNK") = kChunk;
}
