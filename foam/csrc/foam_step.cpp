// One fused FOAM step for a list of folded matrices on the CPU (FOAM_SPEC section 2).
//
// The eager step in foam/update.py makes about ten full-size passes per matrix (fold, two
// EMAs, residual, square, sqrt, divide, update) through full-size temporaries. Here each matrix
// is read once for the fold and once for the update, from a cache-sized slice, and the folded
// states are updated in the same pass: per element the step reads the gradient and the parameter
// and writes the parameter, which is less memory traffic than fused AdamW's. Arithmetic is float32;
// parameters, gradients and states may each be float32 or bfloat16 (rounded to nearest even).
//
// Every per-step number (bias corrections, step size, decay, residual scales) is an argument, so
// the Python side decides the semantics and this file only does the arithmetic.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

inline float to_float(float x) { return x; }

inline float from_bits(uint32_t bits) {
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

inline float to_float(at::BFloat16 x) { return from_bits(static_cast<uint32_t>(x.x) << 16); }

// The bfloat16 bits of x (in the low half), rounded to nearest even; NaN stays NaN.
inline uint32_t bf16_bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t nan = 0u - static_cast<uint32_t>(x != x);  // all ones for NaN, without a branch
  return (rounded & ~nan) | (0x7FC0u & nan);
}

inline void store(float* dst, float x) { *dst = x; }

inline void store(at::BFloat16* dst, float x) { dst->x = static_cast<uint16_t>(bf16_bits(x)); }

// Two consecutive bfloat16 entries as one 32-bit word (the first in the low half). GCC vectorises
// the block loops' interleaved accesses for 32-bit entries only, and a pair widens to two float32
// with one shift and one mask, so bfloat16 rows are read and written as pairs.
typedef uint32_t __attribute__((may_alias, aligned(2))) bf16_pair;

inline float first_of(uint32_t pair) { return from_bits(pair << 16); }
inline float second_of(uint32_t pair) { return from_bits(pair & 0xFFFF0000u); }
inline uint32_t pair_of(float first, float second) {
  return bf16_bits(first) | (bf16_bits(second) << 16);
}

// x rounded to T and back: the eager step decays the parameter in its own dtype before the
// update, and this keeps bfloat16 results equal to it.
template <typename T>
inline float rounded_to(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return from_bits(bf16_bits(x) << 16);
  }
}

// The scalars of one step, shared by every matrix of a call.
struct Scalars {
  float beta1, beta2, rho, rho_sq, eps, step_size, decay;
  bool mean_of_squares;
};

// Updates n folded moments from their blocks' gradient sums and sums of squares (blocks of len
// entries), with the formulas of torch's lerp_ and mul_/addcmul_ (foam/numerics.py ema_).
// Writes each block's mean gradient and bias-corrected moments. The second moment's source is a
// template parameter: a branch inside the loop keeps GCC from vectorising it for bfloat16 states.
template <bool kMeanOfSquares, typename S>
inline void update_moments_with(const float* sum, const float* sum_sq, int64_t n, int64_t len,
                                S* m, S* v, const Scalars& s, float bc1, float bc2, float* mean,
                                float* m_hat, float* v_hat) {
  const float beta2 = s.beta2, w1 = 1.0f - s.beta1, w2 = 1.0f - s.beta2;
  const float count = static_cast<float>(len);
#pragma omp simd
  for (int64_t b = 0; b < n; ++b) {
    const float mu = sum[b] / count;
    const float m_old = to_float(m[b]), v_old = to_float(v[b]);
    const float m_new = m_old + w1 * (mu - m_old);
    const float v_new = kMeanOfSquares ? v_old + w2 * (sum_sq[b] / count - v_old)
                                       : v_old * beta2 + w2 * mu * mu;
    store(m + b, m_new);
    store(v + b, v_new);
    mean[b] = mu;
    m_hat[b] = m_new / bc1;
    v_hat[b] = v_new / bc2;
  }
}

template <typename S>
inline void update_moments(const float* sum, const float* sum_sq, int64_t n, int64_t len, S* m,
                           S* v, const Scalars& s, float bc1, float bc2, float* mean,
                           float* m_hat, float* v_hat) {
  if (s.mean_of_squares) {
    update_moments_with<true>(sum, sum_sq, n, len, m, v, s, bc1, bc2, mean, m_hat, v_hat);
  } else {
    update_moments_with<false>(sum, sum_sq, n, len, m, v, s, bc1, bc2, mean, m_hat, v_hat);
  }
}

