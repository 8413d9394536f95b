// One fused FOAM step for a list of folded matrices on the CPU (FOAM_SPEC section 2).
//
// The eager step in foam/update.py makes about ten full-size passes per matrix (fold, two
// EMAs, residual, square, sqrt, divide, update) through full-size temporaries. Here each matrix
// is read once for the fold and once for the update, from a cache-sized slice, and the folded
// states are updated in the same pass: per element the step reads the gradient and the parameter
// and writes the parameter, which is less memory traffic than fused AdamW's. Arithmetic is float32;
// parameters, gradients and states may each be float32 or bfloat16 (rounded to nearest even).
//
// The loops run on explicit vectors, ATen's at::vec::Vectorized<float> (what torch's own fused
// AdamW uses), so no compiler's auto-vectoriser decides how fast the step is. ATen picks a
// vector's instruction set from CPU_CAPABILITY_* macros, which torch's build sets per kernel file
// and an extension does not: AVX2 is set below where the compiler targets it (-march=native,
// foam/fused.py; an AVX-512 CPU too, since the block shuffles are written for 256-bit vectors),
// and the vectors live in a namespace of their own so that no symbol collides with libtorch's
// copies. Elsewhere (an ARM CPU takes NEON by itself), or built with FOAM_PORTABLE (which is how
// the tests run that path on any machine), the vectors are ATen's portable ones and the block
// shuffles go through arrays.
//
// Every per-step number (bias corrections, step size, decay, residual scales) is an argument, so
// the Python side decides the semantics and this file only does the arithmetic.

#if !defined(FOAM_PORTABLE) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define CPU_CAPABILITY_AVX2
#endif
#define CPU_CAPABILITY foam_native

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <vector>

// The hot loops below call ATen's conversions, which GCC otherwise leaves as calls in them.
#if defined(__GNUC__)
#define FOAM_FLATTEN __attribute__((flatten))
#else
#define FOAM_FLATTEN
#endif

