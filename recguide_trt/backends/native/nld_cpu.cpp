// The NLD backbone's whole forward as one C++ call on the CPU (the `native` backend).
//
// Why: the tiny and mid-size models this runtime serves spend most of an eager PyTorch step in
// op dispatch (~50 Python-level ops per layer) and in gathering / padding / masking the KV cache,
// not in arithmetic. Here a step is one call: the GEMMs are our own, over weights packed once
// (float32 arithmetic by default; bf16 dot products with compute_dtype="bfloat16"); everything
// between them (RMSNorm, RoPE, the tri-mode attention over each row's own cached past, SwiGLU, the
// draft adapter's gate, the head's argmax / top-3 / probabilities) is a plain loop over the packed
// real tokens, so no row is padded to the longest and no [B, T, P+T] mask is built.
//
// Attention reads each row's past straight from the cache slot (keys [0, past_len)) and the new
// tokens' keys from this step's projections, with the row's own [T, T] intra mask; a query's
// arithmetic does not depend on the other rows of the batch or on padding.
// Semantics: recguide_trt.model.backbone (the reference); tests compare the two.

// Only the headers this file uses: <torch/extension.h> (the whole C++ frontend) took 38 s of a 73 s build
// on a 2 GHz Zen 1 EPYC; these take ~15 s. Tensor methods come with the Tensor class, free functions one
// ATen op header each, and pybind11 with torch's Tensor caster and the STL casters.
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/zeros.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <type_traits>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <new>
#include <string>
#include <limits>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// The loops over a register tile's rows, panels and k steps are unrolled by pragma, which GCC does
// before its scalar replacement of the accumulators: left to its later unroller, GCC 12 kept each
// accumulator in memory too and stored it after every FMA (a store per FMA, in the AVX-512 build as
// well; on AVX2, batch 64 ran at 31 GFLOP/s of 246).
#define RG_UNROLL _Pragma("GCC unroll 16")

// exp for float, vectorisable inside `#pragma omp simd` loops (Cephes' expf polynomial, ~1-2 ulp;
// the range reduction rounds with the 1.5 * 2^23 trick because std::floor blocks vectorisation);
// libm's expf is not vectorised without -ffast-math, which would also break -inf handling.
inline float vexp(float x) {
  const bool under = x < -87.3365478515625f;  // exp(-inf) and other underflows are exactly 0
  x = std::min(88.3762626647949f, std::max(-87.3365478515625f, x));
  float fx = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;
  x = x - fx * 0.693359375f + fx * 2.12194440e-4f;
  float z = x * x;
  float y = ((((1.9875691500E-4f * x + 1.3981999507E-3f) * x + 8.3334519073E-3f) * x + 4.1665795894E-2f) * x +
             1.6666665459E-1f) * x + 5.0000001201E-1f;
  y = y * z + x + 1.0f;
  int32_t e = (static_cast<int32_t>(fx) + 127) << 23;
  const float scale = __builtin_bit_cast(float, e);
  return under ? 0.f : y * scale;
}

// vexp on a vector's lanes, operation for operation (the same bits): GCC leaves vexp's selects as
// branches under AVX2 ("control flow in loop"), so `omp simd` loops that call it stayed scalar
// (softmax and SwiGLU were most of a batch-64 step's attention and a fifth of its MLP); under
// AVX-512 it vectorises them at 8 lanes only (GCC prefers 256-bit vectors on Intel), which left
// softmax a fifth of a batch-64 step's attention. Vec: the lane type and its operations (VecF).
template <typename Vec>
inline typename Vec::T vexp_lanes(typename Vec::T x) {
  using V = Vec;
  const auto lo = V::set1(-87.3365478515625f), magic = V::set1(12582912.f);
  const auto under = V::lt(x, lo);
  x = V::min(V::max(x, lo), V::set1(88.3762626647949f));  // NaN -> lo, as std::max
  const auto fx = V::sub(V::add(V::mul(x, V::set1(1.44269504088896341f)), magic), magic);
  x = V::add(V::sub(x, V::mul(fx, V::set1(0.693359375f))), V::mul(fx, V::set1(2.12194440e-4f)));
  const auto z = V::mul(x, x);
  auto y = V::set1(1.9875691500E-4f);
  for (float c : {1.3981999507E-3f, 8.3334519073E-3f, 4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f})
    y = V::add(V::mul(y, x), V::set1(c));
  y = V::add(V::add(V::mul(y, z), x), V::set1(1.0f));
  return V::zero_where(under, V::mul(y, V::pow2(fx)));
}

// A float vector in GCC's vector extensions (AVX2's 8, AVX-512's 16), with the operations
// vexp_lanes takes; each is lane by lane what the scalar vexp does (max / min as std::max / std::min:
// a NaN compares false and gives the other operand).
// (Float and int vector types as parameters: GCC 12 rejects __builtin_convertvector on a vector_size
// that depends on a template parameter.)
template <typename TF, typename TI>
struct VecF {
  using T = TF;
  using I = TI;
  static constexpr int kLanes = sizeof(TF) / sizeof(float);
  static T set1(float v) {
    T r;
    for (int i = 0; i < kLanes; ++i) r[i] = v;
    return r;
  }
  static T load(const float* p) { T v; std::memcpy(&v, p, sizeof v); return v; }
  static void store(float* p, T v) { std::memcpy(p, &v, sizeof v); }
  static T add(T a, T b) { return a + b; }
  static T sub(T a, T b) { return a - b; }
  static T mul(T a, T b) { return a * b; }
  static T div(T a, T b) { return a / b; }
  static T min(T a, T b) { return a < b ? a : b; }
  static T max(T a, T b) { return a > b ? a : b; }
  static T neg(T a) { return -a; }
  static I lt(T a, T b) { return a < b; }
  static T zero_where(I m, T v) { return m ? T{} : v; }
  static T pow2(T fx) {  // 2^fx for integral fx in float's exponent range
    const I e = (__builtin_convertvector(fx, I) + 127) << 23;
    T r;
    std::memcpy(&r, &e, sizeof r);
    return r;
  }
};
#if defined(__AVX512F__)
typedef float F32x16 __attribute__((vector_size(64)));
typedef int32_t I32x16 __attribute__((vector_size(64)));
using VecExp = VecF<F32x16, I32x16>;
#elif defined(__AVX2__)
typedef float F32x8 __attribute__((vector_size(32)));
typedef int32_t I32x8 __attribute__((vector_size(32)));
using VecExp = VecF<F32x8, I32x8>;
#endif

// s[j] = vexp(s[j] - m) for j < n: softmax's numerators.
inline void exp_minus(float* s, int64_t n, float m) {
  int64_t j0 = 0;
#if defined(__AVX2__)
  using V = VecExp;
  const auto mv = V::set1(m);
  for (; j0 + V::kLanes <= n; j0 += V::kLanes) V::store(s + j0, vexp_lanes<V>(V::sub(V::load(s + j0), mv)));
#endif
#pragma omp simd
  for (int64_t j = j0; j < n; ++j) s[j] = vexp(s[j] - m);
}

// The 16 lanes of a sum added in a fixed tree (l + 8, then + 4, + 2, + 1): every vector path and the
// one-lane-at-a-time definitions below reduce in the same order, so they give the same bits.
inline float sum16_tree(float* lanes) {
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) lanes[l] += lanes[l + w];
  return lanes[0];
}

// Σ vexp(x[j] - m) over j < n but `skip` (-1: none; the head's MASK), summed in 16 lanes (lane j % 16,
// in j order), then a fixed tree: the same bits on every vector path. A scalar `+=` chain left the
// head's log-sum-exp unvectorised on AVX2 (vexp's selects, see vexp_lanes): 5 % of a 1x8 or 64x1 step.
inline float exp_sum16(const float* x, int64_t n, float m, int64_t skip) {
  alignas(64) float lanes[16] = {0.f};
  auto one_by_one = [&](int64_t j0) {  // the block holding `skip` and a partial last block
    for (int64_t l = 0; l < 16 && j0 + l < n; ++l)
      if (j0 + l != skip) lanes[l] += vexp(x[j0 + l] - m);
  };
  const int64_t full = n / 16 * 16, skip_block = skip >= 0 ? skip / 16 * 16 : -1;
#if defined(__AVX2__)
  using V = VecExp;
  constexpr int kVecs = 16 / V::kLanes;
  const auto mv = V::set1(m);
  typename V::T acc[kVecs];
  RG_UNROLL for (int v = 0; v < kVecs; ++v) acc[v] = V::set1(0.f);
  for (int64_t j = 0; j < full; j += 16) {
    if (j == skip_block) {
      RG_UNROLL for (int v = 0; v < kVecs; ++v) V::store(lanes + v * V::kLanes, acc[v]);
      one_by_one(j);
      RG_UNROLL for (int v = 0; v < kVecs; ++v) acc[v] = V::load(lanes + v * V::kLanes);
      continue;
    }
    RG_UNROLL for (int v = 0; v < kVecs; ++v) acc[v] = V::add(acc[v], vexp_lanes<V>(V::sub(V::load(x + j + v * V::kLanes), mv)));
  }
  RG_UNROLL for (int v = 0; v < kVecs; ++v) V::store(lanes + v * V::kLanes, acc[v]);
#else
  for (int64_t j = 0; j < full; j += 16) {
    if (j == skip_block) {
      one_by_one(j);
      continue;
    }
#pragma omp simd
    for (int l = 0; l < 16; ++l) lanes[l] += vexp(x[j + l] - m);
  }
#endif
  if (full < n) one_by_one(full);
  return sum16_tree(lanes);
}

// o[i] = silu(g[i]) * u[i] for i < n (SwiGLU).
inline void silu_mul(const float* g, const float* u, float* o, int64_t n) {
  int64_t i0 = 0;
#if defined(__AVX2__)
  using V = VecExp;
  for (; i0 + V::kLanes <= n; i0 += V::kLanes) {
    const auto gv = V::load(g + i0);
    const auto den = V::add(V::set1(1.0f), vexp_lanes<V>(V::neg(gv)));
    V::store(o + i0, V::mul(V::div(gv, den), V::load(u + i0)));
  }
#endif
#pragma omp simd
  for (int64_t i = i0; i < n; ++i) o[i] = g[i] / (1.0f + vexp(-g[i])) * u[i];
}

// ---- Threads ------------------------------------------------------------------------------------
// A small pool of our own instead of OpenMP: items are handed out one at a time under a mutex, so a
// thread that the OS deschedules on a shared CPU holds up only the item it took (the others, the
// caller included, take the rest), and idle workers spin only briefly before sleeping. OpenMP's
// static split with spinning barriers collapses there (steps ran two orders of magnitude slower
// while another process kept both cores busy).
// Until `count` reaches n: spin briefly, then yield, so that a thread the OS has descheduled (the one
// that still holds the work) gets the core back on a shared CPU.
inline void wait_count(const std::atomic<int64_t>& count, int64_t n) {
  for (int spins = 0; count.load(std::memory_order_acquire) < n; ++spins) {
    if (spins < 4096) _mm_pause(); else std::this_thread::yield();
  }
}

class Pool {
 public:
  explicit Pool(int threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      gen_.fetch_add(1);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // fn(i, i + 1) for every i in [0, n), spread over the pool and the calling thread.
  void run(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    std::unique_lock<std::mutex> busy(run_mu_, std::try_to_lock);
    if (n <= 1 || workers_.empty() || !busy.owns_lock()) {  // a concurrent forward runs its items itself
      fn(0, n);
      return;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      fn_ = &fn;
      next_ = 0;
      total_ = n;
      done_.store(0);
      gen_.fetch_add(1, std::memory_order_release);
    }
    if (sleepers_.load() > 0) cv_.notify_all();
    work();
    wait_count(done_, n);
  }

 private:
  void work() {
    for (;;) {
      const std::function<void(int64_t, int64_t)>* fn;
      int64_t i;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (next_ >= total_) return;
        i = next_++;
        fn = fn_;
      }
      (*fn)(i, i + 1);
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  void loop() {
    uint64_t seen = gen_.load();
    for (;;) {
      for (int spins = 0; spins < 20000 && gen_.load(std::memory_order_acquire) == seen; ++spins) _mm_pause();
      if (gen_.load(std::memory_order_acquire) == seen) {
        std::unique_lock<std::mutex> lk(mu_);
        sleepers_.fetch_add(1);
        cv_.wait(lk, [&] { return gen_.load() != seen; });
        sleepers_.fetch_sub(1);
      }
      seen = gen_.load(std::memory_order_acquire);
      if (stop_) return;
      work();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> gen_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<int> sleepers_{0};
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t next_ = 0, total_ = 0;
  bool stop_ = false;
};

Pool* g_pool = nullptr;  // set by NLDCpu (one pool per process, sized by the first model)

// Work below this many multiply-adds runs on the calling thread: handing out items costs a wake-up
// and a join, which many tiny regions per step (batch-1 decoding) would pay again and again.
constexpr int64_t kMinParallelWork = int64_t(1) << 17;

template <typename F>
inline void par_items(int64_t n, int64_t work_per_item, const F& fn) {
  if (g_pool == nullptr || n <= 1 || n * work_per_item < kMinParallelWork) {
    fn(0, n);
    return;
  }
  g_pool->run(n, fn);
}

// Rows [0, n) in chunks of `grain` rows, each chunk one pool item.
template <typename F>
inline void par_rows(int64_t n, int64_t grain, int64_t work_per_row, const F& fn) {
  const int64_t chunks = (n + grain - 1) / grain;
  par_items(chunks, grain * work_per_row, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) fn(c * grain, std::min(n, (c + 1) * grain));
  });
}

// One row of RMSNorm: y = w * (x / sqrt(mean(x^2) + eps)); y may be x.
inline void rmsnorm_row(const float* xr, const float* w, float* yr, int64_t d, float eps) {
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
  const float inv = 1.0f / std::sqrt(ss / d + eps);
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) yr[i] = w[i] * (xr[i] * inv);
}

void rmsnorm_rows(const float* x, const float* w, float* y, int64_t n, int d, float eps) {
  par_rows(n, 16, d, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) rmsnorm_row(x + r * d, w, y + r * d, d, eps);
  });
}


// ---- GEMM: y[M, cols] (+)= x[M, K] · W[cols, K]^T over pre-packed weights -----------------------
// Weights are packed once into groups of 64 output columns ([group][k][64], see PackedW), stored as bfloat16
// when every value is exactly a bfloat16 (NLD checkpoints ship bf16: widening is exact, so the
// arithmetic is the float32 model's at half the weight traffic) and as float32 otherwise.
// Every output element is one float32 FMA chain over k = 0..K-1, whatever M, the tile it falls in
// or the other rows of the batch: a token's outputs do not depend on the batch it runs in, so a
// verify row's logits are bit-identical to the AR step's at the same position.

