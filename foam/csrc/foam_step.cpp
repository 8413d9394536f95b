// One fused FOAM step for a list of folded matrices on the CPU (FOAM_SPEC section 2).
//
// The eager step in foam/update.py makes about ten full-size passes per matrix (fold, two
// EMAs, residual, square, sqrt, divide, update) through full-size temporaries. Here each matrix
// is read once for the fold and once for the update, from a cache-sized slice, and the folded
// states are updated in the same pass: per element the step reads the gradient and the parameter
// and writes the parameter, which is less memory traffic than fused AdamW's. Arithmetic is float32;
// parameters, gradients and states may each be float32 or bfloat16 (rounded to nearest even).
//
// The loops run on explicit vectors of the machine's width, ATen's at::vec::Vectorized<float>
// (what torch's own fused AdamW uses), so no compiler's auto-vectoriser decides how fast the step
// is. ATen picks a vector's instruction set from CPU_CAPABILITY_* macros, which torch's build sets
// per kernel file and an extension does not: they are set below from what the compiler targets
// (-march=native, foam/fused.py), and the vectors live in a namespace of their own so that no
// symbol collides with libtorch's copies. Without AVX2/AVX-512 (an ARM CPU takes NEON by itself)
// the vectors are ATen's portable ones.
//
// Every per-step number (bias corrections, step size, decay, residual scales) is an argument, so
// the Python side decides the semantics and this file only does the arithmetic.

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512VL__) && defined(__FMA__)
#define CPU_CAPABILITY_AVX512
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
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
inline void store1(at::BFloat16* x, Vec a) { at::vec::convert_float_bfloat16(a, a).store(x, kW); }

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
    return std::get<0>(at::vec::convert_bfloat16_float(at::vec::convert_float_bfloat16(x, x)));
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
template <bool kMeanOfSquares, typename S>
inline void chunk_moments(const Vec* sum, const Vec* sum_sq, S* m, S* v, int64_t k,
                          const MomentScalars& c, Vec* mean, Vec* m_hat, Vec* v_hat) {
  Vec m_old[2], v_old[2], m_new[2], v_new[2];
  load2(m, k, m_old[0], m_old[1]);
  load2(v, k, v_old[0], v_old[1]);
  for (int h = 0; h < 2; ++h) {
    mean[h] = c.exact ? sum[h] * c.inv_count : sum[h] / c.count;
    m_new[h] = m_old[h] + c.w1 * (mean[h] - m_old[h]);
    if constexpr (kMeanOfSquares) {
      const Vec mean_sq = c.exact ? sum_sq[h] * c.inv_count : sum_sq[h] / c.count;
      v_new[h] = v_old[h] + c.w2 * (mean_sq - v_old[h]);
    } else {
      v_new[h] = v_old[h] * c.beta2 + c.w2 * mean[h] * mean[h];
    }
    m_hat[h] = m_new[h] * c.inv_c1;
    v_hat[h] = v_new[h] * c.inv_c2;
  }
  store2(m, k, m_new[0], m_new[1]);
  store2(v, k, v_new[0], v_new[1]);
}

// chunk_moments over n blocks of len entries, their sums and block values in arrays of n.
template <bool kMeanOfSquares, typename S>
FOAM_FLATTEN void update_moments(const float* sum, const float* sum_sq, int64_t n, int64_t len,
                                 S* m, S* v, const Scalars& s, float bc1, float bc2, float* mean,
                                 float* m_hat, float* v_hat) {
  const MomentScalars c(s, len, bc1, bc2);
  for (int64_t b = 0; b < n; b += kChunk) {
    const int64_t k = std::min(kChunk, n - b);
    Vec mu[2], sq[2], mv[2], mh[2], vh[2];
    load2(sum + b, k, mu[0], mu[1]);
    if constexpr (kMeanOfSquares) load2(sum_sq + b, k, sq[0], sq[1]);
    chunk_moments<kMeanOfSquares>(mu, sq, m + b, v + b, k, c, mv, mh, vh);
    store2(mean + b, k, mv[0], mv[1]);
    store2(m_hat + b, k, mh[0], mh[1]);
    store2(v_hat + b, k, vh[0], vh[1]);
  }
}