namespace {

using Vec = at::vec::Vectorized<float>;
using VecBF16 = at::vec::Vectorized<at::BFloat16>;
constexpr int64_t kW = Vec::size();
constexpr int64_t kChunk = 2 * kW;  // what the loops take at a time: one bfloat16 vector's worth
static_assert(VecBF16::size() == kChunk, "a bfloat16 vector holds two float32 vectors");

// Loads and stores of one vector (kW entries) or a chunk (two vectors), widened to float32 and
// rounded back to nearest even; the `n` forms take the first n entries (n <= their size) and
// read zeros beyond them.
inline Vec load1(const float* x) { return Vec::loadu(x); }
inline Vec load1(const at::BFloat16* x) {
  Vec out;
  at::vec::load_fp32_from_bf16(x, out);
  return out;
}
inline void store1(float* x, Vec a) { a.store(x); }

inline void load2(const float* x, Vec& a, Vec& b) {
  a = Vec::loadu(x);
  b = Vec::loadu(x + kW);
}
inline void load2(const at::BFloat16* x, Vec& a, Vec& b) {
  std::tie(a, b) = at::vec::convert_bfloat16_float(VecBF16::loadu(x));
}
inline void load2(const float* x, int64_t n, Vec& a, Vec& b) {
  if (n == kChunk) return load2(x, a, b);
  a = Vec::loadu(x, std::min(n, kW));
  b = n > kW ? Vec::loadu(x + kW, n - kW) : Vec(0.0f);
}
inline void load2(const at::BFloat16* x, int64_t n, Vec& a, Vec& b) {
  std::tie(a, b) = at::vec::convert_bfloat16_float(VecBF16::loadu(x, n));
}
inline void store2(float* x, Vec a, Vec b) {
  a.store(x);
  b.store(x + kW);
}
inline void store2(at::BFloat16* x, Vec a, Vec b) {
  at::vec::convert_float_bfloat16(a, b).store(x);
}
inline void store2(float* x, int64_t n, Vec a, Vec b) {
  if (n == kChunk) return store2(x, a, b);
  a.store(x, std::min(n, kW));
  if (n > kW) b.store(x + kW, n - kW);
}
inline void store2(at::BFloat16* x, int64_t n, Vec a, Vec b) {
  at::vec::convert_float_bfloat16(a, b).store(x, n);
}

// The layouts of a chunk of 2 * kW consecutive entries held as two float32 vectors. `natural`:
// the first kW entries, then the next kW. `pairs`: the entries at even offsets, then those at odd
// offsets, lane i of each holding pair i (entries 2i and 2i + 1). A bfloat16 chunk is one vector
// of 32-bit words, each a pair, so its pairs are a shift and a mask apart (two operations, where
// widening it in order takes a lane-crossing shuffle and two widenings), and a float32 chunk is a
// de-interleave apart. Element-wise arithmetic does not care which layout it runs on, as long as
// every tensor of a chunk (parameter, gradient, states) is held in the same one; and in `pairs`,
// the sums of blocks of 2 entries along a row are one addition, lane i being block i.
enum class Layout { natural, pairs };

// The layout the step holds a parameter of type P's chunks in.
template <typename P>
constexpr Layout layout_of = std::is_same_v<P, at::BFloat16> ? Layout::pairs : Layout::natural;

using IVec = at::vec::Vectorized<int32_t>;
static_assert(IVec::size() == kW, "32-bit integer and float vectors have the same lanes");

// A float vector's bits as 32-bit integers and back (no conversion).
inline IVec bits_of(Vec x) {
#if defined(CPU_CAPABILITY_AVX2)
  return _mm256_castps_si256(x);
#else
  return at::vec::cast<int32_t>(x);
#endif
}
inline Vec float_of(IVec x) {
#if defined(CPU_CAPABILITY_AVX2)
  return _mm256_castsi256_ps(x);
#else
  return at::vec::cast<float>(x);
#endif
}

// Each 32-bit lane shifted by 16 bits, zeros shifted in: AVX2's shifts by an immediate, which
// some CPUs run faster than ATen's shifts by a vector (AMD's Zen 2, a 64 x 512 bf16 FOAM-2 step
// in cache: 0.92 against 1.03 ns an entry).
inline IVec high_to_low(IVec x) {
#if defined(CPU_CAPABILITY_AVX2)
  return _mm256_srli_epi32(x, 16);
#else
  return (x >> IVec(16)) & IVec(0xffff);
#endif
}
inline IVec low_to_high(IVec x) {
#if defined(CPU_CAPABILITY_AVX2)
  return _mm256_slli_epi32(x, 16);
#else
  return x << IVec(16);
#endif
}

// x rounded to the nearest bfloat16, ties to even, as the high 16 bits of each lane (the low 16
// are left over): what torch's conversion computes, NaN included (all ones, as ATen's vectors).
inline IVec bfloat16_high_bits(Vec x) {
  const IVec w = bits_of(x);
  const IVec rounded = w + (high_to_low(w) & IVec(1)) + IVec(0x7fff);
  return IVec::blendv(rounded, IVec(-1), bits_of(x.isnan()));
}

// One vector stored as bfloat16: the rounded high halves packed (ATen's conversion takes two
// vectors, so one vector through it pays for two).
inline void store1(at::BFloat16* x, Vec a) {
  const IVec halves = high_to_low(bfloat16_high_bits(a));
#if defined(CPU_CAPABILITY_AVX2)
  const __m256i h = halves;
  _mm_storeu_si128(reinterpret_cast<__m128i*>(x),
                   _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
#else
  int32_t words[kW];
  halves.store(words);
  for (int64_t i = 0; i < kW; ++i) {
    x[i] = at::BFloat16(static_cast<uint16_t>(words[i]), at::BFloat16::from_bits());
  }
#endif
}

inline void load_chunk(Layout layout, const float* x, Vec& a, Vec& b) {
  a = Vec::loadu(x);
  b = Vec::loadu(x + kW);
  if (layout == Layout::pairs) std::tie(a, b) = at::vec::deinterleave2(a, b);
}
inline void load_chunk(Layout layout, const at::BFloat16* x, Vec& a, Vec& b) {
  if (layout == Layout::natural) return load2(x, a, b);
  const IVec words = IVec::loadu(x);
  a = float_of(low_to_high(words));
  b = float_of(words & IVec(static_cast<int32_t>(0xffff0000u)));
}
inline void store_chunk(Layout layout, float* x, Vec a, Vec b) {
  if (layout == Layout::pairs) std::tie(a, b) = at::vec::interleave2(a, b);
  store2(x, a, b);
}
inline void store_chunk(Layout layout, at::BFloat16* x, Vec a, Vec b) {
  if (layout == Layout::natural) return store2(x, a, b);
  const IVec even = high_to_low(bfloat16_high_bits(a));
  const IVec odd = bfloat16_high_bits(b) & IVec(static_cast<int32_t>(0xffff0000u));
  (even | odd).store(x);
}
// The first n <= kChunk entries of a chunk, through a chunk-sized buffer (zeros beyond them).
template <typename T>
inline void load_chunk(Layout layout, const T* x, int64_t n, Vec& a, Vec& b) {
  if (n == kChunk) return load_chunk(layout, x, a, b);
  T buffer[kChunk] = {};
  std::copy_n(x, n, buffer);
  load_chunk(layout, buffer, a, b);
}
template <typename T>
inline void store_chunk(Layout layout, T* x, int64_t n, Vec a, Vec b) {
  if (n == kChunk) return store_chunk(layout, x, a, b);
  T buffer[kChunk];
  store_chunk(layout, buffer, a, b);
  std::copy_n(buffer, n, x);
}
// One vector's first n <= kW entries (zeros beyond them).
template <typename T>
inline Vec load_vec(const T* x, int64_t n) {
  if (n == kW) return load1(x);
  T buffer[kW] = {};
  std::copy_n(x, n, buffer);
  return load1(buffer);
}
template <typename T>
inline void store_vec(T* x, int64_t n, Vec a) {
  if (n == kW) return store1(x, a);
  T buffer[kW];
  store1(buffer, a);
  std::copy_n(buffer, n, x);
}

// Asks for the n entries at x to be brought into cache: issued a slice ahead (step_along_rows),
// it keeps the gradient and parameter streams from memory going while a slice's fold, which
// reads only the gradient, and its update alternate. The column fold reads whole rows in order,
// which the hardware's prefetchers follow by themselves: a whole next row asked for at once there
// made the step slower (LLaMA-60M's 512 x 1376 fp32 FOAM-2: 1.36 against 1.20 ns an entry).
template <typename T>
inline void prefetch(const T* x, int64_t n) {
  const char* bytes = reinterpret_cast<const char*>(x);
  for (int64_t at = 0; at < n * static_cast<int64_t>(sizeof(T)); at += 64) {
    __builtin_prefetch(bytes + at);
  }
}

// x rounded to T and back: the eager step decays the parameter in its own dtype before the
// update, and this keeps bfloat16 results equal to it.
template <typename T>
inline Vec rounded_to(Vec x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return float_of(bfloat16_high_bits(x) & IVec(static_cast<int32_t>(0xffff0000u)));
  }
}

// The scalars of one step, shared by every matrix of a call.
struct Scalars {
  float beta1, beta2, rho, rho_sq, eps, step_size, decay;
  bool mean_of_squares;
};

// The scalars the update applies per entry, as vectors.
struct UpdateScalars {
  Vec rho, rho_sq, eps, step_size, decay;
  explicit UpdateScalars(const Scalars& s)
      : rho(s.rho), rho_sq(s.rho_sq), eps(s.eps), step_size(s.step_size), decay(s.decay) {}
};

// The updated parameter: round(p * decay) - step_size * (m_hat + rho R) / (sqrt(v_hat + rho_sq
// R^2) + eps), R = g - mean; R is the parameter's dtype, to which the decayed value is rounded
// as the eager step does. kDecay = false is decay 1 (no weight decay, the default), where
// p * decay is p itself: skipping that product and its rounding changes no bit.
template <typename R, bool kDecay>
inline Vec updated(Vec p, Vec g, Vec mean, Vec m_hat, Vec v_hat, const UpdateScalars& s) {
  const Vec r = g - mean;
  const Vec num = m_hat + s.rho * r;
  const Vec den = (v_hat + s.rho_sq * r * r).sqrt() + s.eps;
  const Vec decayed = kDecay ? rounded_to<R>(p * s.decay) : p;
  return decayed - s.step_size * (num / den);
}

// `body` instantiated for the step's weight decay (see `updated`) and second moment's source:
// branches outside the loops.
template <typename F>
inline void with_flags(const Scalars& s, F&& body) {
  auto decays = [&](auto mean_of_squares) {
    if (s.decay == 1.0f) {
      body(std::false_type{}, mean_of_squares);
    } else {
      body(std::true_type{}, mean_of_squares);
    }
  };
  if (s.mean_of_squares) {
    decays(std::true_type{});
  } else {
    decays(std::false_type{});
  }
}

// What a block's moments and mean need beyond its sums: the betas and bias corrections, and
// the count of its entries, len.
struct MomentScalars {
  Vec beta2, w1, w2, count, inv_count, inv_c1, inv_c2;
  bool exact;
  MomentScalars(const Scalars& s, int64_t len, float bc1, float bc2)
      : beta2(s.beta2),
        w1(1.0f - s.beta1),
        w2(1.0f - s.beta2),
        count(static_cast<float>(len)),
        inv_count(1.0f / static_cast<float>(len)),
        inv_c1(1.0f / bc1),
        inv_c2(1.0f / bc2),
        // A block's mean is its sum times 1 / len where that is exact (len a power of two,
        // every full block of FOAM-l), else the sum over len; the bias corrections multiply
        // by their inverses.
        exact((len & (len - 1)) == 0) {}
};

// Updates the k <= kChunk folded moments at m and v from their blocks' gradient sums and sums
// of squares (a chunk), with the formulas of torch's lerp_ and mul_/addcmul_
// (foam/numerics.py ema_). Gives each block's mean gradient and bias-corrected moments (from
// the unrounded moments).
template <bool kMeanOfSquares>
inline void moments(Vec sum, Vec sum_sq, Vec& m, Vec& v, const MomentScalars& c, Vec& mean,
                    Vec& m_hat, Vec& v_hat) {
  mean = c.exact ? sum * c.inv_count : sum / c.count;
  m = m + c.w1 * (mean - m);
  if constexpr (kMeanOfSquares) {
    const Vec mean_sq = c.exact ? sum_sq * c.inv_count : sum_sq / c.count;
    v = v + c.w2 * (mean_sq - v);
  } else {
    v = v * c.beta2 + c.w2 * mean * mean;
  }
  m_hat = m * c.inv_c1;
  v_hat = v * c.inv_c2;
}

// `moments` of a chunk of k <= kChunk blocks whose states at m and v are held in `layout`.
template <bool kMeanOfSquares, typename S>
inline void chunk_moments(Layout layout, const Vec* sum, const Vec* sum_sq, S* m, S* v,
                          int64_t k, const MomentScalars& c, Vec* mean, Vec* m_hat,
                          Vec* v_hat) {
  Vec mv[2], vv[2];
  load_chunk(layout, m, k, mv[0], mv[1]);
  load_chunk(layout, v, k, vv[0], vv[1]);
  for (int h = 0; h < 2; ++h) {
    moments<kMeanOfSquares>(sum[h], sum_sq[h], mv[h], vv[h], c, mean[h], m_hat[h], v_hat[h]);
  }
  store_chunk(layout, m, k, mv[0], mv[1]);
  store_chunk(layout, v, k, vv[0], vv[1]);
}

// chunk_moments over n blocks of len entries, their sums and block values in arrays of n
// rounded up to whole chunks. The arrays hold each chunk's two vectors as they are (lane i of
// the first at i, of the second at kW + i), so that with states in `pairs` they stay in the order
// of the chunks they came from; a last partial chunk's lanes beyond its blocks are zeros.
template <bool kMeanOfSquares, typename S>
FOAM_FLATTEN void update_moments(Layout layout, const float* sum, const float* sum_sq, int64_t n,
                                 int64_t len, S* m, S* v, const Scalars& s, float bc1, float bc2,
                                 float* mean, float* m_hat, float* v_hat) {
  const MomentScalars c(s, len, bc1, bc2);
  for (int64_t b = 0; b < n; b += kChunk) {
    const int64_t k = std::min(kChunk, n - b);
    Vec mu[2], sq[2], mv[2], mh[2], vh[2];
    load2(sum + b, mu[0], mu[1]);
    if constexpr (kMeanOfSquares) load2(sum_sq + b, sq[0], sq[1]);
    chunk_moments<kMeanOfSquares>(layout, mu, sq, m + b, v + b, k, c, mv, mh, vh);
    store2(mean + b, mv[0], mv[1]);
    store2(m_hat + b, mh[0], mh[1]);
    store2(v_hat + b, vh[0], vh[1]);
  }
}

// Sum (and with kSquares the sum of squares) of the n entries of one block of any length:
// chunks (in `layout`: a sum takes its entries in any order), then one vector, then a partial
// one, so that a block of one vector is one load.
template <bool kSquares, typename G>
FOAM_FLATTEN inline void block_sum(Layout layout, const G* g, int64_t n, float* sum,
                                   float* sum_sq) {
  Vec acc[2] = {Vec(0.0f), Vec(0.0f)}, acc_sq[2] = {Vec(0.0f), Vec(0.0f)};
  const auto add = [&](int h, Vec x) {
    acc[h] = acc[h] + x;
    if constexpr (kSquares) acc_sq[h] = acc_sq[h] + x * x;
  };
  int64_t j = 0;
  for (; j + kChunk <= n; j += kChunk) {
    Vec x[2];
    load_chunk(layout, g + j, x[0], x[1]);
    add(0, x[0]);
    add(1, x[1]);
  }
  if (j + kW <= n) {
    add(0, load1(g + j));
    j += kW;
  }
  if (j < n) {
    Vec x[2];
    load2(g + j, n - j, x[0], x[1]);
    add(1, x[0]);
  }
  const auto plus = [](Vec a, Vec b) { return a + b; };
  *sum = at::vec::vec_reduce_all<float>(plus, acc[0] + acc[1]);
  if constexpr (kSquares) *sum_sq = at::vec::vec_reduce_all<float>(plus, acc_sq[0] + acc_sq[1]);
}

// The update of n contiguous entries whose block values are given per entry (arrays of n, held
// as update_moments leaves them for chunks in the parameter's layout).
template <typename P, typename G, bool kDecay>
FOAM_FLATTEN inline void apply_update(P* p, const G* g, const float* mean, const float* m_hat,
                                      const float* v_hat, int64_t n, const UpdateScalars& s) {
  constexpr Layout layout = layout_of<P>;
  for (int64_t j = 0; j < n; j += kChunk) {
    const int64_t k = std::min(kChunk, n - j);
    Vec pv[2], gv[2], mv[2], mh[2], vh[2];
    load_chunk(layout, p + j, k, pv[0], pv[1]);
    load_chunk(layout, g + j, k, gv[0], gv[1]);
    load2(mean + j, mv[0], mv[1]);
    load2(m_hat + j, mh[0], mh[1]);
    load2(v_hat + j, vh[0], vh[1]);
    for (int h = 0; h < 2; ++h) pv[h] = updated<P, kDecay>(pv[h], gv[h], mv[h], mh[h], vh[h], s);
    store_chunk(layout, p + j, k, pv[0], pv[1]);
  }
}

// The update of the n entries of one block, its values broadcast: chunks, then one vector, then
// a partial one (as block_sum).
template <typename P, typename G, bool kDecay>
FOAM_FLATTEN inline void apply_block(P* p, const G* g, float mean, float m_hat, float v_hat,
                                     int64_t n, const UpdateScalars& s) {
  constexpr Layout layout = layout_of<P>;  // one value for every entry: any order will do
  const Vec mv(mean), mh(m_hat), vh(v_hat);
  int64_t j = 0;
  for (; j + kChunk <= n; j += kChunk) {
    Vec pv[2], gv[2];
    load_chunk(layout, p + j, pv[0], pv[1]);
    load_chunk(layout, g + j, gv[0], gv[1]);
    for (int h = 0; h < 2; ++h) pv[h] = updated<P, kDecay>(pv[h], gv[h], mv, mh, vh, s);
    store_chunk(layout, p + j, pv[0], pv[1]);
  }
  if (j + kW <= n) {
    store1(p + j, updated<P, kDecay>(load1(p + j), load1(g + j), mv, mh, vh, s));
    j += kW;
  }
  if (j < n) {
    Vec pv[2], gv[2];
    load2(p + j, n - j, pv[0], pv[1]);
    load2(g + j, n - j, gv[0], gv[1]);
    store2(p + j, n - j, updated<P, kDecay>(pv[0], gv[0], mv, mh, vh, s), pv[1]);
  }
}

// Blocks of K = 2, 4 or 8 entries along a row are taken kW blocks (a group) at a time, in
// registers, from the group's vectors of items: its entries (the `natural` layout) or its pairs'
// sums (`pairs`, where a block of 2 is one item). Items are summed with their neighbours level by
// level, two vectors into one, with shuffles that stay inside each 128-bit lane (a lane-crossing
// shuffle costs several times as much on some CPUs: with ATen's de-interleave instead, a
// 64 x 512 fp32 FOAM-3 step in cache took 0.82 against 0.53 ns an entry on AMD's Zen 2):
// neighbour_sums(u, v) holds, in each 128-bit lane of four floats, [u0 + u1, u2 + u3, v0 + v1,
// v2 + v3]. The additions are the eager fold's
// ((g0 + g1) + (g2 + g3)) ...; the lanes end up holding the group's blocks in an order that
// block_order works out at compile time, into which the folded states are permuted after their
// load and out of which before their store (the only lane-crossing shuffles). spread_low and
// spread_high undo one level: each sum's value back over the two lanes it came from, of u or v.
static_assert(kW % 4 == 0, "the shuffles work on 128-bit lanes of four floats");

#if defined(CPU_CAPABILITY_AVX2)
inline Vec neighbour_sums(Vec u, Vec v) {
  return _mm256_add_ps(_mm256_shuffle_ps(u, v, 0x88), _mm256_shuffle_ps(u, v, 0xdd));
}
inline Vec spread_low(Vec h) { return _mm256_unpacklo_ps(h, h); }
inline Vec spread_high(Vec h) { return _mm256_unpackhi_ps(h, h); }
inline Vec gather_lanes(Vec x, const std::array<int32_t, kW>& index) {
  return _mm256_permutevar8x32_ps(
      x, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(index.data())));
}
inline Vec halves_sum(Vec u, Vec v) {
  return _mm256_add_ps(_mm256_permute2f128_ps(u, v, 0x20), _mm256_permute2f128_ps(u, v, 0x31));
}
inline Vec low_half_twice(Vec h) { return _mm256_permute2f128_ps(h, h, 0x00); }
inline Vec high_half_twice(Vec h) { return _mm256_permute2f128_ps(h, h, 0x11); }
#else
// The same lane arithmetic through arrays, for any vector width (a FOAM_PORTABLE build takes it
// on any CPU, which is how the tests check it).
inline Vec neighbour_sums(Vec u, Vec v) {
  float a[kW], b[kW], h[kW];
  u.store(a);
  v.store(b);
  for (int64_t q = 0; q < kW; q += 4) {
    h[q] = a[q] + a[q + 1];
    h[q + 1] = a[q + 2] + a[q + 3];
    h[q + 2] = b[q] + b[q + 1];
    h[q + 3] = b[q + 2] + b[q + 3];
  }
  return Vec::loadu(h);
}
inline Vec spread_half(Vec h, int64_t half) {
  float a[kW], out[kW];
  h.store(a);
  for (int64_t q = 0; q < kW; q += 4) {
    out[q] = out[q + 1] = a[q + 2 * half];
    out[q + 2] = out[q + 3] = a[q + 2 * half + 1];
  }
  return Vec::loadu(out);
}
inline Vec spread_low(Vec h) { return spread_half(h, 0); }
inline Vec spread_high(Vec h) { return spread_half(h, 1); }
inline Vec gather_lanes(Vec x, const std::array<int32_t, kW>& index) {
  float a[kW], out[kW];
  x.store(a);
  for (int64_t i = 0; i < kW; ++i) out[i] = a[index[i]];
  return Vec::loadu(out);
}
inline Vec halves_sum(Vec u, Vec v) {
  float a[kW], b[kW], out[kW];
  u.store(a);
  v.store(b);
  for (int64_t i = 0; i < kW / 2; ++i) {
    out[i] = a[i] + a[i + kW / 2];
    out[i + kW / 2] = b[i] + b[i + kW / 2];
  }
  return Vec::loadu(out);
}
inline Vec half_twice(Vec h, int64_t half) {
  float a[kW], out[kW];
  h.store(a);
  for (int64_t i = 0; i < kW / 2; ++i) out[i] = out[i + kW / 2] = a[i + half * kW / 2];
  return Vec::loadu(out);
}
inline Vec low_half_twice(Vec h) { return half_twice(h, 0); }
inline Vec high_half_twice(Vec h) { return half_twice(h, 1); }
#endif