#if defined(__AVX512F__)
constexpr const char* kVectorPath = "avx512";  // which F16 the compiler was allowed (RECGUIDE_NATIVE_ISA)
struct F16 {
  __m512 v;
  static F16 zero() { return {_mm512_setzero_ps()}; }
  static F16 bcast(float x) { return {_mm512_set1_ps(x)}; }
  static F16 load(const float* p) { return {_mm512_loadu_ps(p)}; }
  static F16 load(const uint16_t* p) {
    return {_mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16))};
  }
  // 16 words of bf16 pairs: the low halves to `a`, the high halves to `b` (see PackedW).
  static void load_pair(const uint16_t* p, F16& a, F16& b) {
    const __m512i v = _mm512_loadu_si512(p);
    a.v = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    b.v = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
  void fma(F16 a, F16 b) { v = _mm512_fmadd_ps(a.v, b.v, v); }
  void add(F16 a) { v = _mm512_add_ps(v, a.v); }
  void store(float* p) const { _mm512_storeu_ps(p, v); }
};
#elif defined(__AVX2__) && defined(__FMA__)
constexpr const char* kVectorPath = "avx2";
struct F16 {
  __m256 lo, hi;
  static F16 zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static F16 bcast(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
  static F16 load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static __m256 widen(const uint16_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
  }
  static F16 load(const uint16_t* p) { return {widen(p), widen(p + 8)}; }
  static void load_pair(const uint16_t* p, F16& a, F16& b) {
    const __m256i mask = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
    const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
    a = {_mm256_castsi256_ps(_mm256_slli_epi32(v0, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16))};
    b = {_mm256_castsi256_ps(_mm256_and_si256(v0, mask)), _mm256_castsi256_ps(_mm256_and_si256(v1, mask))};
  }
  void fma(F16 a, F16 b) { lo = _mm256_fmadd_ps(a.lo, b.lo, lo); hi = _mm256_fmadd_ps(a.hi, b.hi, hi); }
  void add(F16 a) { lo = _mm256_add_ps(lo, a.lo); hi = _mm256_add_ps(hi, a.hi); }
  void store(float* p) const { _mm256_storeu_ps(p, lo); _mm256_storeu_ps(p + 8, hi); }
};
#else
constexpr const char* kVectorPath = "scalar";
struct F16 {
  float v[16];
  static F16 zero() { F16 r; for (float& x : r.v) x = 0.f; return r; }
  static F16 bcast(float x) { F16 r; for (float& y : r.v) y = x; return r; }
  static F16 load(const float* p) { F16 r; std::memcpy(r.v, p, sizeof(r.v)); return r; }
  static F16 load(const uint16_t* p) {
    F16 r;
    for (int i = 0; i < 16; ++i) { uint32_t u = static_cast<uint32_t>(p[i]) << 16; std::memcpy(&r.v[i], &u, 4); }
    return r;
  }
  static void load_pair(const uint16_t* p, F16& a, F16& b) {
    for (int i = 0; i < 16; ++i) {
      const uint32_t lo = static_cast<uint32_t>(p[2 * i]) << 16, hi = static_cast<uint32_t>(p[2 * i + 1]) << 16;
      std::memcpy(&a.v[i], &lo, 4);
      std::memcpy(&b.v[i], &hi, 4);
    }
  }
  void fma(F16 a, F16 b) { for (int i = 0; i < 16; ++i) v[i] = std::fma(a.v[i], b.v[i], v[i]); }
  void add(F16 a) { for (int i = 0; i < 16; ++i) v[i] += a.v[i]; }
  void store(float* p) const { std::memcpy(p, v, sizeof(v)); }
};
#endif

// ---- bf16 compute (optional): dot products of bf16 pairs into float32 -------------------------------
// With compute in bfloat16, weights are packed as k pairs per column ([group][K/2][64] 32-bit words,
// the even k in the low half) and each activation row is rounded to bf16 once, as pairs. One step of
// a chain adds two products, odd k first (AVX512_BF16's vdpbf16ps: each bf16 x bf16 product is exact
// in float32, each add rounds once). CPUs without the instruction emulate it with two FMAs: slower
// than float32 compute, there for tests; kBf16Dot says which one this build runs.
#if defined(__AVX512F__) && defined(__AVX512BF16__)
constexpr const char* kBf16Dot = "avx512_bf16";
struct P16 {  // 16 columns x one k pair of weights
  __m512i v;
  static P16 load(const uint32_t* p) { return {_mm512_loadu_si512(p)}; }
};
struct X2 {  // one activation k pair, broadcast
  __m512i v;
  static X2 bcast(uint32_t u) { return {_mm512_set1_epi32(static_cast<int>(u))}; }
};
inline void dot2(F16& acc, const P16& w, const X2& x) {
  acc.v = _mm512_dpbf16_ps(acc.v, reinterpret_cast<const __m512bh&>(w.v), reinterpret_cast<const __m512bh&>(x.v));
}
#else
constexpr const char* kBf16Dot = "emulated";
struct P16 {
  F16 even, odd;
  static P16 load(const uint32_t* p) {
    P16 r;
    F16::load_pair(reinterpret_cast<const uint16_t*>(p), r.even, r.odd);
    return r;
  }
};
struct X2 {
  F16 even, odd;
  static X2 bcast(uint32_t u) {
    const uint32_t ue = u << 16, uo = u & 0xFFFF0000u;
    float e, o;
    std::memcpy(&e, &ue, 4);
    std::memcpy(&o, &uo, 4);
    return {F16::bcast(e), F16::bcast(o)};
  }
};
inline void dot2(F16& acc, const P16& w, const X2& x) {
  acc.fma(x.odd, w.odd);
  acc.fma(x.even, w.even);
}
#endif

// float32 -> bfloat16 bits, round to nearest even (torch's rounding); NaN stays a quiet NaN.
inline uint32_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0u;
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

// One stored value as float32 (a bf16 KV cache widens exactly).
inline float to_f32(float x) { return x; }
inline float to_f32(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Rows of x [M, K] (ld lda) as bf16 k pairs [M, ldo] (an odd K's last pair has a zero high half, and
// the words past ceil(K / 2), AMX's padding to whole tiles, are zeros).
void to_bf16_pairs(const float* x, int64_t M, int64_t lda, int64_t K, uint32_t* out, int64_t ldo) {
  const int64_t K2 = (K + 1) / 2;
  for (int64_t m = 0; m < M; ++m) {
    const float* r = x + m * lda;
    uint32_t* o = out + m * ldo;
#pragma omp simd
    for (int64_t k = 0; k < K / 2; ++k) o[k] = bf16_bits(r[2 * k]) | (bf16_bits(r[2 * k + 1]) << 16);
    if (K % 2) o[K2 - 1] = bf16_bits(r[K - 1]);
    for (int64_t k = K2; k < ldo; ++k) o[k] = 0u;
  }
}

// ---- AMX (Intel's tile matrix unit, Sapphire Rapids and later) for bf16 compute ---------------------
// Where the build has AMX-BF16 and the kernel lets this process use the tile registers, bf16 compute
// runs on AMX (TDPBF16PS: a 16 x 16 float32 tile += 16 x 32 bf16 times 32 x 16 bf16, ~3 TFLOP/s a core
// measured here against ~120 GFLOP/s for vdpbf16ps). Every GEMM of a model packed for AMX takes it,
// whatever M (rows padded with zeros to a whole tile), so a row's outputs still do not depend on its
// batch. RECGUIDE_NATIVE_AMX=0 when a model is packed keeps vdpbf16ps (for A/B and tests).
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
constexpr bool kAmxBuilt = true;
#else
constexpr bool kAmxBuilt = false;
#endif

// Whether this process may use AMX: asked of the kernel once (Linux 5.16+: arch_prctl
// ARCH_REQ_XCOMP_PERM for XTILEDATA; the permission is process-wide).
bool amx_permitted() {
  static const bool ok = [] {
    if (!kAmxBuilt) return false;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

// Whether a model packed now takes AMX: permitted, and not turned off by RECGUIDE_NATIVE_AMX=0.
bool amx_wanted() {
  const char* env = std::getenv("RECGUIDE_NATIVE_AMX");
  return amx_permitted() && !(env != nullptr && std::string(env) == "0");
}

// Packed weights live in cache-line-aligned memory: a 64-byte vector load never splits across two
// lines. (2 MB pages for them were measured too, with madvise: no difference on the 2-core EPYC.)
template <typename T>
struct AlignedAlloc {
  using value_type = T;
  AlignedAlloc() = default;
  template <typename U>
  AlignedAlloc(const AlignedAlloc<U>&) {}
  T* allocate(size_t n) {
    void* p = std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64);
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <typename U>
  bool operator==(const AlignedAlloc<U>&) const { return true; }
  template <typename U>
  bool operator!=(const AlignedAlloc<U>&) const { return false; }
};
template <typename T>
using AlignedVec = std::vector<T, AlignedAlloc<T>>;

// Packed weights: groups of 64 output columns (4 panels of 16); per group, K rows of 64 weights, so a
// group's weights are one contiguous stream in k order (what the hardware prefetchers follow best).
// bf16 rows interleave panel pairs: 32-bit word c of half h holds column c of panel 2h (low 16 bits)
// and of panel 2h+1 (high 16 bits), so one shift and one mask widen 32 weights to float32 exactly.
struct PackedW {
  AlignedVec<uint16_t> bf16;   // [groups][K][64] when bf16-exact (float32 compute)
  AlignedVec<float> f32;       // [groups][K][64] otherwise
  AlignedVec<uint32_t> pairs;  // [groups][K2][64] bf16 k pairs (bf16 compute)
  int64_t N = 0, K = 0, groups = 0;
  int64_t rows = 0;             // packed k rows per group: K, or K2 = ceil(K / 2) for pairs (AMX: whole tiles of 16)
  bool is_bf16 = false, is_pairs = false;
  bool amx = false;             // pairs on AMX: [panel of 16 columns][rows][16] words, rows a multiple of kAmxPairs
};

constexpr int64_t kAmxPairs = 16;  // k pairs per AMX tile step (a tile row: 64 bytes)

// `pairs`: pack for bf16 compute (values rounded to bfloat16, to nearest even, where they are not one).
PackedW pack_weight(const at::Tensor& w_in, bool pairs = false) {
  at::Tensor w = w_in.to(at::kFloat).contiguous();
  PackedW p;
  p.N = w.size(0);
  p.K = w.size(1);
  p.groups = (p.N + 63) / 64;
  const float* src = w.data_ptr<float>();
  if (pairs) {
    p.is_pairs = true;
    p.amx = amx_wanted();
    p.rows = (p.K + 1) / 2;
    // Columns in groups of 64, or on AMX in panels of 16 with k padded to whole tiles (zero pairs add nothing).
    const int64_t width = p.amx ? 16 : 64;
    if (p.amx) p.rows = (p.rows + kAmxPairs - 1) / kAmxPairs * kAmxPairs;
    p.pairs.assign(static_cast<size_t>((p.N + width - 1) / width * p.rows * width), 0u);  // padding: zeros
    for (int64_t n = 0; n < p.N; ++n)
      for (int64_t k = 0; k < p.K; ++k)
        p.pairs[static_cast<size_t>(((n / width) * p.rows + k / 2) * width + n % width)] |=
            bf16_bits(src[n * p.K + k]) << (16 * (k % 2));
    return p;
  }
  p.rows = p.K;
  p.is_bf16 = at::equal(w.to(at::kBFloat16).to(at::kFloat), w);
  const size_t total = static_cast<size_t>(p.groups * p.K * 64);
  if (p.is_bf16) p.bf16.assign(total, 0); else p.f32.assign(total, 0.f);  // padding columns: zeros
  for (int64_t n = 0; n < p.N; ++n) {
    const int64_t g = n / 64, panel = (n % 64) / 16, c = n % 16;
    for (int64_t k = 0; k < p.K; ++k) {
      const size_t row = static_cast<size_t>((g * p.K + k) * 64);
      const float v = src[n * p.K + k];
      if (p.is_bf16) {
        uint32_t u;
        std::memcpy(&u, &v, 4);
        p.bf16[row + (panel / 2) * 32 + 2 * c + (panel % 2)] = static_cast<uint16_t>(u >> 16);
      } else {
        p.f32[row + panel * 16 + c] = v;
      }
    }
  }
  return p;
}

// A draft adapter's low-rank matrix, packed for few columns: panels of 16 output columns ([k][16] each,
// bf16 where exact) instead of the GEMM's groups of 64, and each panel only over the k rows between its
// first and last nonzero weight. The A matrices (rank 16 per projection) would fill a quarter of a
// group, and the stacked B is block-diagonal (a projection's columns read only its own rank's rows of
// the low-rank product): padded and dense, the adapter streamed 2.4x its weights' bytes, its A products
// on one thread (bench_forward.py --rows draft|fused measures the difference). The skipped weights are zeros,
// which add nothing to a chain, so the sums are gemm_t's: one FMA chain per output element in k order.
struct NarrowW {
  AlignedVec<uint16_t> bf16;
  AlignedVec<float> f32;
  std::vector<int64_t> k0, k1, off;  // per panel: k rows [k0, k1), stored from element off
  int64_t N = 0, K = 0, panels = 0;
  bool is_bf16 = false;
};

NarrowW pack_narrow(const at::Tensor& w_in) {
  at::Tensor w = w_in.to(at::kFloat).contiguous();
  NarrowW p;
  p.N = w.size(0);
  p.K = w.size(1);
  p.panels = (p.N + 15) / 16;
  p.is_bf16 = at::equal(w.to(at::kBFloat16).to(at::kFloat), w);
  const float* src = w.data_ptr<float>();
  int64_t total = 0;
  for (int64_t q = 0; q < p.panels; ++q) {
    int64_t lo = p.K, hi = 0;
    for (int64_t n = q * 16; n < std::min(p.N, q * 16 + 16); ++n)
      for (int64_t k = 0; k < p.K; ++k)
        if (src[n * p.K + k] != 0.f) { lo = std::min(lo, k); hi = std::max(hi, k + 1); }
    if (lo >= hi) lo = hi = 0;  // an all-zero panel reads nothing (its sums are 0)
    p.k0.push_back(lo);
    p.k1.push_back(hi);
    p.off.push_back(total);
    total += (hi - lo) * 16;
  }
  if (p.is_bf16) p.bf16.assign(static_cast<size_t>(total), 0); else p.f32.assign(static_cast<size_t>(total), 0.f);
  for (int64_t n = 0; n < p.N; ++n) {
    const int64_t q = n / 16;
    for (int64_t k = p.k0[q]; k < p.k1[q]; ++k) {
      const size_t at = static_cast<size_t>(p.off[q] + (k - p.k0[q]) * 16 + n % 16);
      const float v = src[n * p.K + k];
      if (p.is_bf16) {
        uint32_t u;
        std::memcpy(&u, &v, 4);
        p.bf16[at] = static_cast<uint16_t>(u >> 16);
      } else {
        p.f32[at] = v;
      }
    }
  }
  return p;
}

// Software prefetch distance into a group's weight stream, in k rows (64 rows = 8 KB of bf16 ahead):
// the hardware prefetchers alone left a small-M forward waiting on DRAM, then computing from cache
// (scripts/bench_forward.py measured 16, 32, 64 and 128; 32-64 were best on the 2-core EPYC).
constexpr int64_t kPrefetchK = 64;
// Runs of consecutive groups per thread in a few-row GEMM: about this many runs per thread.
constexpr int64_t kRunsPerThread = 4;

// out[0:valid] (+)= v: a whole vector as one store, a partial one element by element (same values).
inline void store_cols(const F16& v, float* out, int64_t valid, bool accumulate) {
  if (valid == 16) {
    if (accumulate) {
      F16 o = F16::load(out);
      o.add(v);
      o.store(out);
    } else {
      v.store(out);
    }
    return;
  }
  alignas(64) float tmp[16];
  v.store(tmp);
  if (accumulate) { for (int64_t c = 0; c < valid; ++c) out[c] += tmp[c]; }
  else { for (int64_t c = 0; c < valid; ++c) out[c] = tmp[c]; }
}

template <int MR, int NP, typename WT>
inline void micro(const float* x, int64_t lda, const WT* w, int64_t K, float* y, int64_t ldy,
                  int64_t ncols, bool accumulate) {
  // One k step reads 16 weights per panel; a cache line holds kStep steps of one panel.
  constexpr int64_t kStep = 64 / (16 * static_cast<int64_t>(sizeof(WT)));
  F16 acc[MR][NP];
  RG_UNROLL for (int i = 0; i < MR; ++i)
    RG_UNROLL for (int j = 0; j < NP; ++j) acc[i][j] = F16::zero();
  auto step = [&](int64_t k) {
    F16 wv[NP];
    RG_UNROLL for (int j = 0; j < NP; ++j) wv[j] = F16::load(w + (j * K + k) * 16);
    RG_UNROLL for (int i = 0; i < MR; ++i) {
      const F16 xb = F16::bcast(x[i * lda + k]);
      RG_UNROLL for (int j = 0; j < NP; ++j) acc[i][j].fma(xb, wv[j]);
    }
  };
  int64_t k = 0;
  for (; k + kStep <= K; k += kStep) {
    // Past the panel's end this touches the next panel (contiguous) or, at the weights' end, a line
    // that is never read: prefetches do not fault.
    RG_UNROLL for (int j = 0; j < NP; ++j)
      _mm_prefetch(reinterpret_cast<const char*>(w + (j * K + k + 32) * 16), _MM_HINT_T0);
    RG_UNROLL for (int64_t s = 0; s < kStep; ++s) step(k + s);
  }
  for (; k < K; ++k) step(k);
  RG_UNROLL for (int i = 0; i < MR; ++i)
    RG_UNROLL for (int j = 0; j < NP; ++j) store_cols(acc[i][j], y + i * ldy + j * 16, std::min<int64_t>(16, ncols - j * 16),
                                            accumulate);
}

template <int MR, typename WT>
inline void micro_rows(const float* x, int64_t lda, const WT* w, int64_t K, int64_t np, float* y, int64_t ldy,
                       int64_t ncols, bool accumulate) {
  switch (np) {
    case 4: micro<MR, 4>(x, lda, w, K, y, ldy, ncols, accumulate); break;
    case 3: micro<MR, 3>(x, lda, w, K, y, ldy, ncols, accumulate); break;
    case 2: micro<MR, 2>(x, lda, w, K, y, ldy, ncols, accumulate); break;
    default: micro<MR, 1>(x, lda, w, K, y, ldy, ncols, accumulate); break;
  }
}

// Panels [j0, j0 + NJ) of one packed group row (64 weights) as float32 vectors. bf16 rows hold panel
// pairs (2h, 2h + 1) in half h (one cache line), so a single panel is one half's low or high words.
template <int NJ, int J0>
inline void group_row(const float* r, F16 (&w)[NJ]) {
  RG_UNROLL for (int j = 0; j < NJ; ++j) w[j] = F16::load(r + 16 * (J0 + j));
}
template <int NJ, int J0>
inline void group_row(const uint16_t* r, F16 (&w)[NJ]) {
  if constexpr (NJ == 1) {
    F16 a, b;
    F16::load_pair(r + 32 * (J0 / 2), a, b);
    w[0] = J0 % 2 ? b : a;
  } else {
    RG_UNROLL for (int h = 0; h < NJ / 2; ++h) F16::load_pair(r + 16 * J0 + 32 * h, w[2 * h], w[2 * h + 1]);
  }
}

// The next k chunk's weights, prefetched while this chunk's tiles run, where a chunk takes several
// passes: on AVX2 a pass per 1 or 2 panels and tiles of a few rows; on AVX-512 a pass per tile of up
// to 6 rows (7-16 rows: 2-3 passes). The first pass's own prefetch (kPrefetchK rows ahead) left the
// DRAM stream idle during the others: a small-M forward paid the stream and the FMAs one after the
// other. Instead every tile call of the chunk takes an equal share of the next chunk's lines and
// spreads it over its k steps, so the stream runs all chunk long. On the AMX Xeon's AVX-512 paths
// that ran 1x8 1.08x, 1x16 1.10-1.13x, 8x1 1.05-1.07x (float32) and 1x8 1.04-1.08x, 1x16 1.13-1.18x
// (bf16 pair dots, AMX off: the AVX512_BF16 EPYC's path), bench_forward.py, interleaved; twice or half
// the share, or T0 hints, timed 0.83-0.96x against it.
// `NoAhead`: the first pass's prefetch only (a chunk in one pass: AVX-512's up to 6 rows, AVX2's single row).
struct NoAhead {
  static constexpr bool kNear = true;
  static constexpr int kNearHint = _MM_HINT_T0;
  struct Run {
    void step() {}
  };
  Run begin(int64_t) { return {}; }
  void end(const Run&) {}
};
// AVX2's one-row chunks (a batch-1 AR step) ask for nothing: the hardware prefetchers stream the group alone.
// On the Zen 3 EPYC the 1-token float32 step ran 0.99-1.08x paired without the near T0 prefetch, median 1.06x
// over five bench_forward.py runs, two of them with the builds' roles swapped (docs/bench/forward-avx2-one-row-bare).
// The likely cause: its prefetches held the L1's few miss buffers, and those bound how many lines a core has in
// flight. L2 hints there timed 1.01x.
struct NoPrefetch : NoAhead {
  static constexpr bool kNear = false;
};
// AVX-512's few-row chunks in one pass (1-6 rows) ask their near lines into L2, not L1: on the AMX Xeon the
// 1-token float32 step ran 1.03-1.05x and 1x4 1.11-1.13x (bench_forward.py, interleaved; bf16 pair dots with
// AMX off 1.06-1.07x / 1.02-1.05x). Prompts (0.98-0.99x with L2 hints), the multi-pass first chunks (Ahead)
// and AVX2's chunks of several rows (tuned on the Zen 3 EPYC) keep L1 hints.
struct NoAheadL2 : NoAhead {
  static constexpr int kNearHint = _MM_HINT_T1;
};
template <bool kNearToo>
struct Ahead {
  static constexpr bool kNear = kNearToo;
  static constexpr int kNearHint = _MM_HINT_T0;
  const char* p;         // the next line to prefetch
  const char* end_;      // the run's end: nothing of another thread's groups
  int64_t per_call = 0;  // lines per tile call
  // One tile call's share, in locals (kept in the Ahead object, its updates were a store and a load
  // per k step, a dependency chain longer than the step's FMAs).
  struct Run {
    const char* p;
    int64_t lines, kn, acc;
    void step() {  // lines * (k step + 1) / kn lines so far
      for (acc += lines; acc >= kn; acc -= kn, p += 64) _mm_prefetch(p, _MM_HINT_T1);  // T0 timed the same
    }
  };
  Run begin(int64_t k_steps) {
    return {p, std::max<int64_t>(0, std::min<int64_t>(per_call, (end_ - p) / 64)), std::max<int64_t>(1, k_steps), 0};
  }
  void end(const Run& r) { p = r.p; }
};

// acc[MR][NJ] (+)= x[MR rows, k0:k1] · group[k0:k1, panels j0..j0+NJ): one FMA chain per output
// element, in k order. The pass over panel 0 prefetches whole rows ahead (every line of them); the
// passes over the other panels of the same k chunk find it in cache.
template <int MR, int NJ, int J0, typename WT, typename PF>
inline void group_micro(const float* x, int64_t lda, const WT* g, int64_t k0, int64_t k1, F16 (&acc)[MR][NJ],
                        PF& pf) {
  constexpr int64_t kLine = 64 / sizeof(WT);  // elements per cache line
  auto run = pf.begin(k1 - k0);
  for (int64_t k = k0; k < k1; ++k) {
    run.step();
    const WT* r = g + k * 64;
    if constexpr (J0 == 0 && PF::kNear)
      for (int64_t l = 0; l < 64; l += kLine)  // prefetches do not fault past the end
        _mm_prefetch(reinterpret_cast<const char*>(r + kPrefetchK * 64 + l), static_cast<_mm_hint>(PF::kNearHint));
    F16 w[NJ];
    group_row<NJ, J0>(r, w);
    RG_UNROLL for (int i = 0; i < MR; ++i) {
      const F16 xb = F16::bcast(x[i * lda + k]);
      RG_UNROLL for (int j = 0; j < NJ; ++j) acc[i][j].fma(xb, w[j]);
    }
  }
  pf.end(run);
}

// The same over bf16 k pairs (bf16 compute): x [MR rows][pairs], g [pairs][64 words].
template <int MR, int NJ, int J0, typename PF>
inline void group_micro(const uint32_t* x, int64_t lda, const uint32_t* g, int64_t k0, int64_t k1,
                        F16 (&acc)[MR][NJ], PF& pf) {
  auto run = pf.begin(k1 - k0);
  for (int64_t k = k0; k < k1; ++k) {
    run.step();
    const uint32_t* r = g + k * 64;
    if constexpr (J0 == 0 && PF::kNear)
      for (int64_t l = 0; l < 64; l += 16)  // the same bytes ahead as the bf16 stream
        _mm_prefetch(reinterpret_cast<const char*>(r + kPrefetchK / 2 * 64 + l), static_cast<_mm_hint>(PF::kNearHint));
    P16 w[NJ];
    RG_UNROLL for (int j = 0; j < NJ; ++j) w[j] = P16::load(r + 16 * (J0 + j));
    RG_UNROLL for (int i = 0; i < MR; ++i) {
      const X2 xb = X2::bcast(x[i * lda + k]);
      RG_UNROLL for (int j = 0; j < NJ; ++j) dot2(acc[i][j], w[j], xb);
    }
  }
  pf.end(run);
}

// Rows [m0, m1) of one group over k chunks of kKC: every row tile runs a chunk while it is in L1,
// the partial sums wait in `part` ([rows][64]) between chunks (the chain order is unchanged).
template <int MR, int NJ, int J0, typename XT, typename WT, typename PF = NoAhead>
inline void group_tile(const XT* x, int64_t lda, const WT* g, int64_t k0, int64_t k1, float* part, bool first,
                       PF&& pf = PF()) {
  F16 acc[MR][NJ];
  RG_UNROLL for (int i = 0; i < MR; ++i)
    RG_UNROLL for (int j = 0; j < NJ; ++j) acc[i][j] = first ? F16::zero() : F16::load(part + i * 64 + 16 * (J0 + j));
  group_micro<MR, NJ, J0>(x, lda, g, k0, k1, acc, pf);
  RG_UNROLL for (int i = 0; i < MR; ++i)
    RG_UNROLL for (int j = 0; j < NJ; ++j) acc[i][j].store(part + i * 64 + 16 * (J0 + j));
}

constexpr int64_t kKC = 128;  // k chunk: 16 KB of a bf16 group (as many bytes of k pairs)

// Register tiles. AVX-512's 32 registers hold 6 rows x a whole group (24 accumulators). AVX2 has 16
// registers of half the width: a tile keeps at most 12 accumulators, its weights and a broadcast, and
// anything larger spilled (3 rows x 2 panels, 2 x 4). There, one row keeps the whole group (8
// accumulators, one pass over the k chunk); two rows run 2 x 2 tiles (two passes); more rows run
// tiles of 1 panel (four passes), as few tiles as hold 6 rows each, with the rows split evenly among
// them: from cache (an ad-hoc loop on the Zen 3 EPYC), 3-6 row tiles ran at 65-90 GFLOP/s a core,
// 2 rows x 1 panel at ~45 and 1 row at ~24, so 8 rows run as 4 + 4 and 7 as 4 + 3, not 6 + 2 and 6 + 1.
constexpr int64_t kRowsAvx2 = 6;
// The same limit for attention's tiles and the draft adapter's: rows x 16-column panels per tile
// (scores: query rows x key panels; P·V: query rows x head-dimension panels; adapter: rows x 1 panel).
// AVX-512: 6 rows x 4 panels is 24 accumulators + 4 panels + a broadcast of the 32 registers.
#if defined(__AVX512F__)
constexpr int kScoreRows = 6, kScorePanels = 4, kPvRows = 6, kNarrowRows = 8;
constexpr bool kPvAllPanels = true;  // P·V takes every panel of the head dimension in one pass
#else
constexpr int kScoreRows = 6, kScorePanels = 1, kPvRows = 6, kNarrowRows = 6;
constexpr bool kPvAllPanels = false;
#endif

// fn(std::integral_constant<int, R>{}) for the r in [1, MaxR] given at run time.
template <int MaxR, typename F>
inline void with_rows(int64_t r, const F& fn) {
  if constexpr (MaxR >= 1) {
    if (r == MaxR) fn(std::integral_constant<int, MaxR>{});
    else with_rows<MaxR - 1>(r, fn);
  }
}

// n rows in as few tiles of at most MaxR rows as hold them, as even as they go: fn(R, m0) per tile of
// rows [m0, m0 + R), R an integral_constant. Each tile is a pass over its keys or values, so a GQA
// group of 3 query heads runs as one tile of 3, not 2 + 1 (batch-64 decode: each slot's keys and
// values converted from bf16 twice), and 8 rows as 4 + 4, not 6 + 1 + 1.
template <int MaxR, typename F>
inline void even_row_tiles(int64_t n, const F& fn) {
  const int64_t tiles = (n + MaxR - 1) / MaxR;
  int64_t m = 0;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t r = n / tiles + (t < n % tiles ? 1 : 0);
    with_rows<MaxR>(r, [&](auto R) { fn(R, m); });
    m += r;
  }
}

// Attention's cached keys and values, asked into L2 ahead of their reads: a batch-64 decode step
// reads each row's keys, computes, then reads its values, one row after another, and waited on
// DRAM at each (its attention took as long as its arithmetic from cache plus its bytes at the
// machine's bandwidth). Keys a group of score panels ahead (64 keys), values 32 rows ahead and, as
// an item starts, its first values: with the row tiles below, 64x1 attention ran 1.29x (55.5 to 43.0
// ms, bf16 + KV on the AMX Xeon). L1 hints timed 1.18x; 2 groups / 64 rows ahead, the values' head
// after the scores, the next item's first keys (items handed out in runs) all within 0.97-1.04x.
constexpr int64_t kKeyAheadGroups = 1, kValueAheadRows = 32;
// Value rows per block of AVX2's one-pass P·V (pv_stream): 8 KB of float32 values, in L1 for every query row.
constexpr int64_t kPvBlock = 32;
inline void prefetch_l2(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t l = 0; l < bytes; l += 64) _mm_prefetch(c + l, _MM_HINT_T1);
}

// AVX2: panels for a tile of n rows (4 for one row, 2 for two, else 1); tiles per pass over n rows.
constexpr int avx2_panels(int64_t n) { return n == 1 ? 4 : n == 2 ? 2 : 1; }
constexpr int64_t avx2_tiles(int64_t n) { return n <= 2 ? 1 : (n + kRowsAvx2 - 1) / kRowsAvx2; }
constexpr int64_t avx2_calls(int64_t n) { return 4 / avx2_panels(n) * avx2_tiles(n); }  // tile calls a k chunk
// 7 and 8 rows (a block of 8, a batch of 8 AR rows) run as a 6-row tile, 12 FMA chains, and a tail of 1 row x 4
// panels or 2 x 2 (8 chains), not as 4 + 3 or 4 + 4: 8 chains is just the FMA latency's worth, with no slack.
// From cache a 4-row tile ran at ~72 % of the FMA rate (docs/engine.md, "What bounds a few-row forward on
// AVX2"); 1x7 1.22x, 1x8 1.09-1.14x and 8x1 1.07-1.09x paired on the Zen 3 EPYC (bench_forward.py,
// docs/bench/forward-avx2-six-plus-two). 3 rows as 2 x 2 + 1 x 4 read 1.00-1.03x: they stay 3 x 1.
constexpr int64_t avx2_tail(int64_t n) { return n == 7 || n == 8 ? n - kRowsAvx2 : 0; }

// Rows [m0, m0 + n) of panels [J0, 4) over one k chunk, a pass per NJ panels (NJ = avx2_panels(n)),
// each pass in avx2_tiles(n) tiles of rows as even as they go.
template <int NJ, int J0, typename XT, typename WT, typename PF>
inline void avx2_passes(const XT* x, int64_t lda, const WT* g, int64_t kc, int64_t ke, int64_t m0, int64_t n,
                        float* part, bool first, PF& pf) {
  const int64_t tiles = avx2_tiles(n);
  for (int64_t t = 0, m = 0; t < tiles; ++t) {
    const int64_t r = n / tiles + (t < n % tiles);
    auto tile = [&](auto rows) {
      constexpr int R = decltype(rows)::value;
      group_tile<R, NJ, J0>(x + (m0 + m) * lda, lda, g, kc, ke, part + m * 64, first, pf);
    };
    if constexpr (NJ == 4) tile(std::integral_constant<int, 1>());
    else if constexpr (NJ == 2) tile(std::integral_constant<int, 2>());
    else switch (r) {
      case 3: tile(std::integral_constant<int, 3>()); break;
      case 4: tile(std::integral_constant<int, 4>()); break;
      case 5: tile(std::integral_constant<int, 5>()); break;
      default: tile(std::integral_constant<int, 6>()); break;
    }
    m += r;
  }
  if constexpr (J0 + NJ < 4) avx2_passes<NJ, J0 + NJ>(x, lda, g, kc, ke, m0, n, part, first, pf);
}

// Rows [m0, m1) of one group (K packed k rows from g) into part ([rows][64]). `run_end`: the end of
// this thread's run of groups, the limit of the next-chunk prefetch (Ahead; the next group continues g).
// `shared`: other items read the same group for other rows (a GEMM of more than one block of rows).
template <typename XT, typename WT>
void group_rows(const XT* x, int64_t lda, const WT* g, int64_t K, int64_t m0, int64_t m1, float* part,
                const WT* run_end, bool shared) {
  constexpr int64_t kc_rows = std::is_same<WT, uint32_t>::value ? kKC / 2 : kKC;
  const int64_t n = m1 - m0;
#if defined(__AVX512F__)
  // Tiles of 6, 4, 2 and 1 rows (below): more than 6 rows take several passes over each k chunk.
  const int64_t calls = n / 6 + n % 6 / 4 + n % 6 % 4 / 2 + n % 2;
#else
  const int64_t tail = avx2_tail(n), head = n - tail;
  const int64_t calls = avx2_calls(head) + (tail ? avx2_calls(tail) : 0);  // tile calls per k chunk
#endif
  const int64_t per_call = (kc_rows * 64 * int64_t(sizeof(WT)) / 64 + calls - 1) / calls;
  Ahead<true> pf_first{nullptr, reinterpret_cast<const char*>(run_end), per_call};
  Ahead<false> pf{nullptr, reinterpret_cast<const char*>(run_end), per_call};
  for (int64_t kc = 0; kc < K; kc += kc_rows) {
    const int64_t ke = std::min(K, kc + kc_rows);
    const bool first = kc == 0;
#if defined(__AVX512F__)
    auto passes = [&](auto& ahead) {
      int64_t m = m0;
      for (; m + 6 <= m1; m += 6) group_tile<6, 4, 0>(x + m * lda, lda, g, kc, ke, part + (m - m0) * 64, first, ahead);
      for (; m + 4 <= m1; m += 4) group_tile<4, 4, 0>(x + m * lda, lda, g, kc, ke, part + (m - m0) * 64, first, ahead);
      for (; m + 2 <= m1; m += 2) group_tile<2, 4, 0>(x + m * lda, lda, g, kc, ke, part + (m - m0) * 64, first, ahead);
      for (; m < m1; ++m) group_tile<1, 4, 0>(x + m * lda, lda, g, kc, ke, part + (m - m0) * 64, first, ahead);
    };
    // A prompt's blocks of 33-64 rows share each group's chunks through the cache (gemm_t hands them out
    // group-major), and there the spread prefetch read 0.97-0.98x on a 4 x 280 float32 prefill: off. Blocks
    // of up to 32 rows (a step's) keep it, shared or not: 48x1 and 64x1 (blocks of 24 and 32) read 1.04x
    // with it in bf16 (bench_forward.py, the Zen 4 EPYC, 2026-12-07).
    const bool near_l2 = calls == 1, one_pass = near_l2 || n > 32;
    (void)shared;
    const bool bare = false;
#else
    auto passes = [&](auto& ahead) {
      auto rows = [&](int64_t m, int64_t r) {  // rows [m0 + m, m0 + m + r) in avx2_panels(r) panels a pass
        if (r == 1) avx2_passes<4, 0>(x, lda, g, kc, ke, m0 + m, r, part + m * 64, first, ahead);
        else if (r == 2) avx2_passes<2, 0>(x, lda, g, kc, ke, m0 + m, r, part + m * 64, first, ahead);
        else avx2_passes<1, 0>(x, lda, g, kc, ke, m0 + m, r, part + m * 64, first, ahead);
      };
      rows(0, head);
      if (tail) rows(head, tail);
    };
    // Where several blocks of rows share a group (more than 16 rows: a batch-64 step, a prompt), its FMAs
    // outlast its bytes many times over and the other blocks find it in cache: there the spread prefetch
    // only costs (a branch and a counter per k step in every tile), and each chunk's first pass prefetches
    // as one pass does. 64x1 float32 on the Zen 3 EPYC: 1.00-1.09x paired in three bench_forward.py runs
    // (bests 0.99-1.06x; docs/bench/forward-avx2-shared-groups), at the edge of that host's noise.
    const bool near_l2 = false, bare = n == 1, one_pass = shared;
#endif
    const char* next = reinterpret_cast<const char*>(g + ke * 64);  // the next chunk (or the next group's first)
    if (near_l2) {  // one pass of up to 6 rows: its own prefetch streams on, into L2 (NoAheadL2)
      NoAheadL2 none;
      passes(none);
    } else if (bare) {  // AVX2's one row: the hardware prefetchers alone (NoPrefetch)
      NoPrefetch none;
      passes(none);
    } else if (one_pass) {  // one pass per chunk: its own prefetch streams on
      NoAhead none;
      passes(none);
    } else if (kc == 0) {  // a run's first chunk had nothing ahead of it: the first pass prefetches too
      pf_first.p = next;
      passes(pf_first);
    } else {
      pf.p = next;
      passes(pf);
    }
  }
}

// Rows [m0, m1) of a GEMM's block of sums (row m at part + (m - m0) * 64), their first `cols` columns, into
// the same rows of y (ld ldy): added (accumulate) or stored.
inline void put_rows(const float* part, int64_t m0, int64_t m1, float* y, int64_t ldy, int64_t cols, bool accumulate) {
  for (int64_t m = m0; m < m1; ++m) {
    const float* src = part + (m - m0) * 64;
    float* out = y + m * ldy;
    if (accumulate) { for (int64_t q = 0; q < cols; ++q) out[q] += src[q]; }
    else std::memcpy(out, src, sizeof(float) * cols);
  }
}

constexpr int64_t kNarrowAhead = 128;  // k rows of 16 weights: 4 KB of bf16 ahead

// y[:, 16q : 16q + 16] (+)= x · panel q^T for MR rows (the NarrowW's FMA chains, in k order).
template <int MR, typename WT>
inline void narrow_tile(const float* x, int64_t lda, const WT* w, int64_t k0, int64_t k1, float* y, int64_t ldy,
                        int64_t valid, bool accumulate) {
  // A run's panels lie back to back, each only a few KB: without software prefetch (kNarrowAhead rows
  // ahead, past this panel's end into the next one's) the stream waited on DRAM latency line by line.
  constexpr int64_t kLine = 64 / sizeof(WT);
  F16 acc[MR];
  RG_UNROLL for (int i = 0; i < MR; ++i) acc[i] = F16::zero();
  for (int64_t k = k0; k < k1; ++k) {
    if (((k - k0) * 16) % kLine == 0)
      _mm_prefetch(reinterpret_cast<const char*>(w + (k - k0 + kNarrowAhead) * 16), _MM_HINT_T0);
    const F16 wv = F16::load(w + (k - k0) * 16);
    RG_UNROLL for (int i = 0; i < MR; ++i) acc[i].fma(F16::bcast(x[i * lda + k]), wv);
  }
  RG_UNROLL for (int i = 0; i < MR; ++i) store_cols(acc[i], y + i * ldy, valid, accumulate);
}

// Rows [m0, m1) of panel q of a NarrowW, in tiles of up to kNarrowRows rows, as even as they go (a draft
// row's 7 mask tokens as one tile of 7, not 4 + 1 + 1 + 1): y (+)= x · panel q^T.
inline void narrow_rows(const float* x, int64_t lda, const NarrowW& w, int64_t q, int64_t m0, int64_t m1, float* y,
                        int64_t ldy, bool accumulate) {
  const int64_t k0 = w.k0[q], k1 = w.k1[q], valid = std::min<int64_t>(16, w.N - q * 16);
  float* yq = y + q * 16;
  auto rows = [&](auto wp) {
    even_row_tiles<kNarrowRows>(m1 - m0, [&](auto R, int64_t i) {
      const int64_t m = m0 + i;
      narrow_tile<R()>(x + m * lda, lda, wp, k0, k1, yq + m * ldy, ldy, valid, accumulate);
    });
  };
  if (w.is_bf16) rows(w.bf16.data() + w.off[q]); else rows(w.f32.data() + w.off[q]);
}

// A draft adapter on a projection's GEMM: y += (gate ∘ (x · A^T)) · B^T, run inside the GEMM's pool run.
// - The first product, low = gate ∘ (x · A^T), is the run's first items, one per panel of A (1-3 a
//   projection), while the other thread starts on the projection. As passes of their own before the GEMM
//   (a few KB of weights each, too little work to split) they ran on one thread, waiting on DRAM.
// - The second, low · B^T, each item adds to the outputs it has written, once the first items are done
//   (they are handed out first, so the wait is short and always ends). As passes after the GEMM (B's ~300
//   panels of 16 x 16 weights a layer) they were over half of a draft forward's adapter time.
// - The sums are the passes': low is the NarrowW product times the gate, and y holds the projection when
//   B's chain (from zero, in k order) is added to it.
// Rows whose draft gate is 0 (a fused forward's verify rows) are left alone: their low-rank values are
// zeros, which added nothing but +0 (and cost as much as a draft row: a third of a fused forward's
// MLP increment over a verify forward's), so they keep their projection exactly, as in a plain verify.
struct LowRankAdd {
  float* low;  // [rows][ld], ld = A's rows
  int64_t ld;
  const NarrowW* a;
  const NarrowW* b;
  const float* gate;  // per row
  const float* x;     // the projection's input rows (ld lda)
  int64_t lda, rows;
  std::atomic<int64_t>* a_done;  // first items finished
};

// Runs of consecutive draft rows (gate != 0) in [m0, m1): fn(m, e) for each.
template <typename F>
inline void draft_runs(const float* gate, int64_t m0, int64_t m1, const F& fn) {
  for (int64_t m = m0; m < m1;) {
    if (gate[m] == 0.f) {
      ++m;
      continue;
    }
    int64_t e = m + 1;
    while (e < m1 && gate[e] != 0.f) ++e;
    fn(m, e);
    m = e;
  }
}

// First item q: panel q of low for the draft rows, times their gates.
inline void low_rank_item(const LowRankAdd& lr, int64_t q) {
  const int64_t c0 = q * 16, c1 = std::min<int64_t>(lr.a->N, c0 + 16);
  draft_runs(lr.gate, 0, lr.rows, [&](int64_t m, int64_t e) {
    narrow_rows(lr.x, lr.lda, *lr.a, q, m, e, lr.low, lr.ld, false);
    for (int64_t r = m; r < e; ++r)
      for (int64_t c = c0; c < c1; ++c) lr.low[r * lr.ld + c] *= lr.gate[r];
  });
  lr.a_done->fetch_add(1, std::memory_order_release);
}

// The number of first items a GEMM with this adapter hands out before its own.
inline int64_t low_rank_items(const LowRankAdd* lr) { return lr ? lr->a->panels : 0; }

// A GEMM's n items on the pool, after the adapter's first items where it has one (low_rank_item): fn(b, e)
// for each range of the GEMM's own items, numbered from 0. Ranges come in order (one item at a time from the
// pool, or all of them on the calling thread), so a range never mixes the two kinds out of order.
template <typename F>
inline void gemm_items(const LowRankAdd* lr, int64_t n, int64_t work_per_item, const F& fn) {
  const int64_t na = low_rank_items(lr);
  par_items(na + n, work_per_item, [&](int64_t b, int64_t e) {
    for (; b < std::min(e, na); ++b) low_rank_item(*lr, b);
    if (b < e) fn(b - na, e - na);
  });
}

// B's panels [q0, q1) asked into cache as a block of outputs starts, so they arrive while its sums run.
inline void prefetch_low_rank(const LowRankAdd* lr, int64_t q0, int64_t q1) {
  if (lr == nullptr || q0 >= lr->b->panels) return;
  const NarrowW& b = *lr->b;
  const int64_t e = q1 < b.panels ? b.off[q1] : static_cast<int64_t>(b.is_bf16 ? b.bf16.size() : b.f32.size());
  const int64_t bytes = (e - b.off[q0]) * (b.is_bf16 ? 2 : 4);
  if (b.is_bf16) prefetch_l2(b.bf16.data() + b.off[q0], bytes); else prefetch_l2(b.f32.data() + b.off[q0], bytes);
}

// Rows [m0, m1) of output panels [q0, q1) (of 16 columns: B's panels; y points at panel q0's column 0), at the
// end of an item, after the first items.
inline void add_low_rank(const LowRankAdd& lr, int64_t m0, int64_t m1, int64_t q0, int64_t q1, float* y, int64_t ldy) {
  wait_count(*lr.a_done, low_rank_items(&lr));
  draft_runs(lr.gate, m0, m1, [&](int64_t m, int64_t e) {
    for (int64_t q = q0; q < std::min(q1, lr.b->panels); ++q)
      narrow_rows(lr.low, lr.ld, *lr.b, q, m, e, y - q0 * 16, ldy, true);
  });
}

// Bounds of the runs of consecutive panels gemm_amx's items take when its rows fit one item: each run a
// 1 / (2 · threads) share of the panels left, in whole blocks of 4 (AMX's 4-panel products; a run of 5
// took a 1-panel block, slow where a GEMM has rows to reuse it: 64x1 0.96x), so the runs shrink as the
// work runs out and the threads end together. In equal runs (4 a thread), a 1-token step's thread that
// finished first waited 7-13 % of each projection's time for the other (per-item cycle counts on the
// AMX Xeon), and streamed nothing meanwhile; shrinking runs cut that wait by 2-3x. Whole forwards read
// 0.98-1.05x in bench_forward.py, within this host's noise (one kernel against its copy: 0.96-1.00x).
// The runs never change the arithmetic (see gemm_t).
inline std::vector<int64_t> shrinking_runs(int64_t n, int64_t threads) {
  std::vector<int64_t> b{0};
  while (b.back() < n) {
    const int64_t left = n - b.back(), share = (left + 2 * threads - 1) / (2 * threads);
    b.push_back(b.back() + std::min(left, (share + 3) / 4 * 4));
  }
  return b;
}

// Columns [col0, col0 + ncols) of x · W^T (col0 a multiple of 64) into y (ld ldy, column 0 = col0).
// Items: up to 8 rows, runs of consecutive groups (about kRunsPerThread per thread: each thread's
// weights stream on, prefetchers warm; shrinking runs, as gemm_amx's, read float32 1x8-8x1 0.95-0.97x on
// the AMX Xeon, at the edge of its noise); more rows, (group, block of rows), group-major so the threads
// share a group's weights through the cache. Up to 32 rows are one block (one pass over the weights): in
// blocks of 16, a 17th token (16 AR rows and a 2-token verify, a 1x17 block) made a second block of one row
// that ran the whole GEMM again at a 1-row tile's rate: 1x17 cost 1.25x 1x16 where 1/16 more FMAs were due
// (bf16, the Zen 4 EPYC); one block: 1x17 1.32x, 1x24 1.22x, 32x1 1.07x faster, 64x1 (two blocks of 32)
// 1.03x, M <= 16 unchanged; float32 1x17 1.08x; the AVX2 path 1x17 1.32x, 1x24 1.29x, 32x1 1.15x
// (bench_forward.py --before, 2026-12-07). Past 32 rows, blocks of at most 32 (64 from 256 rows: a
// prompt's), as even as they go. Tiles never change the arithmetic: every output element is one FMA chain
// over k (batch invariance).
template <typename XT, typename WT>
void gemm_t(const XT* x, int64_t M, int64_t lda, const WT* w, const PackedW& pw, int64_t col0, int64_t ncols,
            float* y, int64_t ldy, bool accumulate, const LowRankAdd* lr) {
  TORCH_CHECK(col0 % 64 == 0, "gemm: col0 must be a multiple of 64");
  const int64_t cap = M >= 256 ? 64 : 32, mblocks = (M + cap - 1) / cap;
  const int64_t block_rows = (M + mblocks - 1) / mblocks;  // the most rows a block holds (never more than M)
  const int64_t K = pw.rows, g0 = col0 / 64, groups = (ncols + 63) / 64;
  const int64_t threads = g_pool ? g_pool->threads() : 1;
  const int64_t per = mblocks == 1 ? std::max<int64_t>(1, groups / (threads * kRunsPerThread)) : 1;
  const int64_t chunks = (groups + per - 1) / per;
  gemm_items(lr, chunks * mblocks, per * block_rows * 64 * K, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> part;
    part.resize(static_cast<size_t>(block_rows * 64));
    for (int64_t it = b; it < e; ++it) {
      const int64_t c = it / mblocks, mb = it % mblocks;
      const int64_t m0 = M * mb / mblocks, m1 = M * (mb + 1) / mblocks;
      const int64_t gend = std::min(groups, (c + 1) * per);
      for (int64_t g = c * per; g < gend; ++g) {
        prefetch_low_rank(lr, (g0 + g) * 4, (g0 + g) * 4 + 4);
        group_rows(x, lda, w + (g0 + g) * K * 64, K, m0, m1, part.data(), w + (g0 + gend) * K * 64, mblocks > 1);
        put_rows(part.data(), m0, m1, y + g * 64, ldy, std::min<int64_t>(64, ncols - g * 64), accumulate);
      }
      if (lr) add_low_rank(*lr, m0, m1, (g0 + c * per) * 4, (g0 + gend) * 4, y + c * per * 64, ldy);
    }
  });
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
// Tiles: 0-3 a 16-row block of up to four 16-column panels of y (float32), 4 the rows' next 16 k pairs,
// 5 and 6 the panels' next 16 pair rows (alternating, so a load overlaps the previous product). The
// attention (NLDCpu::attention_pairs) takes tile 7 as well; every tile is 16 rows of 64 bytes.
struct AmxConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  AmxConfig() {
    for (int t = 0; t < 8; ++t) { colsb[t] = 64; rows[t] = 16; }
  }
};

// One panel's next 16 pair rows into tile B and the product into tile C (a macro: the intrinsics take
// their tile numbers as literals).
#define RG_AMX_PANEL_STEP(C, B, w) do { _tile_loadd(B, (w), 64); _tile_dpbf16ps(C, 4, B); } while (0)

// A 16-row block of NP panels: part[16][64] (column 16j: panel j) = xp rows · panels, one TDPBF16PS
// chain per 16-pair step in k order (the same for every M: rows past M are zeros, never written back).
// w: the first panel ([K2][16] words each, panels back to back). No software prefetch: each panel is
// one contiguous stream the hardware prefetchers follow (prefetching 2, 4 or 12 steps ahead timed the
// same or slower than none in bench_forward.py on the Xeon, 1x1 to 64x1).
template <int NP>
inline void amx_block(const uint32_t* xp, int64_t K2, const uint32_t* w, float* part) {
  _tile_zero(0);
  if constexpr (NP > 1) _tile_zero(1);
  if constexpr (NP > 2) _tile_zero(2);
  if constexpr (NP > 3) _tile_zero(3);
  const int64_t stride = K2 * 16;  // words from one panel to the next
  for (int64_t k = 0; k < K2; k += kAmxPairs) {
    const uint32_t* r = w + k * 16;
    _tile_loadd(4, xp + k, K2 * 4);
    RG_AMX_PANEL_STEP(0, 5, r);
    if constexpr (NP > 1) RG_AMX_PANEL_STEP(1, 6, r + stride);
    if constexpr (NP > 2) RG_AMX_PANEL_STEP(2, 5, r + 2 * stride);
    if constexpr (NP > 3) RG_AMX_PANEL_STEP(3, 6, r + 3 * stride);
  }
  _tile_stored(0, part, 256);
  if constexpr (NP > 1) _tile_stored(1, part + 16, 256);
  if constexpr (NP > 2) _tile_stored(2, part + 32, 256);
  if constexpr (NP > 3) _tile_stored(3, part + 48, 256);
}

// Row blocks of 16 per item of a many-row GEMM (a prompt's prefill): 256 rows of x (at most 786 KB of
// bf16 pairs at SmolLM2's widest k) stay in L2 while a run's panels pass over them, where over all the
// rows at once each 4-panel block re-read x from L3 (2.4-6.3 MB for 4 prompts of 512 tokens). A 4 x 512
// prefill ran 1.06x (bench_forward.py --prefill on the Xeon). The prefill's projections still run at
// ~1.2 TFLOP/s of AMX's ~6.8 (its phase timers); blocks of 2 panels (weights kept in L1) were slower.
constexpr int64_t kAmxRowBlocks = 16;

// Columns [col0, col0 + ncols) of xp · W^T on AMX (xp: bf16 pairs [ceil(M / 16) * 16][pw.rows], the
// rows past M zero; W packed in 16-column panels). Items: (chunk of kAmxRowBlocks row blocks, run of
// consecutive panels): for one chunk (up to 256 rows) shrinking runs of whole 4-panel blocks, for more
// kRunsPerThread runs per thread, as even as they go (a 64-column group was the unit before: 9 groups
// of o_proj on 2 threads left one idle for a ninth of the step); inside an item,
// blocks of 4 panels, and for each block every 16-row block of the chunk in turn while the block's
// weights are in L2.
void gemm_amx(const uint32_t* xp, int64_t M, const PackedW& pw, int64_t col0, int64_t ncols, float* y, int64_t ldy,
              bool accumulate, const LowRankAdd* lr) {
  TORCH_CHECK(col0 % 16 == 0, "gemm: col0 must be a multiple of 16");
  const int64_t K2 = pw.rows, p0 = col0 / 16, np = (ncols + 15) / 16, mblocks = (M + 15) / 16;
  const int64_t chunks = (mblocks + kAmxRowBlocks - 1) / kAmxRowBlocks;
  const int64_t threads = g_pool ? g_pool->threads() : 1;
  std::vector<int64_t> bounds;  // panel bounds of the runs
  if (chunks == 1) {
    bounds = shrinking_runs(np, threads);
  } else {
    const int64_t n = std::min(np, threads * kRunsPerThread);
    for (int64_t r = 0; r <= n; ++r) bounds.push_back(np * r / n);
  }
  const int64_t runs = static_cast<int64_t>(bounds.size()) - 1;
  const uint32_t* w = pw.pairs.data();
  const int64_t work = (np / runs + 1) * 16 * 16 * std::min(mblocks, kAmxRowBlocks) * K2;
  gemm_items(lr, chunks * runs, work, [&](int64_t b, int64_t e) {
    static const AmxConfig cfg;
    _tile_loadconfig(&cfg);  // every time: other code on this thread (oneDNN) may load its own
    alignas(64) float part[16 * 64];
    for (int64_t item = b; item < e; ++item) {
      const int64_t it = item % runs, mb0 = item / runs * kAmxRowBlocks;
      const int64_t mb1 = std::min(mblocks, mb0 + kAmxRowBlocks);
      const int64_t pb = bounds[it], pe = bounds[it + 1];
      for (int64_t q = pb; q < pe; q += 4) {
        const int64_t n = std::min<int64_t>(4, pe - q);
        const uint32_t* wq = w + (p0 + q) * K2 * 16;
        const int64_t cols = std::min(16 * n, ncols - q * 16);
        if (mb0 == 0) prefetch_low_rank(lr, p0 + q, p0 + q + n);
        for (int64_t mb = mb0; mb < mb1; ++mb) {
          const uint32_t* xb = xp + mb * 16 * K2;
          switch (n) {
            case 4: amx_block<4>(xb, K2, wq, part); break;
            case 3: amx_block<3>(xb, K2, wq, part); break;
            case 2: amx_block<2>(xb, K2, wq, part); break;
            default: amx_block<1>(xb, K2, wq, part); break;
          }
          put_rows(part, mb * 16, std::min(M, mb * 16 + 16), y + q * 16, ldy, cols, accumulate);
        }
      }
      if (lr) add_low_rank(*lr, mb0 * 16, std::min(M, mb1 * 16), p0 + pb, p0 + pe, y + pb * 16, ldy);
    }
    _tile_release();
  });
}
#else
void gemm_amx(const uint32_t*, int64_t, const PackedW&, int64_t, int64_t, float*, int64_t, bool, const LowRankAdd*) {
  TORCH_CHECK(false, "gemm_amx: this build has no AMX");
}
#endif

void gemm(const float* x, int64_t M, int64_t lda, const PackedW& pw, int64_t col0, int64_t ncols, float* y,
          int64_t ldy, bool accumulate, const LowRankAdd* lr = nullptr) {
  if (M == 0 || ncols == 0) return;
  if (pw.is_pairs) {  // bf16 compute: the rows rounded to bf16 pairs once, then pair dot products
    thread_local std::vector<uint32_t> xb;
    const int64_t Mp = pw.amx ? (M + 15) / 16 * 16 : M;  // AMX: whole tiles of rows, the extra ones zero
    xb.resize(static_cast<size_t>(Mp * pw.rows));
    uint32_t* xp = xb.data();  // the caller's buffer (a worker's thread_local would be its own)
    par_rows(M, 8, pw.K, [&](int64_t b, int64_t e) {
      to_bf16_pairs(x + b * lda, e - b, lda, pw.K, xp + b * pw.rows, pw.rows);
    });
    std::fill(xp + M * pw.rows, xp + Mp * pw.rows, 0u);
    if (pw.amx) gemm_amx(xp, M, pw, col0, ncols, y, ldy, accumulate, lr);
    else gemm_t(xp, M, pw.rows, pw.pairs.data(), pw, col0, ncols, y, ldy, accumulate, lr);
  } else if (pw.is_bf16) gemm_t(x, M, lda, pw.bf16.data(), pw, col0, ncols, y, ldy, accumulate, lr);
  else gemm_t(x, M, lda, pw.f32.data(), pw, col0, ncols, y, ldy, accumulate, lr);
}

struct Timers {
  double norm = 0, qkv = 0, rope_kv = 0, attention = 0, o_proj = 0, mlp = 0, head = 0, reduce = 0;
};

struct Layer {
  at::Tensor ln1, ln2;
  PackedW wqkv, wo, wgu, wd;                      // base projections ([out, in] before packing)
  NarrowW aqkv, bqkv, ao, bo, agu, bgu, ad, bd;   // draft adapter (LoRA A, scaled block-diagonal B)
  // Set after construction (set_attention_extras), undefined where the architecture has none:
  at::Tensor qkv_bias;        // [W] float32: Qwen2's q/k/v biases
  at::Tensor q_norm, k_norm;  // [hd] float32: Qwen3's per-head RMSNorm of queries and keys, before RoPE
};

// max(s[0:n]) (NaNs skipped, as std::max(m, s) skips them): 16 lane maxima, then the lanes. GCC
// leaves an `omp simd reduction(max)` loop scalar here, which was a quarter of prefill attention; a
// maximum is exact, so the order does not change it.
inline float row_max(const float* s, int64_t n) {
  const float ninf = -std::numeric_limits<float>::infinity();
  alignas(64) float lanes[16];
  for (float& l : lanes) l = ninf;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
#pragma omp simd
    for (int l = 0; l < 16; ++l) lanes[l] = s[j + l] > lanes[l] ? s[j + l] : lanes[l];
  float m = ninf;
  for (; j < n; ++j) m = std::max(m, s[j]);
  for (float l : lanes) m = std::max(m, l);
  return m;
}

// Per packed (row, token): `end`, one past the last new-token key its intra-mask row lets it see, and
// `prefix`, whether that row is exactly keys [0, end) (causal prompt and verify rows; a draft row's
// tri-mode mask may not be). Built once per forward: every layer and head reads the same mask.
struct IntraRows {
  std::vector<int32_t> end;
  std::vector<uint8_t> prefix;
};

IntraRows intra_rows(const bool* im, const int64_t* rs, int64_t B, int64_t T) {
  IntraRows ir;
  ir.end.assign(static_cast<size_t>(B * T), 0);
  ir.prefix.assign(static_cast<size_t>(B * T), 0);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = rs[b + 1] - rs[b];
    for (int64_t t = 0; t < len; ++t) {
      const bool* row = im + (b * T + t) * T;
      int64_t e = len;
      while (e > 0 && !row[e - 1]) --e;
      int64_t j = 0;
      while (j < e && row[j]) ++j;
      ir.end[b * T + t] = static_cast<int32_t>(e);
      ir.prefix[b * T + t] = j == e;
    }
  }
  return ir;
}

class NLDCpu {
 public:
  NLDCpu(at::Tensor embed, std::vector<std::vector<at::Tensor>> layers, at::Tensor norm, at::Tensor head,
         at::Tensor cos, at::Tensor sin, int64_t n_heads, int64_t n_kv, int64_t head_dim, double eps,
         int64_t mask_token, int64_t max_slots, int64_t capacity, int64_t threads, bool bf16_compute,
         bool kv_bf16)
      : embed_(embed), norm_(norm), cos_(cos), sin_(sin), H_(n_heads), KVH_(n_kv), hd_(head_dim),
        eps_(static_cast<float>(eps)), mask_token_(mask_token),
        slots_(max_slots), cap_(capacity), cap16_((capacity + 15) / 16 * 16), kv_bf16_(kv_bf16) {
    attn_ = pair_attention(bf16_compute && kv_bf16 && head_dim == 64);
    D_ = embed.size(1);
    V_ = head.size(0);
    static Pool pool(static_cast<int>(std::max<int64_t>(1, threads)));
    g_pool = &pool;
    // bf16 compute packs the base projections and the head as k pairs; the draft adapter's small
    // low-rank matrices keep float32 arithmetic (NarrowW: bf16 storage where exact).
    head_ = pack_weight(head, bf16_compute);
    for (auto& l : layers) {
      TORCH_CHECK(l.size() == 6 || l.size() == 14, "a layer has 6 base (+8 adapter) tensors");
      Layer L;
      L.ln1 = l[0]; L.ln2 = l[1];
      L.wqkv = pack_weight(l[2], bf16_compute); L.wo = pack_weight(l[3], bf16_compute);
      L.wgu = pack_weight(l[4], bf16_compute); L.wd = pack_weight(l[5], bf16_compute);
      if (l.size() == 14) {
        L.aqkv = pack_narrow(l[6]); L.bqkv = pack_narrow(l[7]); L.ao = pack_narrow(l[8]); L.bo = pack_narrow(l[9]);
        L.agu = pack_narrow(l[10]); L.bgu = pack_narrow(l[11]); L.ad = pack_narrow(l[12]); L.bd = pack_narrow(l[13]);
        has_adapter_ = true;
      }
      layers_.push_back(std::move(L));
      auto opts = at::TensorOptions().dtype(kv_bf16 ? at::kBFloat16 : at::kFloat);
      k_cache_.push_back(at::zeros({slots_, KVH_, cap16_ * hd_}, opts));  // key panels [cap/16][hd][16]
      // Attention on bf16 pairs: values as pairs of keys (see value_at), in whole panels' rows like the keys
      v_cache_.push_back(at::zeros({slots_, KVH_, attn_ != Attn::kFma ? cap16_ : cap_, hd_}, opts));
    }
    I_ = layers_[0].wd.K;
  }