// The updated parameter: round(p * decay) - step_size * (m_hat + rho R) / (sqrt(v_hat + rho_sq
// R^2) + eps), R = g - mean; R is the parameter's dtype, to which the decayed value is rounded
// as the eager step does. kDecay = false is decay 1 (no weight decay, the default), where
// p * decay is p itself: skipping that product and its rounding changes no bit.
template <typename R, bool kDecay>
inline float updated(float p, float g, float mean, float m_hat, float v_hat, const Scalars& s) {
  const float r = g - mean;
  const float num = m_hat + s.rho * r;
  const float den = std::sqrt(v_hat + s.rho_sq * r * r) + s.eps;
  const float decayed = kDecay ? rounded_to<R>(p * s.decay) : p;
  return decayed - s.step_size * (num / den);
}

// `body` instantiated for the step's weight decay (see `updated`): a branch outside the loops.
template <typename F>
inline void with_decay(const Scalars& s, F&& body) {
  if (s.decay == 1.0f) {
    body(std::false_type{});
  } else {
    body(std::true_type{});
  }
}

// The update over n contiguous entries whose block values are given per entry.
template <typename P, typename G>
inline void apply_update(P* p, const G* g, const float* mean, const float* m_hat,
                         const float* v_hat, int64_t n, const Scalars& s) {
  with_decay(s, [&](auto decays) {
    constexpr bool kDecay = decltype(decays)::value;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
      const float x = updated<P, kDecay>(to_float(p[j]), to_float(g[j]), mean[j], m_hat[j],
                                         v_hat[j], s);
      store(p + j, x);
    }
  });
}

// The update over n full blocks of a compile-time K entries, block values given per block: the
// block loop vectorises with interleaved loads, so nothing is expanded. The entries are float32
// (mixed-dtype rows are widened first, see step_along_cols); R is the parameter's own dtype.
// The scalars are a copy (here and in apply_update_pairs): a store to p could otherwise change
// them, and reloading them each iteration stops the block loop from vectorising.
template <int64_t K, typename R>
inline void apply_update_blocks(float* p, const float* g, const float* mean, const float* m_hat,
                                const float* v_hat, int64_t n, const Scalars s) {
  with_decay(s, [&](auto decays) {
    constexpr bool kDecay = decltype(decays)::value;
#pragma omp simd
    for (int64_t b = 0; b < n; ++b) {
      for (int64_t i = 0; i < K; ++i) {
        const int64_t j = b * K + i;
        p[j] = updated<R, kDecay>(p[j], g[j], mean[b], m_hat[b], v_hat[b], s);
      }
    }
  });
}

// apply_update_blocks for bfloat16 parameters and gradients, read and written as pairs.
template <int64_t K>
inline void apply_update_pairs(bf16_pair* p, const bf16_pair* g, const float* mean,
                               const float* m_hat, const float* v_hat, int64_t n,
                               const Scalars s) {
  using R = at::BFloat16;
  with_decay(s, [&](auto decays) {
    constexpr bool kDecay = decltype(decays)::value;
#pragma omp simd
    for (int64_t b = 0; b < n; ++b) {
#pragma GCC unroll 16  // whole, so that the block loop vectorises
      for (int64_t i = 0; i < K / 2; ++i) {
        const int64_t j = b * (K / 2) + i;
        const uint32_t pw = p[j], gw = g[j];
        p[j] = pair_of(
            updated<R, kDecay>(first_of(pw), first_of(gw), mean[b], m_hat[b], v_hat[b], s),
            updated<R, kDecay>(second_of(pw), second_of(gw), mean[b], m_hat[b], v_hat[b], s));
      }
    }
  });
}

// Sum and sum of squares of n blocks of a compile-time K bfloat16 entries, read as pairs.
template <int64_t K>
inline void block_sums_pairs(const bf16_pair* g, int64_t n, float* sum, float* sum_sq) {
#pragma omp simd
  for (int64_t b = 0; b < n; ++b) {
    float acc = 0.0f, acc_sq = 0.0f;
#pragma GCC unroll 16
    for (int64_t i = 0; i < K / 2; ++i) {
      const uint32_t w = g[b * (K / 2) + i];
      const float x0 = first_of(w), x1 = second_of(w);
      acc += x0;
      acc += x1;
      acc_sq += x0 * x0;
      acc_sq += x1 * x1;
    }
    sum[b] = acc;
    sum_sq[b] = acc_sq;
  }
}