// The block each lane holds after L levels of neighbour_sums over 2^L vectors of consecutive
// items (blocks of 2^L items), and the inverse permutation.
template <int L>
constexpr std::array<int32_t, kW> block_order() {
  std::array<std::array<int32_t, kW>, (1 << L)> first{};  // each lane's first item
  for (int64_t t = 0; t < (1 << L); ++t) {
    for (int64_t i = 0; i < kW; ++i) first[t][i] = static_cast<int32_t>(t * kW + i);
  }
  for (int64_t n = (1 << L); n > 1; n /= 2) {
    for (int64_t t = 0; t < n / 2; ++t) {
      const auto u = first[2 * t], v = first[2 * t + 1];
      for (int64_t q = 0; q < kW; q += 4) {
        first[t][q] = u[q];
        first[t][q + 1] = u[q + 2];
        first[t][q + 2] = v[q];
        first[t][q + 3] = v[q + 2];
      }
    }
  }
  std::array<int32_t, kW> order{};
  for (int64_t i = 0; i < kW; ++i) order[i] = first[0][i] >> L;
  return order;
}
template <int L>
constexpr std::array<int32_t, kW> natural_order() {
  std::array<int32_t, kW> inverse{};
  const auto order = block_order<L>();
  for (int64_t i = 0; i < kW; ++i) inverse[order[i]] = static_cast<int32_t>(i);
  return inverse;
}