  // One packed forward. ids/pos/gate/qscale: [N] over the real tokens, rows laid out one after the
  // other (row_start [B+1]); intra: [B, T, T] bool, T >= every row's length; out_rows: [M] packed
  // indices whose outputs are wanted. Returns argmax [M], top_ids [M, 3], top_probs [M, 3], the
  // log-sum-exp [M] and logits [M, V] (an empty tensor unless want_logits).
  std::vector<at::Tensor> forward(at::Tensor ids, at::Tensor pos, at::Tensor row_start, at::Tensor past_lens,
                                  at::Tensor slots, at::Tensor intra, at::Tensor gate, at::Tensor qscale,
                                  at::Tensor out_rows, bool write_kv, bool want_logits) {
    at::NoGradGuard no_grad;
    const bool timing = timing_;
    auto tick = [&]() { return timing ? Clock::now() : Clock::time_point(); };
    auto add = [&](double& acc, Clock::time_point t0) {
      if (timing) acc += std::chrono::duration<double>(Clock::now() - t0).count();
    };
    const int64_t N = ids.size(0), B = past_lens.size(0), T = intra.size(1);
    const int64_t Q = H_ * hd_, K = KVH_ * hd_, W = Q + 2 * K;
    const int64_t* rs = row_start.data_ptr<int64_t>();
    const int64_t* pl = past_lens.data_ptr<int64_t>();
    const int64_t* sl = slots.data_ptr<int64_t>();
    const int64_t* ps = pos.data_ptr<int64_t>();
    const bool* im = intra.data_ptr<bool>();
    const bool gated = has_adapter_ && gate.defined() && gate.numel() == N;
    // Draft gate per token (the adapter's scale is folded into its B matrices, native_backend.py).
    const float* gs = gated ? gate.data_ptr<float>() : nullptr;
    const float* qs = qscale.defined() && qscale.numel() == N ? qscale.data_ptr<float>() : nullptr;

    auto t0 = tick();
    auto f32 = at::TensorOptions().dtype(at::kFloat);
    // No ATen op that may open a parallel region of its own runs inside the forward: torch's OpenMP
    // workers would then spin on the cores this pool's workers need (it halved the speed).
    at::Tensor x = at::empty({N, D_}, f32);  // [N, D], the residual stream
    {
      // The table as the checkpoint stores it: float32, or bfloat16 rows widened here (exact).
      const bool bf16 = embed_.scalar_type() == at::kBFloat16;
      const int64_t* idp = ids.data_ptr<int64_t>();
      // A MASK in a draft-mode position reads the adapter's draft MASK embedding where it has one.
      const float* dme = gated && draft_embed_.defined() ? draft_embed_.data_ptr<float>() : nullptr;
      for (int64_t n = 0; n < N; ++n) {
        float* dst = x.data_ptr<float>() + n * D_;
        if (dme && idp[n] == mask_token_ && gs[n] > 0.f) {
          std::memcpy(dst, dme, sizeof(float) * D_);
        } else if (bf16) {
          const uint16_t* row = reinterpret_cast<const uint16_t*>(embed_.data_ptr<at::BFloat16>()) + idp[n] * D_;
          for (int64_t d = 0; d < D_; ++d) {
            const uint32_t u = static_cast<uint32_t>(row[d]) << 16;
            std::memcpy(dst + d, &u, 4);
          }
        } else {
          std::memcpy(dst, embed_.data_ptr<float>() + idp[n] * D_, sizeof(float) * D_);
        }
      }
    }
    at::Tensor h = at::empty({N, D_}, f32), qkv = at::empty({N, W}, f32), attn = at::empty({N, Q}, f32);
    at::Tensor gu = at::empty({N, 2 * I_}, f32), act = at::empty({N, I_}, f32);
    const int64_t R = has_adapter_ ? layers_[0].aqkv.N : 0;
    at::Tensor low = at::empty({gated ? N : 0, std::max<int64_t>(R, 1)}, f32);
    float *xp = x.data_ptr<float>(), *hp = h.data_ptr<float>(), *qp = qkv.data_ptr<float>();
    float *ap = attn.data_ptr<float>(), *gp = gu.data_ptr<float>(), *cp = act.data_ptr<float>();
    float* lp = low.data_ptr<float>();
    add(tm_.norm, t0);

    auto timed = [&](double& acc, auto&& fn) {  // fn's time into acc when timing is on
      const auto t = tick();
      fn();
      add(acc, t);
    };
    // The adapter's delta, y[:, :pb.N] += ((in · pa^T) * gate) · pb^T, computed by the projection's GEMM
    // (LowRankAdd; its time is in the projection's phase). Off-draft (gated == false) the projections run alone.
    std::atomic<int64_t> a_done{0};
    LowRankAdd lr{};
    auto low_rank = [&](const float* in, int64_t ld_in, const NarrowW& pa, const NarrowW& pb) -> const LowRankAdd* {
      if (!gated) return nullptr;
      a_done.store(0);
      lr = {lp, pa.N, &pa, &pb, gs, in, ld_in, N, &a_done};
      return &lr;
    };
    // The intra mask read once per forward, not once per layer and query head (a 512-token prompt's
    // causal rows made that scan and the masked score loop a third of a prefill forward).
    IntraRows ir;
    timed(tm_.attention, [&] { ir = intra_rows(im, rs, B, T); });
    const int64_t M = out_rows.size(0);
    const int64_t* orp = out_rows.data_ptr<int64_t>();
    bool trimmed = false;  // whether the last layer ran on the output rows only (x's first M rows)
    bool ascending = M < N;  // the output rows strictly ascending: compacting them in place is safe
    for (int64_t m = 0; ascending && m < M; ++m)
      ascending = orp[m] < N && (m == 0 ? orp[m] >= 0 : orp[m] > orp[m - 1]);
    for (size_t li = 0; li < layers_.size(); ++li) {
      const Layer& L = layers_[li];
      timed(tm_.norm, [&] { rmsnorm_rows(xp, L.ln1.data_ptr<float>(), hp, N, D_, eps_); });
      const LowRankAdd* lra = low_rank(hp, D_, L.aqkv, L.bqkv);
      timed(tm_.qkv, [&] {
        gemm(hp, N, D_, L.wqkv, 0, W, qp, W, false, lra);
        if (L.qkv_bias.defined()) add_bias(qp, N, W, L.qkv_bias.data_ptr<float>());
        if (L.q_norm.defined()) head_norms(qp, N, W, L.q_norm.data_ptr<float>(), L.k_norm.data_ptr<float>());
      });
      timed(tm_.rope_kv, [&] {
        rope(qp, ps, qs, N, W);
        if (kv_bf16_) round_kv(qp, N, W);
      });
      timed(tm_.attention, [&] { attention(qp, ap, li, rs, pl, sl, im, ir, B, T, W); });
      if (write_kv) timed(tm_.rope_kv, [&] { write_cache(qp, li, rs, pl, sl, B, W); });
      // The last layer's rows that no output reads (a prompt's but its last) need only the keys and
      // values written above: without a draft gate, the rest of the layer runs on the output rows
      // alone (every op is row by row, so their values are the same bits; ~3 % of a 30-layer prefill).
      const bool trim = li + 1 == layers_.size() && !gated && ascending;
      if (trim) {
        t0 = tick();
        for (int64_t m = 0; m < M; ++m) {
          std::memmove(ap + m * Q, ap + orp[m] * Q, sizeof(float) * Q);  // m <= orp[m]: not yet overwritten
          std::memmove(xp + m * D_, xp + orp[m] * D_, sizeof(float) * D_);
        }
        add(tm_.o_proj, t0);
      }
      const int64_t n = trim ? M : N;
      lra = low_rank(ap, Q, L.ao, L.bo);
      timed(tm_.o_proj, [&] { gemm(ap, n, Q, L.wo, 0, D_, xp, D_, true, lra); });
      timed(tm_.norm, [&] { rmsnorm_rows(xp, L.ln2.data_ptr<float>(), hp, n, D_, eps_); });
      lra = low_rank(hp, D_, L.agu, L.bgu);
      timed(tm_.mlp, [&] { gemm(hp, n, D_, L.wgu, 0, 2 * I_, gp, 2 * I_, false, lra); });  // gate | up
      timed(tm_.mlp, [&] { swiglu(gp, cp, n); });
      lra = low_rank(cp, I_, L.ad, L.bd);
      timed(tm_.mlp, [&] { gemm(cp, n, I_, L.wd, 0, D_, xp, D_, true, lra); });
      trimmed = trim;
    }

    t0 = tick();
    at::Tensor xo = x;
    if (trimmed) {
      xo = x.narrow(0, 0, M);  // the output rows, compacted in place by the trimmed last layer
    } else if (M != N) {
      xo = at::empty({M, D_}, f32);
      for (int64_t m = 0; m < M; ++m)
        std::memcpy(xo.data_ptr<float>() + m * D_, xp + orp[m] * D_, sizeof(float) * D_);
    }
    at::Tensor xn = at::empty({M, D_}, f32);
    rmsnorm_rows(xo.data_ptr<float>(), norm_.data_ptr<float>(), xn.data_ptr<float>(), M, D_, eps_);
    at::Tensor logits = at::empty({M, V_}, f32);
    gemm(xn.data_ptr<float>(), M, D_, head_, 0, V_, logits.data_ptr<float>(), V_, false);
    add(tm_.head, t0);
    t0 = tick();
    auto res = reduce(logits);
    add(tm_.reduce, t0);
    res.push_back(want_logits ? logits : at::empty({0}, f32));
    return res;
  }