// n entries of x as float32: x itself, or a copy widened into `buffer`.
inline const float* as_float(const float* x, int64_t, float*) { return x; }
inline float* as_float(float* x, int64_t, float*) { return x; }

inline float* as_float(const at::BFloat16* x, int64_t n, float* buffer) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) buffer[j] = to_float(x[j]);
  return buffer;
}

// Sum and sum of squares of n blocks of `block` consecutive entries of g. K > 0 is the block size
// known at compile time (small blocks: the block loop vectorises across blocks); K = 0 reads it
// from `block` (large blocks: each block's reduction vectorises).
template <int64_t K, typename G>
inline void block_sums(const G* g, int64_t n, int64_t block, float* sum, float* sum_sq) {
  if constexpr (K > 0) {
#pragma omp simd
    for (int64_t b = 0; b < n; ++b) {
      float acc = 0.0f, acc_sq = 0.0f;
      for (int64_t i = 0; i < K; ++i) {
        const float x = to_float(g[b * K + i]);
        acc += x;
        acc_sq += x * x;
      }
      sum[b] = acc;
      sum_sq[b] = acc_sq;
    }
  } else {
    for (int64_t b = 0; b < n; ++b) {
      float acc = 0.0f, acc_sq = 0.0f;
#pragma omp simd reduction(+ : acc, acc_sq)
      for (int64_t i = 0; i < block; ++i) {
        const float x = to_float(g[b * block + i]);
        acc += x;
        acc_sq += x * x;
      }
      sum[b] = acc;
      sum_sq[b] = acc_sq;
    }
  }
}

// Each block's value repeated over its entries (E of FOAM_SPEC section 1), into `out`.
inline void expand(const float* values, int64_t n, int64_t block, float* out) {
  for (int64_t b = 0; b < n; ++b) {
#pragma omp simd
    for (int64_t i = 0; i < block; ++i) out[b * block + i] = values[b];
  }
}

// Fold along the columns: blocks of `block` consecutive entries of a row, the last one possibly
// shorter. K > 0 is the block size known at compile time: the block loops then vectorise with
// interleaved loads, which GCC does only for 32-bit entries, so bfloat16 rows are read as pairs
// (mixed-dtype rows go through float32 copies of themselves, in cache). K = 0 expands the block
// values over the row instead.
template <int64_t K, typename P, typename G, typename S>
void step_along_cols(P* p, const G* g, S* m, S* v, int64_t rows, int64_t cols, int64_t block,
                     const Scalars& s, float bc1, float bc2) {
  const int64_t full = cols / block, tail = cols - full * block, nb = full + (tail > 0);
  const int64_t grain = std::max<int64_t>(1, 32768 / cols);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> sum(nb), sum_sq(nb), mean(nb), m_hat(nb), v_hat(nb);
    std::vector<float> mean_e(cols), m_hat_e(cols), v_hat_e(cols), g_wide(cols), p_wide(cols);
    for (int64_t r = begin; r < end; ++r) {
      const G* g_row = g + r * cols;
      P* p_row = p + r * cols;
      S *m_row = m + r * nb, *v_row = v + r * nb;
      if constexpr (K > 0 && std::is_same_v<P, at::BFloat16> && std::is_same_v<G, P>) {
        auto* p_pairs = reinterpret_cast<bf16_pair*>(p_row);
        const auto* g_pairs = reinterpret_cast<const bf16_pair*>(g_row);
        block_sums_pairs<K>(g_pairs, full, sum.data(), sum_sq.data());
        update_moments(sum.data(), sum_sq.data(), full, K, m_row, v_row, s, bc1, bc2, mean.data(),
                       m_hat.data(), v_hat.data());
        apply_update_pairs<K>(p_pairs, g_pairs, mean.data(), m_hat.data(), v_hat.data(), full, s);
      } else if constexpr (K > 0) {
        const float* g_full = as_float(g_row, full * K, g_wide.data());
        float* p_full = as_float(p_row, full * K, p_wide.data());
        block_sums<K>(g_full, full, K, sum.data(), sum_sq.data());
        update_moments(sum.data(), sum_sq.data(), full, K, m_row, v_row, s, bc1, bc2, mean.data(),
                       m_hat.data(), v_hat.data());
        apply_update_blocks<K, P>(p_full, g_full, mean.data(), m_hat.data(), v_hat.data(), full,
                                  s);
        if constexpr (!std::is_same_v<P, float>) {
#pragma omp simd
          for (int64_t j = 0; j < full * K; ++j) store(p_row + j, p_full[j]);
        }
      } else {
        block_sums<0>(g_row, full, block, sum.data(), sum_sq.data());
        update_moments(sum.data(), sum_sq.data(), full, block, m_row, v_row, s, bc1, bc2,
                       mean.data(), m_hat.data(), v_hat.data());
        expand(mean.data(), full, block, mean_e.data());
        expand(m_hat.data(), full, block, m_hat_e.data());
        expand(v_hat.data(), full, block, v_hat_e.data());
        apply_update(p_row, g_row, mean_e.data(), m_hat_e.data(), v_hat_e.data(), full * block,
                     s);
      }
      if (tail) {
        const int64_t at = full * block;
        block_sums<0>(g_row + at, 1, tail, &sum[full], &sum_sq[full]);
        update_moments(&sum[full], &sum_sq[full], 1, tail, m_row + full, v_row + full, s, bc1,
                       bc2, &mean[full], &m_hat[full], &v_hat[full]);
        std::fill_n(mean_e.data(), tail, mean[full]);
        std::fill_n(m_hat_e.data(), tail, m_hat[full]);
        std::fill_n(v_hat_e.data(), tail, v_hat[full]);
        apply_update(p_row + at, g_row + at, mean_e.data(), m_hat_e.data(), v_hat_e.data(), tail,
                     s);
      }
    }
  });
}