// A group's kW folded-state values (natural order) into its sums' lane order, and back.
template <int L>
inline Vec to_lane_order(Vec x) {
  if constexpr (L == 0) {
    return x;
  } else {
    static constexpr auto order = block_order<L>();
    return gather_lanes(x, order);
  }
}
template <int L>
inline Vec to_natural_order(Vec x) {
  if constexpr (L == 0) {
    return x;
  } else {
    static constexpr auto order = natural_order<L>();
    return gather_lanes(x, order);
  }
}

// The block sums of a group from its 2^L item vectors (which it overwrites).
template <int L>
inline Vec sum_up(Vec* x) {
#pragma GCC unroll 4
  for (int64_t n = (1 << L); n > 1; n /= 2) {
#pragma GCC unroll 4
    for (int64_t t = 0; t < n / 2; ++t) x[t] = neighbour_sums(x[2 * t], x[2 * t + 1]);
  }
  return x[0];
}

// The 2^L item vectors' values from their blocks' values (sum_up's way back).
template <int L>
inline std::array<Vec, (1 << L)> spread_down(Vec values) {
  std::array<Vec, (1 << L)> out;
  out[0] = values;
#pragma GCC unroll 4
  for (int64_t n = 1; n < (1 << L); n *= 2) {
#pragma GCC unroll 4
    for (int64_t t = n - 1; t >= 0; --t) {
      const Vec h = out[t];
      out[2 * t] = spread_low(h);
      out[2 * t + 1] = spread_high(h);
    }
  }
  return out;
}