  void copy_slot(int64_t src, int64_t dst, int64_t length) {
    const int64_t kn = (length + 15) / 16 * 16 * hd_;  // whole key panels
    for (size_t li = 0; li < layers_.size(); ++li) {
      k_cache_[li].select(0, dst).narrow(1, 0, kn).copy_(k_cache_[li].select(0, src).narrow(1, 0, kn));
      const int64_t vn = attn_ != Attn::kFma ? (length + 1) / 2 * 2 : length;  // bf16 pairs: whole pairs of keys
      v_cache_[li].select(0, dst).narrow(1, 0, vn).copy_(v_cache_[li].select(0, src).narrow(1, 0, vn));
    }
  }

  std::vector<at::Tensor> k_cache() const { return k_cache_; }
  bool amx_attention() const { return attn_ == Attn::kAmx; }
  // Which attention this model runs: "amx_bf16", "dot_bf16" (vdpbf16ps, or its emulation) or "fma".
  std::string attention_kind() const {
    return attn_ == Attn::kAmx ? "amx_bf16" : attn_ == Attn::kDot ? "dot_bf16" : "fma";
  }
  std::vector<at::Tensor> v_cache() const { return v_cache_; }
  void set_timing(bool on) { timing_ = on; }
  // A layer's extras, where its architecture has them (an undefined / empty tensor: none): the q/k/v
  // bias [W] (Qwen2) and the per-head query and key RMSNorm weights [hd] (Qwen3), all float32.
  void set_attention_extras(int64_t li, at::Tensor qkv_bias, at::Tensor q_norm, at::Tensor k_norm) {
    TORCH_CHECK(li >= 0 && li < static_cast<int64_t>(layers_.size()), "set_attention_extras: no layer ", li);
    auto take = [](const at::Tensor& t, int64_t n, const char* what) {
      if (!t.defined() || t.numel() == 0) return at::Tensor();
      TORCH_CHECK(t.numel() == n && t.scalar_type() == at::kFloat, what, ": [", n, "] float32");
      return t.contiguous();
    };
    Layer& L = layers_[li];
    L.qkv_bias = take(qkv_bias, (H_ + 2 * KVH_) * hd_, "qkv bias");
    L.q_norm = take(q_norm, hd_, "q_norm");
    L.k_norm = take(k_norm, hd_, "k_norm");
    TORCH_CHECK(L.q_norm.defined() == L.k_norm.defined(), "q_norm and k_norm come together");
  }