// Sum (and with kSquares the sum of squares) of the n entries of one block of any length:
// chunks, then one vector, then a partial one, so that a block of one vector is one load.
template <bool kSquares, typename G>
FOAM_FLATTEN inline void block_sum(const G* g, int64_t n, float* sum, float* sum_sq) {
  Vec acc[2] = {Vec(0.0f), Vec(0.0f)}, acc_sq[2] = {Vec(0.0f), Vec(0.0f)};
  const auto add = [&](int h, Vec x) {
    acc[h] = acc[h] + x;
    if constexpr (kSquares) acc_sq[h] = acc_sq[h] + x * x;
  };
  int64_t j = 0;
  for (; j + kChunk <= n; j += kChunk) {
    Vec x[2];
    load2(g + j, x[0], x[1]);
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

// The update of n contiguous entries whose block values are given per entry (arrays of n).
template <typename P, typename G, bool kDecay>
FOAM_FLATTEN inline void apply_update(P* p, const G* g, const float* mean, const float* m_hat,
                         const float* v_hat, int64_t n, const UpdateScalars& s) {
  for (int64_t j = 0; j < n; j += kChunk) {
    const int64_t k = std::min(kChunk, n - j);
    Vec pv[2], gv[2], mv[2], mh[2], vh[2];
    if (k == kChunk) {
      load2(p + j, pv[0], pv[1]);
      load2(g + j, gv[0], gv[1]);
      load2(mean + j, mv[0], mv[1]);
      load2(m_hat + j, mh[0], mh[1]);
      load2(v_hat + j, vh[0], vh[1]);
    } else {
      load2(p + j, k, pv[0], pv[1]);
      load2(g + j, k, gv[0], gv[1]);
      load2(mean + j, k, mv[0], mv[1]);
      load2(m_hat + j, k, mh[0], mh[1]);
      load2(v_hat + j, k, vh[0], vh[1]);
    }
    for (int h = 0; h < 2; ++h) pv[h] = updated<P, kDecay>(pv[h], gv[h], mv[h], mh[h], vh[h], s);
    if (k == kChunk) {
      store2(p + j, pv[0], pv[1]);
    } else {
      store2(p + j, k, pv[0], pv[1]);
    }
  }
}

// The update of the n entries of one block, its values broadcast: chunks, then one vector, then
// a partial one (as block_sum).
template <typename P, typename G, bool kDecay>
FOAM_FLATTEN inline void apply_block(P* p, const G* g, float mean, float m_hat, float v_hat,
                                     int64_t n, const UpdateScalars& s) {
  const Vec mv(mean), mh(m_hat), vh(v_hat);
  int64_t j = 0;
  for (; j + kChunk <= n; j += kChunk) {
    Vec pv[2], gv[2];
    load2(p + j, pv[0], pv[1]);
    load2(g + j, gv[0], gv[1]);
    for (int h = 0; h < 2; ++h) pv[h] = updated<P, kDecay>(pv[h], gv[h], mv, mh, vh, s);
    store2(p + j, pv[0], pv[1]);
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

// The sums of kW blocks of K entries from the K vectors of their consecutive entries (which it
// overwrites): pairs of vectors are de-interleaved and added, which sums neighbouring entries
// and keeps their order, until one entry per block is left.
template <int64_t K>
inline Vec block_totals(Vec* x) {
#pragma GCC unroll 4
  for (int64_t n = K; n > 1; n /= 2) {
#pragma GCC unroll 8
    for (int64_t t = 0; t < n / 2; ++t) {
      const auto [even, odd] = at::vec::deinterleave2(x[2 * t], x[2 * t + 1]);
      x[t] = even + odd;
    }
  }
  return x[0];
}

// The vector of the entries of kW / K consecutive blocks of K entries, from their values: each
// value broadcast and blended in over the lanes from its block's first entry on (no
// lane-crossing shuffle, which costs several cycles on some CPUs).
template <int64_t K, int64_t J = 1>
inline Vec spread(const float* values, Vec acc) {
  if constexpr (J * K >= kW) {
    return acc;
  } else {
    constexpr int64_t mask = ((int64_t{1} << kW) - 1) & ~((int64_t{1} << (J * K)) - 1);
    return spread<K, J + 1>(values, Vec::template blend<mask>(acc, Vec(values[J])));
  }
}

// The K vectors of the entries of kW blocks of K entries, from their values.
template <int64_t K>
inline std::array<Vec, K> entries_of(const float* values) {
  constexpr int64_t kBlocks = kW / K;  // blocks per vector
  std::array<Vec, K> y;
  for (int64_t t = 0; t < K; ++t) y[t] = spread<K>(values + t * kBlocks, Vec(values[t * kBlocks]));
  return y;
}

// Sums (and sums of squares) of the `groups` groups of kW blocks of a compile-time K <= kW
// entries that start g: each group is K vectors.
template <int64_t K, bool kSquares, typename G>
FOAM_FLATTEN inline void group_sums(const G* g, int64_t groups, float* sum, float* sum_sq) {
  for (int64_t q = 0; q < groups; ++q) {
    Vec x[K], x_sq[K];
    for (int64_t t = 0; t < K / 2; ++t) load2(g + q * K * kW + t * kChunk, x[2 * t], x[2 * t + 1]);
    if constexpr (kSquares) {
      for (int64_t t = 0; t < K; ++t) x_sq[t] = x[t] * x[t];
      block_totals<K>(x_sq).store(sum_sq + q * kW);
    }
    block_totals<K>(x).store(sum + q * kW);
  }
}

// The update of `groups` groups of kW blocks of a compile-time K <= kW entries (see group_sums).
template <int64_t K, typename P, typename G, bool kDecay>
FOAM_FLATTEN inline void group_update(P* p, const G* g, const float* mean, const float* m_hat,
                         const float* v_hat, int64_t groups, const UpdateScalars& s) {
  for (int64_t q = 0; q < groups; ++q) {
    const auto mv = entries_of<K>(mean + q * kW);
    const auto mh = entries_of<K>(m_hat + q * kW);
    const auto vh = entries_of<K>(v_hat + q * kW);
    for (int64_t t = 0; t < K / 2; ++t) {
      const int64_t at = q * K * kW + t * kChunk;
      Vec pv[2], gv[2];
      load2(p + at, pv[0], pv[1]);
      load2(g + at, gv[0], gv[1]);
      for (int h = 0; h < 2; ++h) {
        const int64_t i = 2 * t + h;
        pv[h] = updated<P, kDecay>(pv[h], gv[h], mv[i], mh[i], vh[i], s);
      }
      store2(p + at, pv[0], pv[1]);
    }
  }
}

// Fold along the columns: blocks of `block` consecutive entries of a row, the last one possibly
// shorter. K > 0 is a block size up to the vector width, known at compile time: kW blocks at a
// time are then summed and updated as K vectors (group_sums, group_update); K = 0 takes each
// block on its own, whole vectors of it at a time.
template <int64_t K, typename P, typename G, typename S>
void step_along_cols(P* p, const G* g, S* m, S* v, int64_t rows, int64_t cols, int64_t block,
                     const Scalars& s, float bc1, float bc2) {
  const int64_t full = cols / block, tail = cols - full * block, nb = full + (tail > 0);
  const int64_t groups = K > 0 ? full / kW : 0, grouped = groups * kW;
  const int64_t grain = std::max<int64_t>(1, 32768 / cols);
  const UpdateScalars us(s);
  with_flags(s, [&](auto decays, auto squares) {
    constexpr bool kDecay = decltype(decays)::value, kSquares = decltype(squares)::value;
    at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      std::vector<float> sum(nb), sum_sq(nb), mean(nb), m_hat(nb), v_hat(nb);
      for (int64_t r = begin; r < end; ++r) {
        const G* g_row = g + r * cols;
        P* p_row = p + r * cols;
        S *m_row = m + r * nb, *v_row = v + r * nb;
        if constexpr (K > 0) group_sums<K, kSquares>(g_row, groups, sum.data(), sum_sq.data());
        for (int64_t b = grouped; b < nb; ++b) {
          block_sum<kSquares>(g_row + b * block, std::min(block, cols - b * block), &sum[b],
                              &sum_sq[b]);
        }
        update_moments<kSquares>(sum.data(), sum_sq.data(), full, block, m_row, v_row, s, bc1,
                                 bc2, mean.data(), m_hat.data(), v_hat.data());
        if (tail) {
          update_moments<kSquares>(&sum[full], &sum_sq[full], 1, tail, m_row + full,
                                   v_row + full, s, bc1, bc2, &mean[full], &m_hat[full],
                                   &v_hat[full]);
        }
        if constexpr (K > 0) {
          group_update<K, P, G, kDecay>(p_row, g_row, mean.data(), m_hat.data(), v_hat.data(),
                                        groups, us);
        }
        for (int64_t b = grouped; b < nb; ++b) {
          const int64_t at = b * block;
          apply_block<P, G, kDecay>(p_row + at, g_row + at, mean[b], m_hat[b], v_hat[b],
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
template <bool kDecay, bool kSquares, typename P, typename G, typename S>
FOAM_FLATTEN void short_rows_block(P* p, const G* g, S* m, S* v, int64_t len, int64_t cols,
                                   int64_t len_next, const MomentScalars& c,
                                   const UpdateScalars& us) {
  for (int64_t j = 0; j < cols; j += kChunk) {
    const int64_t k = std::min(kChunk, cols - j);
    for (int64_t i = len; i < len + len_next; ++i) {
      __builtin_prefetch(g + i * cols + j);
      __builtin_prefetch(p + i * cols + j);
    }
    Vec sum[2], sum_sq[2], x[2], mean[2], m_hat[2], v_hat[2];
    load2(g + j, k, sum[0], sum[1]);
    if constexpr (kSquares) {
      for (int h = 0; h < 2; ++h) sum_sq[h] = sum[h] * sum[h];
    }
    for (int64_t i = 1; i < len; ++i) {
      load2(g + i * cols + j, k, x[0], x[1]);
      for (int h = 0; h < 2; ++h) {
        sum[h] = sum[h] + x[h];
        if constexpr (kSquares) sum_sq[h] = sum_sq[h] + x[h] * x[h];
      }
    }
    chunk_moments<kSquares>(sum, sum_sq, m + j, v + j, k, c, mean, m_hat, v_hat);
    for (int64_t i = 0; i < len; ++i) {
      Vec pv[2], gv[2];
      load2(p + i * cols + j, k, pv[0], pv[1]);
      load2(g + i * cols + j, k, gv[0], gv[1]);
      for (int h = 0; h < 2; ++h) {
        pv[h] = updated<P, kDecay>(pv[h], gv[h], mean[h], m_hat[h], v_hat[h], us);
      }
      store2(p + i * cols + j, k, pv[0], pv[1]);
    }
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
// per block and column.
// Work items are (block, slice of columns), so FOAM-Mini (one block) still runs in parallel.
// Slices are 512 columns: narrower ones, sized for a core's cache between the fold and the
// update, made FOAM-Mini over LLaMA-60M's 1376 rows slower, not faster (short strided rows).
template <typename P, typename G, typename S>
void step_along_rows(P* p, const G* g, S* m, S* v, int64_t rows, int64_t cols, int64_t block,
                     const Scalars& s, float bc1, float bc2) {
  constexpr int64_t slice = 512;
  static_assert(slice % kChunk == 0, "slices are whole chunks");
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
        std::fill_n(sum.data(), width, 0.0f);
        std::fill_n(sum_sq.data(), width, 0.0f);
        for (int64_t i = 0; i < len; ++i) {
          const G* g_row = g + (r0 + i) * cols + c0;
          prefetch(p + (r0 + i) * cols + c0, width);
          for (int64_t j = 0; j < width; j += kChunk) {
            const int64_t k = std::min(kChunk, width - j);
            Vec x[2], acc[2], acc_sq[2];
            if (k == kChunk) {
              load2(g_row + j, x[0], x[1]);
            } else {
              load2(g_row + j, k, x[0], x[1]);
            }
            load2(sum.data() + j, acc[0], acc[1]);
            store2(sum.data() + j, acc[0] + x[0], acc[1] + x[1]);
            if constexpr (kSquares) {
              load2(sum_sq.data() + j, acc_sq[0], acc_sq[1]);
              store2(sum_sq.data() + j, acc_sq[0] + x[0] * x[0], acc_sq[1] + x[1] * x[1]);
            }
          }
        }
        const int64_t at = b * cols + c0;
        update_moments<kSquares>(sum.data(), sum_sq.data(), width, len, m + at, v + at, s, bc1,
                                 bc2, mean.data(), m_hat.data(), v_hat.data());
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

// The column fold with the block size a compile-time constant where it is at most the vector
// width (such blocks share a vector, or fill one).
template <typename P, typename G, typename S>
void step_along_cols_any(P* p, const G* g, S* m, S* v, int64_t rows, int64_t cols,
                         int64_t block, const Scalars& s, float bc1, float bc2) {
  const auto as = [&](auto size) {
    constexpr int64_t K = decltype(size)::value;
    step_along_cols<K <= kW ? K : 0>(p, g, m, v, rows, cols, block, s, bc1, bc2);
  };
  switch (block) {
    case 2: return as(std::integral_constant<int64_t, 2>{});
    case 4: return as(std::integral_constant<int64_t, 4>{});
    case 8: return as(std::integral_constant<int64_t, 8>{});
    case 16: return as(std::integral_constant<int64_t, 16>{});
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

// The float32 entries of one vector the step was compiled for (4 NEON/SSE, 8 AVX2, 16 AVX-512):
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