constexpr int log2_of(int64_t n) { return n > 1 ? 1 + log2_of(n / 2) : 0; }

// A group's sums, their lane order and their way back, over 2^L item vectors, or with kHalves
// over two sets of 2^L (= 4) whose last two vectors' 128-bit halves are added: blocks of eight
// float32 entries on an 8-wide vector, which then come out in their natural order.
template <int L, bool kHalves>
struct GroupTree {
  static constexpr int64_t kItems = (int64_t{1} << L) * (kHalves ? 2 : 1);
  static Vec sum(Vec* items) {
    if constexpr (kHalves) {
      const Vec low = sum_up<L>(items);
      return halves_sum(low, sum_up<L>(items + kItems / 2));
    } else {
      return sum_up<L>(items);
    }
  }
  static std::array<Vec, kItems> spread(Vec values) {
    if constexpr (kHalves) {
      const auto low = spread_down<L>(low_half_twice(values));
      const auto high = spread_down<L>(high_half_twice(values));
      std::array<Vec, kItems> out;
      std::copy(low.begin(), low.end(), out.begin());
      std::copy(high.begin(), high.end(), out.begin() + kItems / 2);
      return out;
    } else {
      return spread_down<L>(values);
    }
  }
  static Vec to_lanes(Vec x) { return kHalves ? x : to_lane_order<L>(x); }
  static Vec to_natural(Vec x) { return kHalves ? x : to_natural_order<L>(x); }
};