  void set_draft_mask_embedding(at::Tensor row) {
    TORCH_CHECK(row.numel() == D_ && row.scalar_type() == at::kFloat, "draft MASK embedding: [hidden] float32");
    draft_embed_ = row.contiguous();
  }
  std::vector<std::pair<std::string, double>> timings() const {
    return {{"norm_embed", tm_.norm}, {"qkv_proj", tm_.qkv}, {"rope_kv_write", tm_.rope_kv},
            {"attention", tm_.attention}, {"o_proj", tm_.o_proj}, {"mlp", tm_.mlp},
            {"head", tm_.head}, {"head_reduce", tm_.reduce}};
  }
  void reset_timings() { tm_ = Timers(); }

 private:
  // y[n] += b for each of n rows of width w: the projection's bias after its product (and after a draft
  // row's adapter delta), row by row, so a row's values do not depend on its batch.
  static void add_bias(float* y, int64_t n, int64_t w, const float* b) {
    for (int64_t r = 0; r < n; ++r) {
      float* row = y + r * w;
#pragma omp simd
      for (int64_t i = 0; i < w; ++i) row[i] += b[i];
    }
  }

  // Qwen3's q_norm / k_norm: each query and key head of the N rows of qkv (width W) RMS-normalised over
  // its hd values, in place, with the layer's RMSNorm arithmetic (rmsnorm_row).
  void head_norms(float* qkv, int64_t N, int64_t W, const float* qw, const float* kw) const {
    par_rows(N, 16, (H_ + KVH_) * hd_, [&](int64_t b, int64_t e) {
      for (int64_t n = b; n < e; ++n) {
        float* r = qkv + n * W;
        for (int64_t h = 0; h < H_ + KVH_; ++h) rmsnorm_row(r + h * hd_, h < H_ ? qw : kw, r + h * hd_, hd_, eps_);
      }
    });
  }

  // RoPE (rotate-half convention) on every query and key head in place, then the llama-4 query
  // scale where the config has one.
  void rope(float* qkv, const int64_t* pos, const float* qscale, int64_t N, int64_t W) const {
    const int h2 = hd_ / 2;
    const float* cs = cos_.data_ptr<float>();
    const float* sn = sin_.data_ptr<float>();
    const int64_t heads = H_ + KVH_;
    par_rows(N, 16, (H_ + KVH_) * hd_, [&](int64_t b, int64_t e) {
      for (int64_t n = b; n < e; ++n) {
        const float* c = cs + pos[n] * h2;
        const float* s = sn + pos[n] * h2;
        for (int64_t hh = 0; hh < heads; ++hh) {
          float* v = qkv + n * W + hh * hd_;
#pragma omp simd
          for (int i = 0; i < h2; ++i) {
            const float x1 = v[i], x2 = v[i + h2];
            v[i] = x1 * c[i] - x2 * s[i];
            v[i + h2] = x2 * c[i] + x1 * s[i];
          }
        }
        if (qscale) {
          float* q = qkv + n * W;
          const float f = qscale[n];
#pragma omp simd
          for (int64_t i = 0; i < H_ * hd_; ++i) q[i] *= f;
        }
      }
    });
  }

  // New tokens' keys of every (row, kv head) in the cache's panel layout, so that a score against
  // a new key is the same FMA chain as against a cached one (batch invariance, see gemm()).
  // The buffer is the calling thread's, kept between layers and forwards, and each item zeroes its own
  // lanes: a fresh tensor per layer (786 KB at batch 64) zeroed on one thread, when decode steps still
  // came here, was a third of a batch-64 step's attention at a 64-token past (a tenth at 512).
  const float* new_key_panels(const float* qkv, const int64_t* rs, int64_t B, int64_t T16, int64_t W) const {
    thread_local AlignedVec<float> buf;
    const size_t need = static_cast<size_t>(B * KVH_ * T16 * hd_);
    if (buf.size() < need) buf.resize(need);
    float* p = buf.data();
    par_items(B * KVH_, T16 * hd_ * 8, [&](int64_t ib, int64_t ie) {  // a prefill: 4 x 512 tokens, ~0.4 M stores
      for (int64_t it = ib; it < ie; ++it) {
        const int64_t b = it / KVH_;
        key_panels(qkv, rs[b], rs[b + 1] - rs[b], it % KVH_, W, T16, p + it * T16 * hd_);
      }
    });
    return p;
  }

  // The keys of one row's `len` new tokens (from row `base` of qkv) for KV head g, as panels of 16 into
  // dst (T16 / 16 panels of [hd][16]); lanes past the row's end are zeros, not stray memory.
  void key_panels(const float* qkv, int64_t base, int64_t len, int64_t g, int64_t W, int64_t T16, float* dst) const {
    std::memset(dst + (len / 16) * hd_ * 16, 0, sizeof(float) * static_cast<size_t>((T16 - len / 16 * 16) * hd_));
    for (int64_t t = 0; t < len; ++t) {
      const float* k = qkv + (base + t) * W + H_ * hd_ + g * hd_;
      float* d16 = dst + (t / 16) * hd_ * 16 + t % 16;
      for (int64_t d = 0; d < hd_; ++d) d16[d * 16] = k[d];
    }
  }

  // Work item = (row, kv head, chunk of the row's queries). Scores: the chunk's query heads of that
  // kv head against the slot's cached key panels, then against the new keys the intra mask lets
  // them see. A query's arithmetic depends only on its own keys: every score is one FMA chain over
  // the head dimension, the softmax sums 16 fixed lanes over a zero-padded range, and P·V is one
  // chain over key positions, so an AR step and a verify row at the same position agree bit for bit.
  void attention(const float* qkv, float* out, size_t li, const int64_t* rs, const int64_t* pl,
                 const int64_t* sl, const bool* im, const IntraRows& ir, int64_t B, int64_t T, int64_t W) const {
    if (attn_ != Attn::kFma) return attention_pairs(qkv, out, li, rs, pl, sl, im, ir, B, T, W);
    if (kv_bf16_) attention_t<uint16_t>(qkv, out, li, rs, pl, sl, im, ir, B, T, W);
    else attention_t<float>(qkv, out, li, rs, pl, sl, im, ir, B, T, W);
  }

  // Attention's work items, (row, kv head, first token of a chunk of kChunk) triples, and in per_item the
  // multiply-adds (scores + P·V) of the average item, for par_items's threshold.
  std::vector<int64_t> attention_items(const int64_t* rs, const int64_t* pl, int64_t B, int64_t kChunk,
                                       int64_t& per_item) const {
    std::vector<int64_t> items;
    int64_t work = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t len = rs[b + 1] - rs[b];
      for (int64_t g = 0; g < KVH_; ++g)
        for (int64_t t0 = 0; t0 < len; t0 += kChunk) items.insert(items.end(), {b, g, t0});
      work += len * H_ * (pl[b] + len) * 2 * hd_;
    }
    per_item = work / std::max<int64_t>(static_cast<int64_t>(items.size() / 3), 1);
    return items;
  }

  // The new tokens' keys and values rounded to bf16 in place (a bf16 KV cache): this step's queries
  // then see exactly the values later steps read back from the cache (batch invariance).
  void round_kv(float* qkv, int64_t N, int64_t W) const {
    const int64_t Q = H_ * hd_;
    for (int64_t n = 0; n < N; ++n) {
      float* r = qkv + n * W;
#pragma omp simd
      for (int64_t i = Q; i < W; ++i) r[i] = to_f32(static_cast<uint16_t>(bf16_bits(r[i])));
    }
  }