// Fold along the rows: blocks of `block` consecutive rows, one value per block and column.
// Work items are (block, slice of columns), so FOAM-Mini (one block) still runs in parallel.
template <typename P, typename G, typename S>
void step_along_rows(P* p, const G* g, S* m, S* v, int64_t rows, int64_t cols, int64_t block,
                     const Scalars& s, float bc1, float bc2) {
  constexpr int64_t kSlice = 512;
  const int64_t nb = (rows + block - 1) / block;
  const int64_t slices = (cols + kSlice - 1) / kSlice;
  at::parallel_for(0, nb * slices, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> sum(kSlice), sum_sq(kSlice), mean(kSlice), m_hat(kSlice), v_hat(kSlice);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / slices, c0 = (item % slices) * kSlice;
      const int64_t width = std::min(kSlice, cols - c0);
      const int64_t r0 = b * block, len = std::min(block, rows - r0);
      std::fill_n(sum.data(), width, 0.0f);
      std::fill_n(sum_sq.data(), width, 0.0f);
      for (int64_t i = 0; i < len; ++i) {
        const G* g_row = g + (r0 + i) * cols + c0;
#pragma omp simd
        for (int64_t j = 0; j < width; ++j) {
          const float x = to_float(g_row[j]);
          sum[j] += x;
          sum_sq[j] += x * x;
        }
      }
      const int64_t at = b * cols + c0;
      update_moments(sum.data(), sum_sq.data(), width, len, m + at, v + at, s, bc1, bc2,
                     mean.data(), m_hat.data(), v_hat.data());
      for (int64_t i = 0; i < len; ++i) {
        const int64_t offset = (r0 + i) * cols + c0;
        apply_update(p + offset, g + offset, mean.data(), m_hat.data(), v_hat.data(), width, s);
      }
    }
  });
}

// The column fold with the block size a compile-time constant where it is small.
template <typename P, typename G, typename S>
void step_along_cols_any(P* p, const G* g, S* m, S* v, int64_t rows, int64_t cols,
                         int64_t block, const Scalars& s, float bc1, float bc2) {
  switch (block) {
    case 2: return step_along_cols<2>(p, g, m, v, rows, cols, block, s, bc1, bc2);
    case 4: return step_along_cols<4>(p, g, m, v, rows, cols, block, s, bc1, bc2);
    case 8: return step_along_cols<8>(p, g, m, v, rows, cols, block, s, bc1, bc2);
    case 16: return step_along_cols<16>(p, g, m, v, rows, cols, block, s, bc1, bc2);
    default: return step_along_cols<0>(p, g, m, v, rows, cols, block, s, bc1, bc2);
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
          } else {
            step_along_rows(pp, gp, mp, vp, rows, cols, block, s, bc1, bc2);
          }
        });
      });
    });
  }
}

}  // namespace

TORCH_LIBRARY(foam, lib) {
  lib.def(
      "step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
      "Tensor(c!)[] exp_avg_sqs, int[] geometry, float[] bias_corrections, float[] scalars, "
      "bool mean_of_squares) -> ()");
}

TORCH_LIBRARY_IMPL(foam, CPU, lib) { lib.impl("step_", &step_); }