// One group of `blocks` <= kW blocks of K entries (see neighbour_sums); kWhole: blocks == kW,
// which leaves the group's loads and stores without a count to check.
template <int64_t K, bool kDecay, bool kSquares, bool kWhole, typename P, typename G, typename S>
FOAM_FLATTEN inline void short_blocks_group(P* p, const G* g, S* m, S* v, int64_t blocks,
                                            const MomentScalars& c, const UpdateScalars& us) {
  // Items of the parameter's own layout; float32 blocks of 8 in halves where the vector has two
  // (kW = 8), else in pairs (a de-interleave) as four items.
  constexpr bool kHalves = layout_of<P> == Layout::natural && K == 8 && kW == 8;
  constexpr Layout layout = K == 8 && !kHalves ? Layout::pairs : layout_of<P>;
  constexpr bool kPairs = layout == Layout::pairs;
  constexpr int L = log2_of(kPairs ? K / 2 : K) - (kHalves ? 1 : 0);
  static_assert(L <= 2, "neighbour_sums pairs lanes within 128 bits: at most four items a block");
  using Tree = GroupTree<L, kHalves>;
  constexpr int64_t kItems = Tree::kItems;                   // item vectors of a group
  constexpr int64_t kChunks = kPairs ? kItems : kItems / 2;  // the chunks they come from
  if constexpr (kWhole) blocks = kW;
  const int64_t entries = blocks * K;
  const auto count = [&](int64_t t) {
    return kWhole ? kChunk : std::clamp<int64_t>(entries - t * kChunk, 0, kChunk);
  };
  Vec items[kItems], squares[kItems];
  for (int64_t t = 0; t < kChunks; ++t) {
    Vec x[2];
    load_chunk(layout, g + t * kChunk, count(t), x[0], x[1]);
    if constexpr (kPairs) {
      items[t] = x[0] + x[1];
      if constexpr (kSquares) squares[t] = x[0] * x[0] + x[1] * x[1];
    } else {
      for (int h = 0; h < 2; ++h) {
        items[2 * t + h] = x[h];
        if constexpr (kSquares) squares[2 * t + h] = x[h] * x[h];
      }
    }
  }
  const Vec sum = Tree::sum(items);
  const Vec sum_sq = kSquares ? Tree::sum(squares) : Vec(0.0f);
  Vec mv = Tree::to_lanes(load_vec(m, blocks)), vv = Tree::to_lanes(load_vec(v, blocks));
  Vec mean, m_hat, v_hat;
  moments<kSquares>(sum, sum_sq, mv, vv, c, mean, m_hat, v_hat);
  store_vec(m, blocks, Tree::to_natural(mv));
  store_vec(v, blocks, Tree::to_natural(vv));
  const auto means = Tree::spread(mean), m_hats = Tree::spread(m_hat);
  const auto v_hats = Tree::spread(v_hat);
  for (int64_t t = 0; t < kChunks; ++t) {
    const int64_t n = count(t);
    if (n == 0) break;
    Vec pv[2], gv[2];
    load_chunk(layout, p + t * kChunk, n, pv[0], pv[1]);
    load_chunk(layout, g + t * kChunk, n, gv[0], gv[1]);
    for (int h = 0; h < 2; ++h) {
      const int64_t i = kPairs ? t : 2 * t + h;  // the item vector this half's values are of
      pv[h] = updated<P, kDecay>(pv[h], gv[h], means[i], m_hats[i], v_hats[i], us);
    }
    store_chunk(layout, p + t * kChunk, n, pv[0], pv[1]);
  }
}

// The `full` blocks of K entries at the start of a row, a group at a time.
template <int64_t K, bool kDecay, bool kSquares, typename P, typename G, typename S>
FOAM_FLATTEN void row_of_short_blocks(P* p, const G* g, S* m, S* v, int64_t full,
                                      const MomentScalars& c, const UpdateScalars& us) {
  int64_t b = 0;
  for (; b + kW <= full; b += kW) {
    short_blocks_group<K, kDecay, kSquares, true>(p + b * K, g + b * K, m + b, v + b, kW, c, us);
  }
  if (b < full) {
    short_blocks_group<K, kDecay, kSquares, false>(p + b * K, g + b * K, m + b, v + b,
                                                   full - b, c, us);
  }
}

// Fold along the columns: blocks of `block` consecutive entries of a row, the last one possibly
// shorter. K > 0 is a block size of 2, 4 or 8 known at compile time, whose whole blocks are
// taken in registers (row_of_short_blocks); the rest (every block when K = 0, else the shorter
// last one) each on its own, whole vectors of it at a time, through arrays of a row's blocks.
template <int64_t K, typename P, typename G, typename S>
void step_along_cols(P* p, const G* g, S* m, S* v, int64_t rows, int64_t cols, int64_t block,
                     const Scalars& s, float bc1, float bc2) {
  const int64_t full = cols / block, tail = cols - full * block, nb = full + (tail > 0);
  const int64_t in_registers = K > 0 ? full : 0, rest = nb - in_registers;
  const int64_t grain = std::max<int64_t>(1, 32768 / cols);
  const UpdateScalars us(s);
  const MomentScalars c(s, block, bc1, bc2);
  with_flags(s, [&](auto decays, auto squares) {
    constexpr bool kDecay = decltype(decays)::value, kSquares = decltype(squares)::value;
    at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      const int64_t room = rest + kChunk;  // update_moments takes whole chunks
      std::vector<float> sum(room, 0.0f), sum_sq(room, 0.0f), mean(room), m_hat(room), v_hat(room);
      for (int64_t r = begin; r < end; ++r) {
        const G* g_row = g + r * cols;
        P* p_row = p + r * cols;
        S *m_row = m + r * nb, *v_row = v + r * nb;
        if constexpr (K > 0) {
          row_of_short_blocks<K, kDecay, kSquares>(p_row, g_row, m_row, v_row, full, c, us);
        }
        for (int64_t b = in_registers; b < nb; ++b) {
          block_sum<kSquares>(layout_of<P>, g_row + b * block, std::min(block, cols - b * block),
                              &sum[b - in_registers], &sum_sq[b - in_registers]);
        }
        update_moments<kSquares>(Layout::natural, sum.data(), sum_sq.data(), full - in_registers,
                                 block,
                                 m_row + in_registers, v_row + in_registers, s, bc1, bc2,
                                 mean.data(), m_hat.data(), v_hat.data());
        if (tail) {
          update_moments<kSquares>(Layout::natural, &sum[rest - 1], &sum_sq[rest - 1], 1, tail,
                                   m_row + full,
                                   v_row + full, s, bc1, bc2, &mean[rest - 1], &m_hat[rest - 1],
                                   &v_hat[rest - 1]);
        }
        for (int64_t b = in_registers; b < nb; ++b) {
          const int64_t at = b * block, i = b - in_registers;
          apply_block<P, G, kDecay>(p_row + at, g_row + at, mean[i], m_hat[i], v_hat[i],
                                    std::min(block, cols - at), us);
        }
      }
    });
  });
}

// Fold along the rows in blocks of at most kShortBlock rows (FOAM-1 to FOAM-3): a chunk of
// columns at a time, the block's sums over its rows, its moments and the update of its rows,
// all in registers. No per-column arrays are written and read back (as step_along_rows does
// for longer blocks), which leaves the vector units the arithmetic alone (LLaMA-60M's 1376 x 512
// fp32 FOAM-2 with its data in cache: 0.55 against 0.82 ns an entry).
constexpr int64_t kShortBlock = 8;