  template <typename CT>
  void attention_t(const float* qkv, float* out, size_t li, const int64_t* rs, const int64_t* pl,
                   const int64_t* sl, const bool* im, const IntraRows& ir, int64_t B, int64_t T, int64_t W) const {
    // Queries per item: a batch-1 block of 8 splits into 2 x kv-heads items (balance); a forward of 64
    // tokens or more (a prompt) takes 16, so each item reads its keys once for 16 tokens' queries
    // (bench_forward.py --prefill: 1.00-1.06x a prefill forward). A chunk only widens the masked
    // keys a query carries (scores -inf, weights exactly 0), so no value changes.
    const int64_t kChunk = T >= 64 ? 16 : 4;
    // AVX2's P·V for rows of up to 8 tokens: whole value rows, in memory order (pv_stream; the hardware
    // prefetchers follow; the 16-column panels' passes read every 4th line and waited on DRAM: 8x1 1.09x,
    // 1x8 1.06x). Longer rows share a slot's values among several items, from cache, where panel tiles
    // load less (1x128 0.975x with rows; 1x16 the same either way).
    const int64_t kStreamPv = 8;
    const int64_t group = H_ / KVH_, Q = H_ * hd_, Voff = Q + KVH_ * hd_;
    const int64_t T16 = (T + 15) / 16 * 16;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd_));
    const CT* kc = static_cast<const CT*>(k_cache_[li].data_ptr());
    const CT* vc = static_cast<const CT*>(v_cache_[li].data_ptr());
    // Rows of up to 16 new tokens (decode steps, draft and verify blocks) put their keys in a panel
    // inside each of their items; panels are built up front, on the pool, only for forwards with longer
    // rows (prompts). Built up front, a batch-64 decode step's 192 one-key panels took a fifth of its
    // attention at a 64-token past (1/17 at 512), handed out one by one on the pool, and were mostly
    // read on the other core. Either way a panel holds the same values.
    bool long_rows = false;
    for (int64_t b = 0; b < B; ++b) long_rows = long_rows || rs[b + 1] - rs[b] > 16;
    const float* nk = long_rows ? new_key_panels(qkv, rs, B, T16, W) : nullptr;
    int64_t per_item = 0;
    const std::vector<int64_t> items = attention_items(rs, pl, B, kChunk, per_item);
    const int64_t n_items = static_cast<int64_t>(items.size() / 3);
    par_items(n_items, per_item, [&](int64_t ib, int64_t ie) {
      thread_local std::vector<float> sc, qb, acc;  // per thread, not per item (the pool hands out one at a time)
      thread_local AlignedVec<float> own;           // a short row's panel of new keys
      for (int64_t it = ib; it < ie; ++it) {
        const int64_t b = items[3 * it], g = items[3 * it + 1], t0 = items[3 * it + 2];
        const int64_t base = rs[b], len = rs[b + 1] - base, P = pl[b];
        const int64_t t1 = std::min(len, t0 + kChunk), nt = t1 - t0, nq = nt * group;
        int64_t jmax = 0;  // new-token keys any query of the chunk may see: [0, jmax)
        for (int64_t t = t0; t < t1; ++t) jmax = std::max<int64_t>(jmax, ir.end[b * T + t]);
        const int64_t S = P + jmax, S16 = (S + 15) / 16 * 16;
        sc.resize(static_cast<size_t>(nq * S16));  // [0, S) scored below, [S, S16) set to -inf
        qb.resize(static_cast<size_t>(nq * hd_));
        acc.resize(static_cast<size_t>(nq * hd_));  // pv_rows stores every element
        for (int64_t qi = 0; qi < nq; ++qi)  // query qi = (token t0 + qi / group, head g*group + qi % group)
          std::memcpy(qb.data() + qi * hd_, qkv + (base + t0 + qi / group) * W + (g * group + qi % group) * hd_,
                      sizeof(float) * hd_);
        const CT* kslot = kc + (sl[b] * KVH_ + g) * cap16_ * hd_;
        const CT* vslot = vc + (sl[b] * KVH_ + g) * cap_ * hd_;
        const float* kn = nk != nullptr ? nk + (b * KVH_ + g) * T16 * hd_ : nullptr;
        if (kn == nullptr) {  // no row past 16 tokens: T16 is 16, one panel
          own.resize(static_cast<size_t>(T16 * hd_));
          key_panels(qkv, base, len, g, W, T16, own.data());
          kn = own.data();
        }
        prefetch_l2(vslot, std::min<int64_t>(P, kValueAheadRows) * hd_ * static_cast<int64_t>(sizeof(CT)));
        score_panels(qb.data(), nq, kslot, P, sc.data(), S16);
        score_panels(qb.data(), nq, kn, jmax, sc.data() + P, S16);
        softmax_rows(sc.data(), nq, S16, P, jmax, b, T, t0, group, im, ir, scale);
        const float* vnew = qkv + base * W + Voff + g * hd_;
        auto pv_tile = [&](auto R, int64_t m) {
          pv_rows<R()>(sc.data() + m * S16, S16, vslot, P, vnew, W, jmax, acc.data() + m * hd_);
        };
        // AVX-512's P·V holds rows x hd / 16 accumulators: past a head dimension of 64, 3 rows (24 of
        // the 32 registers) so that a tile does not spill.
        if (!kPvAllPanels && len <= kStreamPv && hd_ % 64 == 0) pv_stream(sc.data(), S16, nq, vslot, P, vnew, W, jmax, acc.data());
        else if (kPvAllPanels && hd_ > 64) even_row_tiles<3>(nq, pv_tile);
        else even_row_tiles<kPvRows>(nq, pv_tile);
        for (int64_t qi = 0; qi < nq; ++qi)
          std::memcpy(out + (base + t0 + qi / group) * Q + (g * group + qi % group) * hd_, acc.data() + qi * hd_,
                      sizeof(float) * hd_);
      }
    });
  }

  // ---- Attention on bf16 pairs: AMX tiles, or vdpbf16ps where the CPU has no AMX --------------------
  // With bf16 compute and a bf16 KV cache (head dimension 64), attention's two products run on bf16 pairs
  // as the projections do: queries and probabilities rounded to bf16 before their products, sums in
  // float32, the cache in the tiles' layouts below. Two kernels share everything but the products:
  // - AMX (attention on tiles, Intel Xeon with AMX): two TDPBF16PS per score, P·V by 32-key chunks;
  // - dot (AVX512_BF16's vdpbf16ps, e.g. AMD Zen 4): a score is one dot2 chain over the 32 dimension pairs
  //   in order, an output element one dot2 chain over the key pairs in order, each from zero. A block's
  //   rows then cost half the multiplies of the FMA attention, with no widening of the cached bf16 keys
  //   and values: on a Zen 4 EPYC a 1x4-1x16 forward's attention ran 1.15-1.30x faster, prompts 1.04-1.06x,
  //   and 1-token rows (AR steps, batches), which wait on their KV bytes, the same (docs/engine.md,
  //   "Attention on vdpbf16ps").
  // Each is one arithmetic for every shape, so verify rows still equal AR steps bit for bit: a key a query
  // does not see carries probability 0 (its value finite: cache, new keys or zeros), so how far past its
  // own keys an item's longest row makes it run adds only zeros. RECGUIDE_NATIVE_BF16_ATTENTION=0 keeps
  // the FMA attention (attention_t) for A/B; =1 takes the dot kernel where vdpbf16ps is emulated (tests).
  // RECGUIDE_NATIVE_AMX_ATTENTION=0 keeps the FMA attention beside AMX GEMMs (A/B on the AMX Xeon).
  // What the AMX kernel buys is small: 1.02-1.05x a 1x4-1x16 forward, 1.02x at 64x1 (bench_forward.py
  // --ab-dtype bfloat16, paired, three runs on the AMX Xeon; docs/bench/forward-amx-attention/). There
  // attention waits on its KV bytes, its softmax and its per-item buffers more than on multiplies; a
  // first version with scalar buffers ran 0.94-1.01x. So the buffers are built 16 lanes at a time
  // (to_bf16_row, new_tiles) and a prefix row's probabilities take three passes (softmax_prefix).
  // The cache keeps the tiles' layouts: keys as panels of 16 keys x 32 dimension pairs (key_at), and
  // values as rows of key pairs (value_at): the keys' bytes as before, the values' capacity rounded up to
  // whole panels of 16 keys (at most 15 keys a slot more).

  // A key's element (key j, dim d) in its slot's panels: [j / 16][d / 2][j % 16][d % 2].
  int64_t key_at(int64_t j, int64_t d) const { return (j / 16) * hd_ * 16 + ((d / 2) * 16 + j % 16) * 2 + d % 2; }
  // A value's element: [j / 2][d][j % 2], so 16 key pairs x 16 dims are a B tile of 16 rows.
  int64_t value_at(int64_t j, int64_t d) const { return ((j / 2) * hd_ + d) * 2 + j % 2; }

  // x[0, n) as bf16 bits, bf16_bits's rounding (to nearest even; NaN a quiet NaN), 16 at a time.
  static void to_bf16_row(const float* x, int64_t n, uint16_t* out) {
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512i half = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1), abs = _mm512_set1_epi32(0x7FFFFFFF);
    const __m512i inf = _mm512_set1_epi32(0x7F800000), qnan = _mm512_set1_epi32(0x7FC0);
    for (; i + 16 <= n; i += 16) {
      const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(x + i));
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
      __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, half), lsb), 16);
      r = _mm512_mask_mov_epi32(r, _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), inf), qnan);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtepi32_epi16(r));
    }
#endif
    for (; i < n; ++i) out[i] = static_cast<uint16_t>(bf16_bits(x[i]));
  }

  // The panels' key tiles of one kv head for a row's keys [0, n) (new keys, from qkv rows base..;
  // lanes past n zero) and its values [v0, vend) (v0 a multiple of 32, vend of 32) as value rows:
  // cached ones (< P) from the slot, new ones from qkv, zeros past P + n.
  void new_tiles(const float* qkv, int64_t base, int64_t n, int64_t P, int64_t g, int64_t W,
                 const uint16_t* vslot, int64_t v0, int64_t vend, uint16_t* kt, uint16_t* vt) const {
    const int64_t Koff = H_ * hd_ + g * hd_, Voff = H_ * hd_ + KVH_ * hd_ + g * hd_;
    alignas(64) uint16_t row[2][64];
    // Keys: a key's 32 dimension pairs are one word each, 16 words apart in its panel (key_at).
    std::memset(kt, 0, sizeof(uint16_t) * static_cast<size_t>((n + 15) / 16 * 16 * hd_));
    uint32_t* kw = reinterpret_cast<uint32_t*>(kt);
#if defined(__AVX512F__)
    const __m512i kidx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(16));
#endif
    for (int64_t j = 0; j < n; ++j) {
      to_bf16_row(qkv + (base + j) * W + Koff, 64, row[0]);  // exact: rounded to bf16 already
      uint32_t* pw = kw + (j / 16) * 512 + j % 16;
#if defined(__AVX512F__)
      _mm512_i32scatter_epi32(pw, kidx, _mm512_loadu_si512(row[0]), 4);
      _mm512_i32scatter_epi32(pw + 256, kidx, _mm512_loadu_si512(row[0] + 32), 4);
#else
      for (int d2 = 0; d2 < 32; ++d2)
        pw[d2 * 16] = static_cast<uint32_t>(row[0][2 * d2]) | (static_cast<uint32_t>(row[0][2 * d2 + 1]) << 16);
#endif
    }
    // Values: whole cached pairs copied, then every pair holding a new key built from its two rows.
    const int64_t pairs_cached = std::max<int64_t>(0, std::min(P, vend) - v0) / 2;
    std::memcpy(vt, vslot + v0 * hd_, sizeof(uint16_t) * static_cast<size_t>(pairs_cached * 2 * hd_));
    std::memset(vt + pairs_cached * 2 * hd_, 0, sizeof(uint16_t) * static_cast<size_t>((vend - v0 - pairs_cached * 2) * hd_));
    for (int64_t a = P / 2 * 2; a < std::min(P + n, vend); a += 2) {
      for (int h = 0; h < 2; ++h) {
        const int64_t key = a + h;
        if (key < P) {  // the cached half of the pair that P's first new key completes
          for (int64_t d = 0; d < 64; ++d) row[h][d] = vslot[value_at(key, d)];
        } else if (key < P + n) {
          to_bf16_row(qkv + (base + key - P) * W + Voff, 64, row[h]);
        } else {
          std::memset(row[h], 0, sizeof row[h]);
        }
      }
      uint32_t* dst = reinterpret_cast<uint32_t*>(vt + (a - v0) * hd_);
#if defined(__AVX512F__)
      for (int c = 0; c < 64; c += 16) {
        const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[0] + c)));
        const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[1] + c)));
        _mm512_storeu_si512(dst + c, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
      }
#else
      for (int c = 0; c < 64; ++c) dst[c] = static_cast<uint32_t>(row[0][c]) | (static_cast<uint32_t>(row[1][c]) << 16);
#endif
    }
  }

  // The dot kernel's tiles: query rows x 16-key panels for scores, query rows x the head's 4 panels of 16
  // dimensions for P·V (AVX-512: 24 accumulators; an F16 of two ymm registers halves both).
#if defined(__AVX512F__)
  static constexpr int kDotRows = 6, kDotPanels = 4;
#else
  static constexpr int kDotRows = 2, kDotPanels = 2;
#endif

  // tile[r][p * 16 + l] = query row r of q (32 words of dimension pairs each) . key l of panel p of w.
  template <int R, int NP>
  static void dot_score_tile(const uint32_t* q, const uint32_t* w, float* tile) {
    F16 acc[R][NP];
    RG_UNROLL for (int r = 0; r < R; ++r) RG_UNROLL for (int p = 0; p < NP; ++p) acc[r][p] = F16::zero();
    for (int d = 0; d < 32; ++d) {
      P16 k[NP];
      RG_UNROLL for (int p = 0; p < NP; ++p) k[p] = P16::load(w + p * 512 + d * 16);
      RG_UNROLL for (int r = 0; r < R; ++r) {
        const X2 x = X2::bcast(q[r * 32 + d]);
        RG_UNROLL for (int p = 0; p < NP; ++p) dot2(acc[r][p], k[p], x);
      }
    }
    RG_UNROLL for (int r = 0; r < R; ++r) RG_UNROLL for (int p = 0; p < NP; ++p) acc[r][p].store(tile + r * kDotPanels * 16 + p * 16);
  }

  // s[m][j] (ld) = query row m of qa (bf16 [nq][64]) . key j, keys [0, n) of the panels: a group of
  // kDotPanels panels at a time for every row tile, so each panel is read from memory once.
  static void dot_scores(const uint16_t* qa, int64_t nq, const uint16_t* panels, int64_t n, float* s, int64_t ld) {
    const uint32_t* q = reinterpret_cast<const uint32_t*>(qa);
    const uint32_t* w = reinterpret_cast<const uint32_t*>(panels);
    const int64_t np = (n + 15) / 16;
    alignas(64) float tile[kDotRows * kDotPanels * 16];
    for (int64_t p0 = 0; p0 < np; p0 += kDotPanels) {
      const int64_t k = std::min<int64_t>(kDotPanels, np - p0), cols = std::min<int64_t>(k * 16, n - p0 * 16);
      const uint32_t* wp = w + p0 * 512;
      if (p0 + kDotPanels < np) prefetch_l2(wp + kDotPanels * 512, std::min<int64_t>(kDotPanels, np - p0 - kDotPanels) * 2048);
      even_row_tiles<kDotRows>(nq, [&](auto R, int64_t m0) {
        with_rows<kDotPanels>(k, [&](auto NP) { dot_score_tile<R(), NP()>(q + m0 * 32, wp, tile); });
        for (int64_t m = 0; m < R(); ++m)
          std::memcpy(s + (m0 + m) * ld + p0 * 16, tile + m * kDotPanels * 16, sizeof(float) * static_cast<size_t>(cols));
      });
    }
  }

  // out[r][d] = Σ over key pairs c in [0, pairs) of probability pair c of row r (p, ldp words a row) .
  // value pair c: pairs below c0 from the slot's values, the rest from vt (pair c0 first). `ahead`: asks
  // the slot's values 64 keys ahead into L2 (the first row tile; the others find them in cache).
  template <int R>
  static void dot_pv_tile(const uint32_t* p, int64_t ldp, const uint32_t* vslot, int64_t c0, const uint32_t* vt,
                          int64_t pairs, bool ahead, float* out) {
    F16 acc[R][4];
    RG_UNROLL for (int r = 0; r < R; ++r) RG_UNROLL for (int q = 0; q < 4; ++q) acc[r][q] = F16::zero();
    auto step = [&](const uint32_t* v, int64_t c) {
      P16 vv[4];
      RG_UNROLL for (int q = 0; q < 4; ++q) vv[q] = P16::load(v + q * 16);
      RG_UNROLL for (int r = 0; r < R; ++r) {
        const X2 x = X2::bcast(p[r * ldp + c]);
        RG_UNROLL for (int q = 0; q < 4; ++q) dot2(acc[r][q], vv[q], x);
      }
    };
    const int64_t cached = std::min(c0, pairs);
    for (int64_t c = 0; c < cached; ++c) {
      if (ahead && c % 16 == 0 && c + 48 <= c0) prefetch_l2(vslot + (c + 32) * 64, 16 * 64 * 4);
      step(vslot + c * 64, c);
    }
    for (int64_t c = cached; c < pairs; ++c) step(vt + (c - c0) * 64, c);
    RG_UNROLL for (int r = 0; r < R; ++r) RG_UNROLL for (int q = 0; q < 4; ++q) acc[r][q].store(out + r * 64 + q * 16);
  }

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  // s[m][j] (ld) = (query row m of the 16-row block qa, bf16 [16][64]) . key j, keys [0, n) of the
  // panels, rows [0, rows): scores into `tile` a group of 4 panels at a time, then the valid columns.
  static void amx_scores(const uint16_t* qa, const uint16_t* panels, int64_t n, float* s, int64_t ld, int64_t rows,
                         float* tile) {
    _tile_loadd(4, qa, 128);       // dims 0-31 of each query row
    _tile_loadd(5, qa + 32, 128);  // dims 32-63
    const int64_t np = (n + 15) / 16;
    for (int64_t p0 = 0; p0 < np; p0 += 4) {
      const int64_t k = std::min<int64_t>(4, np - p0);
      const uint16_t* w = panels + p0 * 1024;  // a panel: 32 dim pairs x 16 keys x 2, two B tiles
      if (p0 + 4 < np) prefetch_l2(w + 4 * 1024, std::min<int64_t>(4, np - p0 - 4) * 2048);
#define RG_AMX_SCORE(C)                                         \
  do {                                                          \
    _tile_zero(C);                                              \
    _tile_loadd(6, w + (C) * 1024, 64);                         \
    _tile_dpbf16ps(C, 4, 6);                                    \
    _tile_loadd(7, w + (C) * 1024 + 512, 64);                   \
    _tile_dpbf16ps(C, 5, 7);                                    \
    _tile_stored(C, tile + (C) * 16, 256);                      \
  } while (0)
      RG_AMX_SCORE(0);
      if (k > 1) RG_AMX_SCORE(1);
      if (k > 2) RG_AMX_SCORE(2);
      if (k > 3) RG_AMX_SCORE(3);
#undef RG_AMX_SCORE
      const int64_t cols = std::min<int64_t>(k * 16, n - p0 * 16);
      for (int64_t m = 0; m < rows; ++m) std::memcpy(s + m * ld + p0 * 16, tile + m * 64, sizeof(float) * cols);
    }
  }

  // out rows [m0, m0 + 16) of an item's P·V on AMX: keys in chunks of 32 by absolute position, one A tile
  // of probabilities (pa, S32 a row) and four B tiles of values a chunk; rows past nq are zeros.
  void amx_pv(const uint16_t* pa, int64_t S32, int64_t m0, const uint16_t* vslot, int64_t v0, const uint16_t* vt,
              float* tile) const {
    const int64_t hd = hd_;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t c = 0; c < S32 / 32; ++c) {  // 32 keys: an A tile of probabilities, 4 B tiles of values
      const uint16_t* vb = c * 32 < v0 ? vslot + c * 32 * hd : vt + (c * 32 - v0) * hd;
      if (c * 32 + 64 <= v0) prefetch_l2(vslot + (c + 2) * 32 * hd, 32 * hd * 2);
      _tile_loadd(4, pa + m0 * S32 + c * 32, S32 * 2);
      _tile_loadd(6, vb, hd * 4);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(7, vb + 32, hd * 4);
      _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(6, vb + 64, hd * 4);
      _tile_dpbf16ps(2, 4, 6);
      _tile_loadd(7, vb + 96, hd * 4);
      _tile_dpbf16ps(3, 4, 7);
    }
    _tile_stored(0, tile, 256);
    _tile_stored(1, tile + 16, 256);
    _tile_stored(2, tile + 32, 256);
    _tile_stored(3, tile + 48, 256);
  }
#endif

  void attention_pairs(const float* qkv, float* out, size_t li, const int64_t* rs, const int64_t* pl,
                       const int64_t* sl, const bool* im, const IntraRows& ir, int64_t B, int64_t T, int64_t W) const {
    const bool amx = attn_ == Attn::kAmx;
    const int64_t kChunk = T >= 64 ? 16 : 4;  // queries per item, as attention_t
    const int64_t group = H_ / KVH_, Q = H_ * hd_, hd = hd_;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const uint16_t* kc = static_cast<const uint16_t*>(k_cache_[li].data_ptr());
    const uint16_t* vc = static_cast<const uint16_t*>(v_cache_[li].data_ptr());
    // Rows of more than 16 tokens (prompts) build their new keys' and values' tiles once per (row, kv
    // head) on the pool, not once per item: kt_all [B][KVH][T16 keys], vt_all [B][KVH][TV keys] (T + 32
    // rounded up to 32: a row's values from the 32-key chunk its past ends in to the end of its last chunk).
    bool long_rows = false;
    for (int64_t b = 0; b < B; ++b) long_rows = long_rows || rs[b + 1] - rs[b] > 16;
    const int64_t T16 = (T + 15) / 16 * 16, TV = (T + 63) / 32 * 32;
    thread_local AlignedVec<uint16_t> kt_all, vt_all;
    if (long_rows) {
      kt_all.resize(static_cast<size_t>(B * KVH_ * T16 * hd));
      vt_all.resize(static_cast<size_t>(B * KVH_ * TV * hd));
      uint16_t* ktp = kt_all.data();  // this thread's buffers (in a worker, the names are its own)
      uint16_t* vtp = vt_all.data();
      par_items(B * KVH_, T16 * hd * 4, [&](int64_t ib, int64_t ie) {
        for (int64_t it = ib; it < ie; ++it) {
          const int64_t b = it / KVH_, g = it % KVH_, len = rs[b + 1] - rs[b], P = pl[b];
          const int64_t v0 = P / 32 * 32, vend = (P + len + 31) / 32 * 32;
          new_tiles(qkv, rs[b], len, P, g, W, vc + (sl[b] * KVH_ + g) * cap16_ * hd, v0, vend,
                    ktp + it * T16 * hd, vtp + it * TV * hd);
        }
      });
    }
    int64_t per_item = 0;
    const std::vector<int64_t> items = attention_items(rs, pl, B, kChunk, per_item);
    const int64_t n_items = static_cast<int64_t>(items.size() / 3);
    const uint16_t* kt_long = kt_all.data();
    const uint16_t* vt_long = vt_all.data();
    par_items(n_items, per_item, [&](int64_t ib, int64_t ie) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
      static const AmxConfig cfg;
      if (amx) _tile_loadconfig(&cfg);  // every time: other code on this thread (oneDNN) may load its own
#endif
      thread_local std::vector<float> sc, acc;
      thread_local AlignedVec<uint16_t> qa, pa, kt_own, vt_own;
      [[maybe_unused]] alignas(64) float tile[16 * 64];  // AMX's
      for (int64_t it = ib; it < ie; ++it) {
        const int64_t b = items[3 * it], g = items[3 * it + 1], t0 = items[3 * it + 2];
        const int64_t base = rs[b], len = rs[b + 1] - base, P = pl[b];
        const int64_t t1 = std::min(len, t0 + kChunk), nq = (t1 - t0) * group, nq16 = (nq + 15) / 16 * 16;
        int64_t jmax = 0;
        for (int64_t t = t0; t < t1; ++t) jmax = std::max<int64_t>(jmax, ir.end[b * T + t]);
        const int64_t S = P + jmax, S16 = (S + 15) / 16 * 16, S32 = (S + 31) / 32 * 32, v0 = P / 32 * 32;
        const uint16_t* kslot = kc + (sl[b] * KVH_ + g) * cap16_ * hd;
        const uint16_t* vslot = vc + (sl[b] * KVH_ + g) * cap16_ * hd;
        prefetch_l2(vslot, std::min<int64_t>(P, kValueAheadRows) * hd * 2);
        const uint16_t *kt, *vt;  // the row's new keys' panels; values [v0, ...) as rows of key pairs
        if (long_rows) {
          kt = kt_long + (b * KVH_ + g) * T16 * hd;
          vt = vt_long + (b * KVH_ + g) * TV * hd;
        } else {
          kt_own.resize(static_cast<size_t>(16 * hd));
          vt_own.resize(static_cast<size_t>((S32 - v0) * hd));
          new_tiles(qkv, base, jmax, P, g, W, vslot, v0, S32, kt_own.data(), vt_own.data());
          kt = kt_own.data();
          vt = vt_own.data();
        }
        // The chunk's queries as bf16 rows, zero rows up to a whole tile.
        qa.resize(static_cast<size_t>(nq16 * hd));
        for (int64_t qi = 0; qi < nq; ++qi)
          to_bf16_row(qkv + (base + t0 + qi / group) * W + (g * group + qi % group) * hd, hd, qa.data() + qi * hd);
        std::memset(qa.data() + nq * hd, 0, sizeof(uint16_t) * static_cast<size_t>((nq16 - nq) * hd));
        sc.resize(static_cast<size_t>(nq * S16));
        if (amx) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
          for (int64_t m0 = 0; m0 < nq; m0 += 16) {
            const int64_t rows = std::min<int64_t>(16, nq - m0);
            amx_scores(qa.data() + m0 * hd, kslot, P, sc.data() + m0 * S16, S16, rows, tile);
            amx_scores(qa.data() + m0 * hd, kt, jmax, sc.data() + m0 * S16 + P, S16, rows, tile);
          }
#endif
        } else {
          dot_scores(qa.data(), nq, kslot, P, sc.data(), S16);
          dot_scores(qa.data(), nq, kt, jmax, sc.data() + P, S16);
        }
        // Probabilities as bf16 rows over keys [0, S32), zeros past what a row sees and in the padding rows.
        pa.resize(static_cast<size_t>(nq16 * S32));
        for (int64_t qi = 0; qi < nq; ++qi) {
          float* srow = sc.data() + qi * S16;
          const int64_t bt = b * T + t0 + qi / group;
          int64_t vis = S;  // keys [0, vis) may carry weight
#if defined(__AVX2__)
          if (ir.prefix[bt]) {
            vis = P + ir.end[bt];
            softmax_prefix(srow, vis, scale, vis);
          } else
#endif
          {
            softmax_rows(srow, 1, S16, P, jmax, b, T, t0 + qi / group, group, im, ir, scale);
          }
          to_bf16_row(srow, vis, pa.data() + qi * S32);
          std::memset(pa.data() + qi * S32 + vis, 0, sizeof(uint16_t) * static_cast<size_t>(S32 - vis));
        }
        std::memset(pa.data() + nq * S32, 0, sizeof(uint16_t) * static_cast<size_t>((nq16 - nq) * S32));
        auto put = [&](int64_t m, const float* o) {
          std::memcpy(out + (base + t0 + m / group) * Q + (g * group + m % group) * hd, o, sizeof(float) * hd);
        };
        if (amx) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
          for (int64_t m0 = 0; m0 < nq; m0 += 16) {
            amx_pv(pa.data(), S32, m0, vslot, v0, vt, tile);
            for (int64_t m = m0; m < std::min<int64_t>(nq, m0 + 16); ++m) put(m, tile + (m - m0) * 64);
          }
#endif
        } else {
          // Pairs up to the item's last key: those past a row's own keys carry probability 0.
          const uint32_t* pw = reinterpret_cast<const uint32_t*>(pa.data());
          acc.resize(static_cast<size_t>(kDotRows * hd));
          even_row_tiles<kDotRows>(nq, [&](auto R, int64_t m0) {
            dot_pv_tile<R()>(pw + m0 * S32 / 2, S32 / 2, reinterpret_cast<const uint32_t*>(vslot), v0 / 2,
                             reinterpret_cast<const uint32_t*>(vt), (S + 1) / 2, m0 == 0, acc.data());
            for (int64_t m = 0; m < R(); ++m) put(m0 + m, acc.data() + m * hd);
          });
        }
      }
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
      if (amx) _tile_release();
#endif
    });
  }

#if defined(__AVX2__)
  // A row that sees keys [0, vis) (a prefix: prompt, AR and verify rows) made probabilities in place in
  // three passes (the maximum; the exponentials and their sum; the normalisation) where softmax_rows
  // takes five, with its arithmetic op for op: the maximum of the scaled scores is the scaled maximum
  // (rounding is monotone, scale > 0), each exp is vexp_lanes of (s * scale - m), the sum runs in 16
  // lanes by key then the same tree, and the keys past vis (-inf there) would add zeros. Lanes
  // [vis, zero_end) are set to zero, the probability softmax_rows gives them.
  static void softmax_prefix(float* s, int64_t vis, float scale, int64_t zero_end) {
    using V = VecExp;
    constexpr int kL = V::kLanes, kV = 16 / kL;  // vectors per 16 lanes
    const float m = row_max(s, vis) * scale;
    const auto sv = V::set1(scale), mv = V::set1(m);
    typename V::T acc[kV];
    for (auto& a : acc) a = V::set1(0.f);
    int64_t j = 0;
    for (; j + 16 <= vis; j += 16)
      for (int v = 0; v < kV; ++v) {
        const auto e = vexp_lanes<V>(V::sub(V::mul(V::load(s + j + v * kL), sv), mv));
        V::store(s + j + v * kL, e);
        acc[v] = V::add(acc[v], e);
      }
    alignas(64) float t[16] = {0.f};
    if (j < vis) {  // the last block's lanes past vis: zeros
      std::memcpy(t, s + j, sizeof(float) * static_cast<size_t>(vis - j));
      for (int v = 0; v < kV; ++v) V::store(t + v * kL, vexp_lanes<V>(V::sub(V::mul(V::load(t + v * kL), sv), mv)));
      for (int64_t l = vis - j; l < 16; ++l) t[l] = 0.f;
      std::memcpy(s + j, t, sizeof(float) * static_cast<size_t>(vis - j));
      for (int v = 0; v < kV; ++v) acc[v] = V::add(acc[v], V::load(t + v * kL));
    }
    for (int v = 0; v < kV; ++v) V::store(t + v * kL, acc[v]);
    const float inv = 1.0f / sum16_tree(t);
#pragma omp simd
    for (int64_t i = 0; i < vis; ++i) s[i] *= inv;
    for (int64_t i = vis; i < zero_end; ++i) s[i] = 0.f;
  }
#endif

  // Query rows [0, nq) of an item's scores (row qi at sc + qi * S16: keys [0, P) cached, [P, P + jmax)
  // the row's new ones; qi = (token t0 + qi / group, head qi % group of the kv head)) scaled, masked
  // and made probabilities in place; lanes [P + jmax, S16) end as zeros.
  void softmax_rows(float* sc, int64_t nq, int64_t S16, int64_t P, int64_t jmax, int64_t b, int64_t T, int64_t t0,
                    int64_t group, const bool* im, const IntraRows& ir, float scale) const {
    const float ninf = -std::numeric_limits<float>::infinity();
    const int64_t S = P + jmax;
    for (int64_t qi = 0; qi < nq; ++qi) {
      float* s = sc + qi * S16;
      const int64_t bt = b * T + t0 + qi / group;
      const bool* row = im + bt * T;
      if (ir.prefix[bt]) {  // keys [0, end) visible, the rest of [0, jmax) masked: no per-key test
        const int64_t e = ir.end[bt];
#if defined(__AVX2__)
        if (P + e > 0) {
          softmax_prefix(s, P + e, scale, S16);
          continue;
        }
#endif
#pragma omp simd
        for (int64_t j = 0; j < P + e; ++j) s[j] *= scale;
        for (int64_t j = P + e; j < P + jmax; ++j) s[j] = ninf;
      } else {
#pragma omp simd
        for (int64_t j = 0; j < P; ++j) s[j] *= scale;
        for (int64_t j = 0; j < jmax; ++j) s[P + j] = row[j] ? s[P + j] * scale : ninf;
      }
      // Keys [S, S16) as -inf, so the maximum and the exponentials run in whole vectors, with no
      // scalar tail and no zero fill of sc: vexp(-inf) is exactly the 0 these lanes held before,
      // and the vector exp is the scalar one's bits (prefills timed 1.01-1.04x, about noise).
      for (int64_t j = S; j < S16; ++j) s[j] = ninf;
      const float m = row_max(s, S16);
      exp_minus(s, S16, m);
      float lanes[16] = {0.f};
      for (int64_t j = 0; j < S16; j += 16)
#pragma omp simd
        for (int l = 0; l < 16; ++l) lanes[l] += s[j + l];
      const float inv = 1.0f / sum16_tree(lanes);
#pragma omp simd
      for (int64_t j = 0; j < S; ++j) s[j] *= inv;
    }
  }

  // out[MR][hd] = Σ_j p[i][j] · v_j over the P cached values, then the n new ones (row stride ldn):
  // one FMA chain per output element across both, so the split between cached and new keys does
  // not change the result, nor does the tiling (pv_stream: AVX2's short rows, the same sums).
  template <int MR, typename VT>
  void pv_rows(const float* p, int64_t ldp, const VT* vpast, int64_t P, const float* vnew, int64_t ldn,
               int64_t n, float* out) const {
#if defined(__AVX512F__)
    switch (hd_) {  // every panel of the head dimension in one pass
      case 16: pv_micro<MR, 1>(p, ldp, vpast, P, vnew, ldn, n, out); return;
      case 32: pv_micro<MR, 2>(p, ldp, vpast, P, vnew, ldn, n, out); return;
      case 64: pv_micro<MR, 4>(p, ldp, vpast, P, vnew, ldn, n, out); return;
      case 128: pv_micro<MR, 8>(p, ldp, vpast, P, vnew, ldn, n, out); return;
      default: break;
    }
#else
    if (hd_ % 16 == 0) {  // one pass per 16-column panel (AVX2's 16 registers: see kPvRows)
      for (int64_t c = 0; c < hd_; c += 16) pv_micro<MR, 1>(p, ldp, vpast + c, P, vnew + c, ldn, n, out + c);
      return;
    }
#endif
    const int64_t hd = hd_;
    for (int i = 0; i < MR; ++i) {
      float* o = out + i * hd;
      for (int64_t d = 0; d < hd; ++d) o[d] = 0.f;
      for (int64_t j = 0; j < P + n; ++j) {
        const float pj = p[i * ldp + j];
        for (int64_t d = 0; d < hd; ++d)
          o[d] = std::fma(pj, j < P ? to_f32(vpast[j * hd + d]) : vnew[(j - P) * ldn + d], o[d]);
      }
    }
  }

  // AVX2's P·V for short rows, all nq query rows of an item in one pass over the values: a block of
  // kPvBlock value rows at a time, each query row's 64-column accumulators over the block (8 registers,
  // kept in `out` between blocks), so the block is read from DRAM once, by row 0, and from L1 by the
  // others. A pass per query row over the whole slot (the stream mode this replaced) read the values
  // from DRAM once and from L2 again for every other row, or from L3 where a slot's values outgrow L2
  // (with the three-pass softmax_prefix, attention over 512-token pasts ran 1.06-1.19x at 1x1-64x1 on the
  // Zen 3 EPYC: bench_forward.py --phases --before, docs/bench/forward-avx2-pv-stream).
  // Each output element is still one FMA chain over j in order: storing and reloading it between blocks
  // is exact, so the results are pv_rows's, bit for bit.
  template <typename VT>
  void pv_stream(const float* p, int64_t ldp, int64_t nq, const VT* vpast, int64_t P, const float* vnew,
                 int64_t ldn, int64_t n, float* out) const {
    const int64_t total = P + n;
    if (total == 0) std::fill(out, out + nq * hd_, 0.f);
    for (int64_t j0 = 0; j0 < total; j0 += kPvBlock) {
      const int64_t j1 = std::min(total, j0 + kPvBlock);
      for (int64_t i = 0; i < nq; ++i)
        for (int64_t c = 0; c < hd_; c += 64)
          pv_span(p + i * ldp, vpast + c, P, vnew + c, ldn, j0, j1, out + i * hd_ + c, j0 == 0, i == 0);
    }
  }

  // One query row's 64 columns over value rows [j0, j1) (cached below P, new from P), accumulating into
  // out (`first`: from zero). `ahead`: asks the values kValueAheadRows rows ahead into L2.
  template <typename VT>
  void pv_span(const float* p, const VT* vpast, int64_t P, const float* vnew, int64_t ldn, int64_t j0, int64_t j1,
               float* out, bool first, bool ahead) const {
    F16 acc[4];
    RG_UNROLL for (int c = 0; c < 4; ++c) acc[c] = first ? F16::zero() : F16::load(out + 16 * c);
    auto step = [&](const auto* v, int64_t j) {
      const F16 pb = F16::bcast(p[j]);
      RG_UNROLL for (int c = 0; c < 4; ++c) acc[c].fma(pb, F16::load(v + 16 * c));
    };
    const int64_t row_bytes = hd_ * static_cast<int64_t>(sizeof(VT)), jp = std::min(j1, P);
    for (int64_t j = j0; j < jp; ++j) {
      if (ahead) prefetch_l2(vpast + (j + kValueAheadRows) * hd_, row_bytes);  // past the slot's end: no fault
      step(vpast + j * hd_, j);
    }
    for (int64_t j = std::max(j0, P); j < j1; ++j) step(vnew + (j - P) * ldn, j);
    RG_UNROLL for (int c = 0; c < 4; ++c) acc[c].store(out + 16 * c);
  }

  template <int MR, int HC, typename VT>
  void pv_micro(const float* p, int64_t ldp, const VT* vpast, int64_t P, const float* vnew, int64_t ldn,
                int64_t n, float* out) const {
    F16 acc[MR][HC];
    RG_UNROLL for (int i = 0; i < MR; ++i)
      RG_UNROLL for (int c = 0; c < HC; ++c) acc[i][c] = F16::zero();
    auto step = [&](const auto* v, int64_t j) {
      F16 vv[HC];
      RG_UNROLL for (int c = 0; c < HC; ++c) vv[c] = F16::load(v + 16 * c);
      RG_UNROLL for (int i = 0; i < MR; ++i) {
        const F16 pb = F16::bcast(p[i * ldp + j]);
        RG_UNROLL for (int c = 0; c < HC; ++c) acc[i][c].fma(pb, vv[c]);
      }
    };
    // Rows of values and outputs are hd_ long; this call's HC panels start at vpast, vnew and out.
    const int64_t row_bytes = hd_ * static_cast<int64_t>(sizeof(VT));
    for (int64_t j = 0; j < P; ++j) {
      prefetch_l2(vpast + (j + kValueAheadRows) * hd_, row_bytes);  // past the slot's end: no fault
      step(vpast + j * hd_, j);
    }
    for (int64_t j = 0; j < n; ++j) step(vnew + j * ldn, P + j);
    RG_UNROLL for (int i = 0; i < MR; ++i)
      RG_UNROLL for (int c = 0; c < HC; ++c) acc[i][c].store(out + i * hd_ + 16 * c);
  }

  // Scores of nq contiguous queries against n keys stored as panels ([n/16][hd][16]) into s (ld).
  template <typename PT>
  void score_panels(const float* q, int64_t nq, const PT* panels, int64_t n, float* s, int64_t ld) const {
    const int64_t np_total = (n + 15) / 16;
    for (int64_t pg = 0; pg < np_total; pg += kScorePanels) {
      const int64_t np = std::min<int64_t>(kScorePanels, np_total - pg), cols = std::min<int64_t>(np * 16, n - pg * 16);
      const PT* w = panels + pg * hd_ * 16;
      if (pg + kKeyAheadGroups * kScorePanels < np_total)
        prefetch_l2(w + kKeyAheadGroups * kScorePanels * hd_ * 16, kScorePanels * hd_ * 16 * static_cast<int64_t>(sizeof(PT)));
      even_row_tiles<kScoreRows>(nq, [&](auto R, int64_t m) {
        micro_rows<R()>(q + m * hd_, hd_, w, hd_, np, s + m * ld + pg * 16, ld, cols, false);
      });
    }
  }

  void write_cache(const float* qkv, size_t li, const int64_t* rs, const int64_t* pl, const int64_t* sl,
                   int64_t B, int64_t W) {
    if (kv_bf16_) write_cache_t<uint16_t>(qkv, li, rs, pl, sl, B, W);
    else write_cache_t<float>(qkv, li, rs, pl, sl, B, W);
  }

  static void store(float* d, float v) { *d = v; }
  static void store(uint16_t* d, float v) { *d = static_cast<uint16_t>(bf16_bits(v)); }  // exact: rounded already

  template <typename CT>
  void write_cache_t(const float* qkv, size_t li, const int64_t* rs, const int64_t* pl, const int64_t* sl,
                     int64_t B, int64_t W) {
    const int64_t Q = H_ * hd_, K = KVH_ * hd_;
    CT* kc = static_cast<CT*>(k_cache_[li].data_ptr());
    CT* vc = static_cast<CT*>(v_cache_[li].data_ptr());
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < rs[b + 1] - rs[b]; ++t) {
        const float* row = qkv + (rs[b] + t) * W;
        const int64_t j = pl[b] + t;
        for (int64_t g = 0; g < KVH_; ++g) {
          if (attn_ != Attn::kFma) {  // the tiles' layouts (key_at, value_at)
            CT* ksl = kc + (sl[b] * KVH_ + g) * cap16_ * hd_;
            CT* vsl = vc + (sl[b] * KVH_ + g) * cap16_ * hd_;
            const float* ks = row + Q + g * hd_;
            const float* vs = row + Q + K + g * hd_;
            for (int64_t d = 0; d < hd_; ++d) {
              store(ksl + key_at(j, d), ks[d]);
              store(vsl + value_at(j, d), vs[d]);
            }
            continue;
          }
          CT* kd = kc + (sl[b] * KVH_ + g) * cap16_ * hd_ + (j / 16) * hd_ * 16 + j % 16;
          const float* ks = row + Q + g * hd_;
          for (int64_t d = 0; d < hd_; ++d) store(kd + d * 16, ks[d]);
          CT* vd = vc + ((sl[b] * KVH_ + g) * cap_ + j) * hd_;
          const float* vs = row + Q + K + g * hd_;
          for (int64_t d = 0; d < hd_; ++d) store(vd + d, vs[d]);
        }
      }
    }
  }

  void swiglu(const float* gu, float* out, int64_t N) const {
    const int64_t I = I_;
    par_rows(N, 8, I * 8, [&](int64_t b, int64_t e) {
      for (int64_t n = b; n < e; ++n) {
        const float* g = gu + n * 2 * I;
        const float* u = g + I;
        float* o = out + n * I;
        silu_mul(g, u, o, I);
      }
    });
  }

  // Per position: argmax over the whole vocabulary; top-3 ids and their softmax probabilities
  // with the MASK token excluded (the draft candidates); and the log-sum-exp over the
  // whole vocabulary, for log-probabilities (the MASK-less sum with MASK's term added: no second pass).
  std::vector<at::Tensor> reduce(const at::Tensor& logits) const {
    const int64_t M = logits.size(0), V = V_;
    auto i64 = at::TensorOptions().dtype(at::kLong);
    at::Tensor am = at::empty({M}, i64), ti = at::empty({M, 3}, i64);
    at::Tensor tp = at::empty({M, 3}, at::TensorOptions().dtype(at::kFloat));
    at::Tensor ls = at::empty({M}, at::TensorOptions().dtype(at::kFloat));
    const float* lg = logits.data_ptr<float>();
    int64_t* amp = am.data_ptr<int64_t>();
    int64_t* tip = ti.data_ptr<int64_t>();
    float* tpp = tp.data_ptr<float>();
    float* lsp = ls.data_ptr<float>();
    const int64_t mask = mask_token_;
    // Vector passes over blocks of 64 logits, then scalar work on a few blocks only: the argmax is in
    // the first block whose maximum is the row's; the top three (MASK excluded; ties to the lower id,
    // as a scan with strict comparisons gives) are in the three blocks with the highest maxima.
    constexpr int64_t kB = 64;
    const int64_t nb = (V + kB - 1) / kB;
    auto insert3 = [](float x, int64_t id, float (&tv)[3], int64_t (&tid)[3]) {
      if (!(x > tv[2])) return;
      if (x > tv[0]) {
        tv[2] = tv[1]; tid[2] = tid[1]; tv[1] = tv[0]; tid[1] = tid[0]; tv[0] = x; tid[0] = id;
      } else if (x > tv[1]) {
        tv[2] = tv[1]; tid[2] = tid[1]; tv[1] = x; tid[1] = id;
      } else {
        tv[2] = x; tid[2] = id;
      }
    };
    par_rows(M, 2, V * 8, [&](int64_t b, int64_t e) {
      std::vector<float> bmax(static_cast<size_t>(nb)), bmax_ex(static_cast<size_t>(nb));
      for (int64_t r = b; r < e; ++r) {
        const float* l = lg + r * V;
        float all = -INFINITY;
        for (int64_t blk = 0; blk < nb; ++blk) {
          const int64_t v0 = blk * kB, v1 = std::min(V, v0 + kB);
          float m = row_max(l + v0, v1 - v0);  // 16 lanes: GCC left the `omp simd reduction(max)` loop scalar
          bmax[blk] = m;
          all = std::max(all, m);
          if (mask >= v0 && mask < v1) {  // the block holding MASK: its maximum without it
            m = -INFINITY;
            for (int64_t v = v0; v < v1; ++v)
              if (v != mask) m = std::max(m, l[v]);
          }
          bmax_ex[blk] = m;
        }
        int64_t best = V - 1;  // the first index of the maximum, as torch's argmax
        for (int64_t blk = 0; blk < nb; ++blk) {
          if (!(bmax[blk] == all)) continue;
          for (int64_t v = blk * kB; v < std::min(V, blk * kB + kB); ++v)
            if (l[v] == all) { best = v; break; }
          break;
        }
        amp[r] = best;
        float bv[3] = {-INFINITY, -INFINITY, -INFINITY};
        int64_t bid[3] = {-1, -1, -1};
        for (int64_t blk = 0; blk < nb; ++blk) insert3(bmax_ex[blk], blk, bv, bid);
        int64_t blocks[3] = {bid[0], bid[1], bid[2]};
        std::sort(blocks, blocks + 3);  // scan in vocabulary order (ties go to the lower id)
        float tv[3] = {-INFINITY, -INFINITY, -INFINITY};
        int64_t tid[3] = {0, 0, 0};
        for (int64_t blk : blocks) {
          if (blk < 0) continue;
          for (int64_t v = blk * kB; v < std::min(V, blk * kB + kB); ++v)
            if (v != mask) insert3(l[v], v, tv, tid);
        }
        const float m = tv[0];
        const float sum = exp_sum16(l, V, m, mask >= 0 && mask < V ? mask : -1);  // the softmax leaves MASK out
        const float lse = m + std::log(sum);
        for (int k = 0; k < 3; ++k) tip[r * 3 + k] = tid[k];
        for (int k = 0; k < 3; ++k) tpp[r * 3 + k] = std::exp(tv[k] - lse);
        const float lm = mask >= 0 && mask < V ? l[mask] : -INFINITY;  // log(e^lse + e^lm), the larger factored out
        const float hi = std::max(lse, lm), lo = std::min(lse, lm);
        lsp[r] = hi + std::log1p(std::exp(lo - hi));
      }
    });
    return {am, ti, tp, ls};
  }

  at::Tensor embed_, norm_, cos_, sin_;
  at::Tensor draft_embed_;  // undefined unless the draft adapter has a MASK embedding of its own
  PackedW head_;
  std::vector<Layer> layers_;
  std::vector<at::Tensor> k_cache_, v_cache_;
  int64_t H_, KVH_, hd_, D_ = 0, V_ = 0, I_ = 0;
  float eps_;
  int64_t mask_token_, slots_, cap_, cap16_;
  bool kv_bf16_ = false;  // K/V rounded to bf16 when computed, stored as bf16 (half the cache traffic)
  // Attention's kernel (pair_attention); the two on bf16 pairs keep the cache in the tiles' layouts.
  enum class Attn { kFma, kAmx, kDot };
  Attn attn_ = Attn::kFma;
  // The attention a model loaded now runs, given that its options allow the bf16 pairs' (bf16 compute and
  // KV, head dimension 64): AMX where the GEMMs take AMX, else vdpbf16ps where the CPU has it; the FMA
  // attention otherwise, or as RECGUIDE_NATIVE_BF16_ATTENTION=0 / RECGUIDE_NATIVE_AMX_ATTENTION=0 ask
  // (A/B). RECGUIDE_NATIVE_BF16_ATTENTION=1 takes the dot kernel where vdpbf16ps is emulated (tests).
  static Attn pair_attention(bool options_allow) {
    auto env = [](const char* name) {
      const char* e = std::getenv(name);
      return std::string(e ? e : "");
    };
    const std::string want = env("RECGUIDE_NATIVE_BF16_ATTENTION");
    if (!options_allow || want == "0") return Attn::kFma;
    if (kAmxBuilt && amx_wanted()) return env("RECGUIDE_NATIVE_AMX_ATTENTION") == "0" ? Attn::kFma : Attn::kAmx;
    return std::string(kBf16Dot) == "avx512_bf16" || want == "1" ? Attn::kDot : Attn::kFma;
  }
  bool has_adapter_ = false;
  bool timing_ = false;
  Timers tm_;
};