// One block of len rows of step_along_short_rows, starting at g, p, m and v. The next block's
// len_next rows (starting at g + len * cols, p + len * cols) are asked into cache column by
// column meanwhile: the hardware's prefetchers did not keep up with a block's rows read side by
// side (LLaMA-60M's 1376 x 512 bf16 FOAM-2 beyond the cache: 1.64 ns an entry without it, 1.08
// with it).
// One chunk of k <= kChunk columns of short_rows_block (kWhole: k == kChunk).
template <bool kDecay, bool kSquares, bool kWhole, typename P, typename G, typename S>
FOAM_FLATTEN inline void short_rows_chunk(P* p, const G* g, S* m, S* v, int64_t len,
                                          int64_t cols, int64_t k, const MomentScalars& c,
                                          const UpdateScalars& us) {
  constexpr Layout layout = layout_of<P>;
  if constexpr (kWhole) k = kChunk;
  Vec sum[2], sum_sq[2], x[2], mean[2], m_hat[2], v_hat[2];
  load_chunk(layout, g, k, sum[0], sum[1]);
  if constexpr (kSquares) {
    for (int h = 0; h < 2; ++h) sum_sq[h] = sum[h] * sum[h];
  }
  for (int64_t i = 1; i < len; ++i) {
    load_chunk(layout, g + i * cols, k, x[0], x[1]);
    for (int h = 0; h < 2; ++h) {
      sum[h] = sum[h] + x[h];
      if constexpr (kSquares) sum_sq[h] = sum_sq[h] + x[h] * x[h];
    }
  }
  chunk_moments<kSquares>(layout, sum, sum_sq, m, v, k, c, mean, m_hat, v_hat);
  // Each row's parameter and gradient are loaded before the row above is stored: rows a multiple
  // of 4 KiB apart (LLaMA-350M's 1024 fp32 columns) otherwise make every load wait on the store
  // just before it, whose address it shares in its low 12 bits (2736 x 1024 fp32 FOAM-3: 1.51
  // against 1.31 ns an entry). Two rows back still alias; blocks of 8 such rows stay slow.
  Vec pv[2], gv[2];
  load_chunk(layout, p, k, pv[0], pv[1]);
  load_chunk(layout, g, k, gv[0], gv[1]);
  for (int64_t i = 0; i < len; ++i) {
    Vec out[2];
    for (int h = 0; h < 2; ++h) {
      out[h] = updated<P, kDecay>(pv[h], gv[h], mean[h], m_hat[h], v_hat[h], us);
    }
    if (i + 1 < len) {
      load_chunk(layout, p + (i + 1) * cols, k, pv[0], pv[1]);
      load_chunk(layout, g + (i + 1) * cols, k, gv[0], gv[1]);
    }
    store_chunk(layout, p + i * cols, k, out[0], out[1]);
  }
}

template <bool kDecay, bool kSquares, typename P, typename G, typename S>
FOAM_FLATTEN void short_rows_block(P* p, const G* g, S* m, S* v, int64_t len, int64_t cols,
                                   int64_t len_next, const MomentScalars& c,
                                   const UpdateScalars& us) {
  const auto prefetch_next = [&](int64_t j) {
    for (int64_t i = len; i < len + len_next; ++i) {
      __builtin_prefetch(g + i * cols + j);
      __builtin_prefetch(p + i * cols + j);
    }
  };
  int64_t j = 0;
  for (; j + kChunk <= cols; j += kChunk) {
    prefetch_next(j);
    short_rows_chunk<kDecay, kSquares, true>(p + j, g + j, m + j, v + j, len, cols, kChunk, c,
                                             us);
  }
  if (j < cols) {
    prefetch_next(j);
    short_rows_chunk<kDecay, kSquares, false>(p + j, g + j, m + j, v + j, len, cols, cols - j,
                                              c, us);
  }
}

template <typename P, typename G, typename S>
void step_along_short_rows(P* p, const G* g, S* m, S* v, int64_t rows, int64_t cols,
                           int64_t block, const Scalars& s, float bc1, float bc2) {
  const int64_t nb = (rows + block - 1) / block;
  const int64_t grain = std::max<int64_t>(1, 32768 / (block * cols));
  const UpdateScalars us(s);
  const MomentScalars full(s, block, bc1, bc2), tail(s, rows - (nb - 1) * block, bc1, bc2);
  with_flags(s, [&](auto decays, auto squares) {
    constexpr bool kDecay = decltype(decays)::value, kSquares = decltype(squares)::value;
    at::parallel_for(0, nb, grain, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const int64_t len = std::min(block, rows - b * block);
        const int64_t len_next = b + 1 < end ? std::min(block, rows - (b + 1) * block) : 0;
        short_rows_block<kDecay, kSquares>(p + b * block * cols, g + b * block * cols,
                                           m + b * cols, v + b * cols, len, cols, len_next,
                                           len == block ? full : tail, us);
      }
    });
  });
}