// ---- The machine's own limits, for benchmarks (scripts/bench_forward.py) ------------------------
// Peak rates (FMA, bf16 dot): independent accumulator chains of this build's vector type per thread.
#if defined(__AVX512F__)
constexpr int kChains = 16;
#else
constexpr int kChains = 6;  // 16 ymm registers: 2 per F16
#endif

// `body` on `threads` threads at once (this one among them): the seconds until the last one ends.
template <typename Body>
double on_threads(int64_t threads, const Body& body) {
  std::vector<std::thread> ts;
  const auto t0 = Clock::now();
  for (int64_t t = 1; t < threads; ++t) ts.emplace_back(body);
  body();
  for (auto& t : ts) t.join();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// `threads` threads, each running `steps(acc, 1024)` on kChains accumulators until `seconds` have
// passed; `flops_per_step` per chain and step. The step functions work on local copies of the
// accumulators with their operands by value: with operands read through may-alias vector types and
// the accumulators in the caller's memory, GCC reloaded the operands and stored every accumulator
// after each step (the bf16 rate read a third of itself).
template <typename Steps>
double chain_gflops(int64_t threads, double seconds, int64_t flops_per_step, const Steps& steps) {
  std::atomic<int64_t> flops{0};
  auto body = [&] {
    F16 acc[kChains];
    for (int i = 0; i < kChains; ++i) acc[i] = F16::bcast(1.0f + i * 1e-3f);
    int64_t n = 0;
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < end) {
      steps(acc, 1024);
      n += 1024 * kChains;
    }
    alignas(64) float sink[16];
    float s = 0.f;
    // Every lane is live: with lane 0 alone, GCC dropped the AVX2 F16's upper register, and the rate
    // counted twice the FMAs run (276 "GFLOP/s" on 2 Zen 3 cores at ~3 GHz, whose peak is ~195).
    for (int i = 0; i < kChains; ++i) {
      acc[i].store(sink);
      for (float v : sink) s += v;
    }
    flops.fetch_add(n * flops_per_step + (s == 12345.f ? 1 : 0));
  };
  const double dt = on_threads(threads, body);  // before the load: the operands of / are unsequenced
  return static_cast<double>(flops.load()) / dt / 1e9;
}

// `reps` FMA steps on each chain (acc = a * b + acc): 32 flops a step.
void fma_chains(F16 (&acc)[kChains], F16 x, F16 y, int64_t reps) {
  F16 c[kChains];
  for (int i = 0; i < kChains; ++i) c[i] = acc[i];
  for (int64_t rep = 0; rep < reps; ++rep)
    for (int i = 0; i < kChains; ++i) c[i].fma(x, y);
  for (int i = 0; i < kChains; ++i) acc[i] = c[i];
}

// `reps` dot2 steps on each chain: 64 flops a step (16 lanes x 2 products x multiply and add).
void dot_chains(F16 (&acc)[kChains], P16 w, X2 x, int64_t reps) {
  F16 c[kChains];
  for (int i = 0; i < kChains; ++i) c[i] = acc[i];
  for (int64_t rep = 0; rep < reps; ++rep)
    for (int i = 0; i < kChains; ++i) dot2(c[i], w, x);
  for (int i = 0; i < kChains; ++i) acc[i] = c[i];
}

double fma_gflops(int64_t threads, double seconds) {
  const F16 a = F16::bcast(0.999999f), b = F16::bcast(1e-7f);
  return chain_gflops(threads, seconds, 32, [&](F16 (&acc)[kChains], int64_t reps) { fma_chains(acc, a, b, reps); });
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
// AMX's rate: `threads` threads each running TDPBF16PS into four independent accumulator tiles
// (2 x 16 x 16 x 32 flops each) until `seconds` have passed.
double amx_gflops(int64_t threads, double seconds) {
  std::atomic<int64_t> steps{0};
  auto body = [&] {
    static const AmxConfig cfg;
    _tile_loadconfig(&cfg);
    alignas(64) uint32_t a[256] = {}, b[256] = {};
    _tile_loadd(4, a, 64);
    _tile_loadd(5, b, 64);
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    int64_t n = 0;
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < end) {
      for (int i = 0; i < 256; ++i) {
        _tile_dpbf16ps(0, 4, 5); _tile_dpbf16ps(1, 4, 5); _tile_dpbf16ps(2, 4, 5); _tile_dpbf16ps(3, 4, 5);
      }
      n += 4 * 256;
    }
    _tile_release();
    steps.fetch_add(n);
  };
  const double dt = on_threads(threads, body);
  return static_cast<double>(steps.load()) * 2 * 16 * 16 * 32 / dt / 1e9;
}
#endif

// bf16 compute's rate: AMX's where a model packed now takes it, else the dot instruction's, emulated
// or not (kBf16Dot says which).
double bf16_dot_gflops(int64_t threads, double seconds) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if (amx_wanted()) return amx_gflops(threads, seconds);
#endif
  const uint32_t pair = bf16_bits(1e-7f) | (bf16_bits(1e-7f) << 16);
  const std::vector<uint32_t> wrow(16, pair);
  const P16 w = P16::load(wrow.data());
  const X2 x = X2::bcast(bf16_bits(0.999f) | (bf16_bits(0.999f) << 16));
  return chain_gflops(threads, seconds, 64, [&](F16 (&acc)[kChains], int64_t reps) { dot_chains(acc, w, x, reps); });
}

// Read bandwidth: `threads` threads sum disjoint halves of `buf` (much larger than the caches), best of reps.
double stream_gbps(at::Tensor buf, int64_t threads, int64_t reps) {
  const float* p = buf.data_ptr<float>();
  const int64_t n = buf.numel(), per = n / threads;
  double best = 0.0;
  std::vector<float> sums(static_cast<size_t>(threads));
  for (int64_t r = 0; r < reps; ++r) {
    auto body = [&](int64_t t) {
      F16 acc[4] = {F16::zero(), F16::zero(), F16::zero(), F16::zero()};
      const float* q = p + t * per;
      const F16 one = F16::bcast(1.0f);
      for (int64_t i = 0; i + 64 <= per; i += 64)
        for (int j = 0; j < 4; ++j) acc[j].fma(F16::load(q + i + 16 * j), one);
      // Every accumulator reaches the result: with only acc[0] used, the compiler drops the other
      // three chains' loads and the loop reads one cache line in four (a 3x too high "bandwidth").
      alignas(64) float sink[16];
      float s = 0.f;
      for (int j = 0; j < 4; ++j) {
        acc[j].store(sink);
        for (float v : sink) s += v;
      }
      sums[static_cast<size_t>(t)] = s;
    };
    std::vector<std::thread> ts;
    const auto t0 = Clock::now();
    for (int64_t t = 1; t < threads; ++t) ts.emplace_back(body, t);
    body(0);
    for (auto& t : ts) t.join();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, static_cast<double>(per * threads) * sizeof(float) / dt / 1e9);
  }
  volatile float keep = sums[0];  // the sums are used: no load is dead
  (void)keep;
  return best;
}

// vexp as the kernels run it (softmax's exp_minus and SwiGLU's silu_mul: vector builds take vexp_lanes
// on whole vectors) and one element at a time, unvectorised: [exp, exp one by one, silu, silu one by
// one] of x. tests/backends/test_native_backend.py keeps the vector paths bit-identical to the scalar one.
__attribute__((optimize("no-tree-vectorize"))) void scalar_paths(const float* x, float* e, float* s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    e[i] = vexp(x[i] - 0.f);
    s[i] = x[i] / (1.0f + vexp(-x[i])) * 1.0f;
  }
}

std::vector<at::Tensor> exp_paths(at::Tensor x_in) {
  TORCH_CHECK(x_in.dim() == 1 && x_in.scalar_type() == at::kFloat, "exp_paths: a 1-D float32 tensor");
  const at::Tensor x = x_in.contiguous();
  const int64_t n = x.numel();
  at::Tensor e = x.clone(), e1 = at::empty_like(x), s = at::empty_like(x), s1 = at::empty_like(x);
  at::Tensor ones = at::ones_like(x);
  exp_minus(e.data_ptr<float>(), n, 0.f);
  silu_mul(x.data_ptr<float>(), ones.data_ptr<float>(), s.data_ptr<float>(), n);
  scalar_paths(x.data_ptr<float>(), e1.data_ptr<float>(), s1.data_ptr<float>(), n);
  return {e, e1, s, s1};
}

// The head's log-sum-exp sum as the kernel runs it (exp_sum16) and as its definition reads, one
// element at a time into lane j % 16, unvectorised: [vector path, definition] of x, m and skip.
__attribute__((optimize("no-tree-vectorize"))) float exp_sum16_scalar(const float* x, int64_t n, float m,
                                                                      int64_t skip) {
  float lanes[16] = {0.f};
  for (int64_t j = 0; j < n; ++j)
    if (j != skip) lanes[j % 16] += vexp(x[j] - m);
  return sum16_tree(lanes);
}

std::vector<double> exp_sum_paths(at::Tensor x_in, double m, int64_t skip) {
  TORCH_CHECK(x_in.dim() == 1 && x_in.scalar_type() == at::kFloat, "exp_sum_paths: a 1-D float32 tensor");
  const at::Tensor x = x_in.contiguous();
  const float mf = static_cast<float>(m);
  return {exp_sum16(x.data_ptr<float>(), x.numel(), mf, skip),
          exp_sum16_scalar(x.data_ptr<float>(), x.numel(), mf, skip)};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("vector_path", [] { return std::string(kVectorPath); });
  m.def("bf16_dot", [] { return std::string(amx_wanted() ? "amx_bf16" : kBf16Dot); });
  m.def("amx_available", &amx_permitted);
  m.def("fma_gflops", &fma_gflops, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("stream_gbps", &stream_gbps, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("bf16_dot_gflops", &bf16_dot_gflops, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("exp_paths", &exp_paths);
  m.def("exp_sum_paths", &exp_sum_paths);
  pybind11::class_<NLDCpu>(m, "NLDCpu")
      .def(pybind11::init<at::Tensor, std::vector<std::vector<at::Tensor>>, at::Tensor, at::Tensor, at::Tensor,
                          at::Tensor, int64_t, int64_t, int64_t, double, int64_t, int64_t, int64_t, int64_t, bool, bool>())
      .def("forward", &NLDCpu::forward, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("copy_slot", &NLDCpu::copy_slot, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("k_cache", &NLDCpu::k_cache)
      .def("amx_attention", &NLDCpu::amx_attention)
      .def("attention_kind", &NLDCpu::attention_kind)
      .def("v_cache", &NLDCpu::v_cache)
      .def("set_timing", &NLDCpu::set_timing)
      .def("set_draft_mask_embedding", &NLDCpu::set_draft_mask_embedding)
      .def("set_attention_extras", &NLDCpu::set_attention_extras)
      .def("timings", &NLDCpu::timings)
      .def("reset_timings", &NLDCpu::reset_timings);
}