// Fold along the rows: blocks of `block` (more than kShortBlock) consecutive rows, one value
// per block and column. Work items are (block, slice of columns), so FOAM-Mini (one block) still
// runs in parallel; a slice is as wide as the threads allow (whole rows on one thread), since the
// fold and the update each stream their slice's rows: narrower slices read every row in short
// pieces a page apart (LLaMA-350M's 2736 x 1024 fp32 FOAM-Mini on one thread: 1.78 ns an entry
// in 512-column slices, 0.93 in whole rows). A column's sum runs down its rows in order whatever
// the slices, so the result does not depend on the thread count.
template <typename P, typename G, typename S>
void step_along_rows(P* p, const G* g, S* m, S* v, int64_t rows, int64_t cols, int64_t block,
                     const Scalars& s, float bc1, float bc2) {
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  const int64_t share = std::max<int64_t>(512, (cols + threads - 1) / threads);
  const int64_t slice = (share + kChunk - 1) / kChunk * kChunk;  // whole chunks, as held
  const int64_t nb = (rows + block - 1) / block;
  const int64_t slices = (cols + slice - 1) / slice;
  const UpdateScalars us(s);
  with_flags(s, [&](auto decays, auto squares) {
    constexpr bool kDecay = decltype(decays)::value, kSquares = decltype(squares)::value;
    at::parallel_for(0, nb * slices, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> sum(slice), sum_sq(slice), mean(slice), m_hat(slice), v_hat(slice);
      for (int64_t item = begin; item < end; ++item) {
        const int64_t b = item / slices, c0 = (item % slices) * slice;
        const int64_t width = std::min(slice, cols - c0);
        const int64_t r0 = b * block, len = std::min(block, rows - r0);
        const int64_t chunks = (width + kChunk - 1) / kChunk * kChunk;  // whole chunks, as held
        std::fill_n(sum.data(), chunks, 0.0f);
        std::fill_n(sum_sq.data(), chunks, 0.0f);
        for (int64_t i = 0; i < len; ++i) {
          const G* g_row = g + (r0 + i) * cols + c0;
          for (int64_t j = 0; j < width; j += kChunk) {
            const int64_t k = std::min(kChunk, width - j);
            Vec x[2], acc[2], acc_sq[2];
            load_chunk(layout_of<P>, g_row + j, k, x[0], x[1]);
            load2(sum.data() + j, acc[0], acc[1]);
            store2(sum.data() + j, acc[0] + x[0], acc[1] + x[1]);
            if constexpr (kSquares) {
              load2(sum_sq.data() + j, acc_sq[0], acc_sq[1]);
              store2(sum_sq.data() + j, acc_sq[0] + x[0] * x[0], acc_sq[1] + x[1] * x[1]);
            }
          }
        }
        const int64_t at = b * cols + c0;
        update_moments<kSquares>(layout_of<P>, sum.data(), sum_sq.data(), width, len, m + at,
                                 v + at, s, bc1, bc2, mean.data(), m_hat.data(), v_hat.data());
        const int64_t next = item + 1, b_next = next / slices, c_next = (next % slices) * slice;
        const int64_t r_next = b_next * block, len_next = std::min(block, rows - r_next);
        for (int64_t i = 0; i < len; ++i) {
          const int64_t offset = (r0 + i) * cols + c0;
          if (next < end && i < len_next) {
            prefetch(g + (r_next + i) * cols + c_next, std::min(slice, cols - c_next));
          }
          apply_update<P, G, kDecay>(p + offset, g + offset, mean.data(), m_hat.data(),
                                           v_hat.data(), width, us);
        }
      }
    });
  });
}

// The column fold with the block size a compile-time constant where it takes its blocks in
// registers (short_blocks_group).
template <typename P, typename G, typename S>
void step_along_cols_any(P* p, const G* g, S* m, S* v, int64_t rows, int64_t cols,
                         int64_t block, const Scalars& s, float bc1, float bc2) {
  const auto as = [&](auto size) {
    constexpr int64_t K = decltype(size)::value;
    step_along_cols<K>(p, g, m, v, rows, cols, block, s, bc1, bc2);
  };
  switch (block) {
    case 2: return as(std::integral_constant<int64_t, 2>{});
    case 4: return as(std::integral_constant<int64_t, 4>{});
    case 8: return as(std::integral_constant<int64_t, 8>{});
    default: return as(std::integral_constant<int64_t, 0>{});
  }
}

template <typename F>
void with_type(at::ScalarType type, F&& f) {
  if (type == at::kFloat) {
    f(float{});
  } else if (type == at::kBFloat16) {
    f(at::BFloat16{});
  } else {
    TORCH_CHECK(false, "foam::step_ supports float32 and bfloat16 tensors, got ", type);
  }
}

// geometry: (rows, cols, fold axis, block) per matrix; bias_corrections: (bc1, bc2) per matrix;
// scalars: beta1, beta2, rho, rho_sq, eps, step_size, decay.
void step_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
           at::TensorList exp_avg_sqs, at::IntArrayRef geometry,
           at::ArrayRef<double> bias_corrections, at::ArrayRef<double> scalars,
           bool mean_of_squares) {
  const size_t n = params.size();
  TORCH_CHECK(grads.size() == n && exp_avgs.size() == n && exp_avg_sqs.size() == n &&
                  geometry.size() == 4 * n && bias_corrections.size() == 2 * n &&
                  scalars.size() == 7,
              "foam::step_: argument lengths do not match");
  const Scalars s{static_cast<float>(scalars[0]), static_cast<float>(scalars[1]),
                  static_cast<float>(scalars[2]), static_cast<float>(scalars[3]),
                  static_cast<float>(scalars[4]), static_cast<float>(scalars[5]),
                  static_cast<float>(scalars[6]), mean_of_squares};
  for (size_t k = 0; k < n; ++k) {
    const at::Tensor &p = params[k], &g = grads[k], &m = exp_avgs[k], &v = exp_avg_sqs[k];
    TORCH_CHECK(p.is_contiguous() && g.is_contiguous() && m.is_contiguous() &&
                    v.is_contiguous() && m.scalar_type() == v.scalar_type(),
                "foam::step_ needs contiguous tensors and same-dtype states");
    const int64_t rows = geometry[4 * k], cols = geometry[4 * k + 1];
    const int64_t axis = geometry[4 * k + 2], block = geometry[4 * k + 3];
    const float bc1 = static_cast<float>(bias_corrections[2 * k]);
    const float bc2 = static_cast<float>(bias_corrections[2 * k + 1]);
    with_type(p.scalar_type(), [&](auto p_tag) {
      with_type(g.scalar_type(), [&](auto g_tag) {
        with_type(m.scalar_type(), [&](auto s_tag) {
          using P = decltype(p_tag);
          using G = decltype(g_tag);
          using S = decltype(s_tag);
          auto* pp = p.data_ptr<P>();
          const auto* gp = g.data_ptr<G>();
          auto* mp = m.data_ptr<S>();
          auto* vp = v.data_ptr<S>();
          if (axis == 1) {
            step_along_cols_any(pp, gp, mp, vp, rows, cols, block, s, bc1, bc2);
          } else if (block <= kShortBlock) {
            step_along_short_rows(pp, gp, mp, vp, rows, cols, block, s, bc1, bc2);
          } else {
            step_along_rows(pp, gp, mp, vp, rows, cols, block, s, bc1, bc2);
          }
        });
      });
    });
  }
}

// The float32 entries of one vector the step was compiled for (4 NEON, 8 AVX2 or portable):
// what the benchmark reports and the tests size their widths and tails by.
int64_t vector_width() { return kW; }

}  // namespace

TORCH_LIBRARY(foam, lib) {
  lib.def(
      "step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
      "Tensor(c!)[] exp_avg_sqs, int[] geometry, float[] bias_corrections, float[] scalars, "
      "bool mean_of_squares) -> ()");
  lib.def("vector_width() -> int", &vector_width);
}

TORCH_LIBRARY_IMPL(foam, CPU, lib) { lib.impl("step_", &step_); }
