// Soft-capped attention, flash-style, forward and backward, on the CPU.
//
//   logit_ij = cap·tanh(s·q_i·k_j / cap) + mask_ij   (Gemma Team 2024, Gemma 2; s = 1/√d default)
//   out_i    = Σ_j softmax_j(logit_i) v_j
//
// The structure is PyTorch's CPU flash-attention kernel (aten/src/ATen/native/cpu/
// FlashAttentionKernel.cpp; Dao et al. 2022, arXiv 2205.14135): a (query tile × key tile) block
// of logits lives in per-thread scratch, never an (N, N) or (tile, N) buffer.
// * Forward: per (batch, head, query tile), over key tiles: u = (s/cap)·q·kᵀ (one GEMM, the
//   1/cap folded into its alpha), f = cap·tanh(u) + mask, online softmax (running max and sum,
//   Milakov & Gimelshein 2018, arXiv 1805.02867), acc += e·V (GEMM); saves lse = max + log Σ.
// * Backward: per (batch, head), over query tiles and key tiles, recomputes u and
//   p = exp(f − lse); with δ_i = dO_i·O_i and dP = dO·Vᵀ,
//   dZ = p ∘ (dP − δ) ∘ (1 − tanh²(u)), dQ += s·dZ·K, dK += s·dZᵀ·Q, dV += pᵀ·dO.
//   A thread owns whole heads, so dQ, dK, dV need no locks; under GQA every query head writes
//   its own dK/dV slice, summed over the group afterwards (the caller's at::sum).
// GEMMs go to the BLAS PyTorch links (sgemm_/dgemm_, MKL in the x86 wheels) when its symbols
// are present, else to at::addmm_out on views (any platform). Tails (N, S, D not multiples of the
// vector width or the tiles) use partial vector loads. float32 and float64.
//
// tanh (float32): Eigen's rational approximation (numerator degree 13, denominator degree 6,
// inputs clamped to ±7.9053; the coefficients of Eigen 3.4, also used by MLAS and MLIR).
// Relative error against float64 tanh ≤ 5 ulp wherever tanh(x) is a normal float (4.8 measured
// on 4 M points in [−10, 10] and log-spaced ones down to 1e−30; tested in
// tests/core/test_softcap_native.py). About 16 vector ops and one division: at B=4, H=8,
// N=1024, D=64 (1 thread) forward+backward took 1.01× SDPA's CPU time with it, 0.99× with no
// tanh at all, and 1.23× with at::vec's tanh (Sleef u10). float64 uses Sleef's tanh and exp
// (1 ulp); float32 uses exp_u20, as PyTorch's flash kernel does.
// The Tensor class and only the operators used (ATen's per-operator headers), with torch's
// pybind11 casters, not <torch/extension.h>: that one also pulls in every operator and the
// whole C++ frontend (torch::nn, torch::optim). Headers alone: 25 s -> 8 s of compile time.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/utils/pybind.h>

#include <ATen/Parallel.h>
#include <ATen/Dispatch.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

extern "C" {
// Fortran BLAS, exported by the BLAS PyTorch links. Weak: a PyTorch without them still loads
// this module, and gemm() below takes the ATen path.
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*,
            const float*, const int*, const float*, const int*, const float*, float*,
            const int*) __attribute__((weak));
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*,
            const double*, const int*, const double*, const int*, const double*, double*,
            const int*) __attribute__((weak));
}

#define ATTNSCALE_STR2(x) #x
#define ATTNSCALE_STR(x) ATTNSCALE_STR2(x)

namespace {

std::atomic<bool> g_use_blas{true};

template <typename T>
bool have_blas() {
  if constexpr (std::is_same_v<T, float>) {
    return sgemm_ != nullptr;
  } else {
    return dgemm_ != nullptr;
  }
}

// Row-major C (m×n, ldc) = alpha·op(A)·op(B) + beta·C with op(A) m×k, op(B) k×n; beta = 0
// ignores C's old contents (NaN included), as BLAS does.
template <typename T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (g_use_blas.load(std::memory_order_relaxed) && have_blas<T>()) {
    // A row-major matrix is its transpose in column-major order: Cᵀ = op(B)ᵀ·op(A)ᵀ.
    const char tra = tb ? 'T' : 'N', trb = ta ? 'T' : 'N';
    const int M = static_cast<int>(n), N = static_cast<int>(m), K = static_cast<int>(k);
    const int LA = static_cast<int>(ldb), LB = static_cast<int>(lda), LC = static_cast<int>(ldc);
    if constexpr (std::is_same_v<T, float>) {
      sgemm_(&tra, &trb, &M, &N, &K, &alpha, b, &LA, a, &LB, &beta, c, &LC);
    } else {
      dgemm_(&tra, &trb, &M, &N, &K, &alpha, b, &LA, a, &LB, &beta, c, &LC);
    }
    return;
  }
  const auto opts = at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value);
  auto view = [&](const T* p, int64_t rows, int64_t cols, int64_t ld, bool t) {
    auto x = at::from_blob(const_cast<T*>(p), {t ? cols : rows, t ? rows : cols}, {ld, 1}, opts);
    return t ? x.t() : x;
  };
  auto C = at::from_blob(c, {m, n}, {ldc, 1}, opts);
  at::addmm_out(C, C, view(a, m, k, lda, ta), view(b, k, n, ldb, tb), beta, alpha);
}

template <typename T>
struct Ops;

template <>
struct Ops<float> {
  using Vec = at::vec::Vectorized<float>;
  static Vec tanh(const Vec& x0) {
    const Vec x = at::vec::clamp(x0, Vec(-7.90531110763549805f), Vec(7.90531110763549805f));
    const Vec x2 = x * x;
    Vec p = at::vec::fmadd(x2, Vec(-2.76076847742355e-16f), Vec(2.00018790482477e-13f));
    p = at::vec::fmadd(x2, p, Vec(-8.60467152213735e-11f));
    p = at::vec::fmadd(x2, p, Vec(5.12229709037114e-08f));
    p = at::vec::fmadd(x2, p, Vec(1.48572235717979e-05f));
    p = at::vec::fmadd(x2, p, Vec(6.37261928875436e-04f));
    p = at::vec::fmadd(x2, p, Vec(4.89352455891786e-03f));
    Vec q = at::vec::fmadd(x2, Vec(1.19825839466702e-06f), Vec(1.18534705686654e-04f));
    q = at::vec::fmadd(x2, q, Vec(2.26843463243900e-03f));
    q = at::vec::fmadd(x2, q, Vec(4.89352518554385e-03f));
    return (p * x) / q;
  }
  static Vec exp(const Vec& x) { return x.exp_u20(); }
};

template <>
struct Ops<double> {
  using Vec = at::vec::Vectorized<double>;
  static Vec tanh(const Vec& x) { return x.tanh(); }
  static Vec exp(const Vec& x) { return x.exp(); }
};

enum MaskKind { kNoMask = 0, kBoolMask = 1, kAddMask = 2 };

// A mask broadcast to (B, H, N, S) by strides (0 on broadcast dimensions; the key stride 0 or 1).
struct Mask {
  MaskKind kind = kNoMask;
  const void* data = nullptr;
  int64_t sb = 0, sh = 0, sn = 0, ss = 0;
  template <typename M>
  const M* row(int64_t b, int64_t h, int64_t i, int64_t j0) const {
    return static_cast<const M*>(data) + b * sb + h * sh + i * sn + j0 * ss;
  }
};

Mask make_mask(const c10::optional<at::Tensor>& opt, at::ScalarType dtype, at::Tensor& keep) {
  Mask m;
  if (!opt.has_value() || !opt->defined()) return m;
  keep = *opt;
  TORCH_CHECK(keep.dim() == 4, "mask must be 4-d (B, H, N, S), broadcastable");
  TORCH_CHECK(keep.scalar_type() == at::kBool || keep.scalar_type() == dtype,
              "mask must be bool or have the query's dtype");
  if (keep.size(3) != 1 && keep.stride(3) != 1) keep = keep.contiguous();
  m.kind = keep.scalar_type() == at::kBool ? kBoolMask : kAddMask;
  m.data = keep.data_ptr();
  int64_t* st[4] = {&m.sb, &m.sh, &m.sn, &m.ss};
  for (int d = 0; d < 4; ++d) *st[d] = keep.size(d) == 1 ? 0 : keep.stride(d);
  return m;
}

// Runs body(j, w, tail) over [0, len) in steps of the vector width: full vectors with
// tail = std::false_type (plain loads and stores), then one partial vector of w < V lanes.
template <int64_t V, typename F>
inline void vec_loop(int64_t len, F&& body) {
  int64_t j = 0;
  for (; j + V <= len; j += V) body(j, V, std::false_type{});
  if (j < len) body(j, len - j, std::true_type{});
}

template <typename Vec, typename T, bool kTail>
inline Vec load(const T* p, int64_t w, std::integral_constant<bool, kTail>) {
  if constexpr (kTail) {
    return Vec::loadu(p, w);
  } else {
    return Vec::loadu(p);
  }
}

template <typename Vec, typename T, bool kTail>
inline void store(const Vec& x, T* p, int64_t w, std::integral_constant<bool, kTail>) {
  if constexpr (kTail) {
    x.store(p, w);
  } else {
    x.store(p);
  }
}

// f = cap·tanh(u) + mask on the first `len` entries of a row of `width`, −inf on the rest.
// Returns the row maximum.
template <typename T>
T cap_row(T* row, int64_t len, int64_t width, T cap, const Mask& mask, const void* mrow) {
  using Vec = at::vec::Vectorized<T>;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const Vec vc(cap), vneg(neg_inf);
  const T* add = mask.kind == kAddMask ? static_cast<const T*>(mrow) : nullptr;
  Vec vmax(neg_inf);
  vec_loop<Vec::size()>(len, [&](int64_t j, int64_t w, auto tail) {
    Vec f = Ops<T>::tanh(load<Vec>(row + j, w, tail)) * vc;
    if (add) f = f + (mask.ss ? load<Vec>(add + j, w, tail) : Vec(add[0]));
    if constexpr (decltype(tail)::value) f = Vec::set(vneg, f, w);
    vmax = at::vec::maximum(vmax, f);
    store(f, row + j, w, tail);
  });
  std::fill(row + std::max<int64_t>(len, 0), row + width, neg_inf);
  if (mask.kind == kBoolMask) {  // bytes to lanes is no cheaper than this scalar pass
    const bool* keep = static_cast<const bool*>(mrow);
    T mx = neg_inf;
    for (int64_t j = 0; j < len; ++j) {
      if (!keep[j * mask.ss]) row[j] = neg_inf;
      mx = std::max(mx, row[j]);
    }
    return mx;
  }
  return at::vec::vec_reduce_all<T>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, vmax);
}

// row ← exp(row − m); returns Σ row.
template <typename T>
T exp_row(T* row, int64_t width, T m) {
  using Vec = at::vec::Vectorized<T>;
  const Vec vm(m), zero(T(0));
  Vec acc(T(0));
  vec_loop<Vec::size()>(width, [&](int64_t j, int64_t w, auto tail) {
    Vec e = Ops<T>::exp(load<Vec>(row + j, w, tail) - vm);
    if constexpr (decltype(tail)::value) e = Vec::set(zero, e, w);
    acc = acc + e;
    store(e, row + j, w, tail);
  });
  return at::vec::vec_reduce_all<T>([](Vec& a, Vec& b) { return a + b; }, acc);
}

struct Dims {
  int64_t B, H, group, N, S, D, Dv, qsplit, kvsplit;
};

Dims dims_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t N = q.size(2), S = k.size(2);
  // PyTorch's flash kernel's tile sizes: 256/64/32 query rows by query length, 512 keys.
  const int64_t qsplit = N >= 768 ? 256 : (N >= 192 ? 64 : 32);
  return {q.size(0), q.size(1), q.size(1) / k.size(1), N, S, q.size(3), v.size(3),
          std::max<int64_t>(1, std::min(qsplit, N)),
          std::max<int64_t>(1, std::min<int64_t>(512, S))};
}

// Keys query row i may see within a key tile starting at n0 of kv columns (top-left causal).
inline int64_t visible(bool causal, int64_t i, int64_t n0, int64_t kv) {
  return causal ? std::clamp<int64_t>(i + 1 - n0, 0, kv) : kv;
}

template <typename T>
void forward_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Mask& mask,
                  bool causal, double scale, const std::vector<double>& caps, at::Tensor& out,
                  at::Tensor& lse) {
  const Dims d = dims_of(q, k, v);
  const int64_t slices = (d.N + d.qsplit - 1) / d.qsplit;
  const T *qp = q.const_data_ptr<T>(), *kp = k.const_data_ptr<T>(), *vp = v.const_data_ptr<T>();
  T *op = out.data_ptr<T>(), *lp = lse.data_ptr<T>();
  const T neg_inf = -std::numeric_limits<T>::infinity();
  at::parallel_for(0, d.B * d.H * slices, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> z(d.qsplit * d.kvsplit), acc(d.qsplit * d.Dv), mx(d.qsplit), sum(d.qsplit);
    for (int64_t idx = begin; idx < end; ++idx) {
      const int64_t b = idx / (d.H * slices), h = idx / slices % d.H, hk = h / d.group;
      const int64_t m0 = idx % slices * d.qsplit, rows = std::min(d.qsplit, d.N - m0);
      const T cap = static_cast<T>(caps[h]), alpha = static_cast<T>(scale / caps[h]);
      const T* qt = qp + b * q.stride(0) + h * q.stride(1) + m0 * q.stride(2);
      const T* kb = kp + b * k.stride(0) + hk * k.stride(1);
      const T* vb = vp + b * v.stride(0) + hk * v.stride(1);
      std::fill(mx.begin(), mx.end(), neg_inf);
      std::fill(sum.begin(), sum.end(), T(0));
      std::fill(acc.begin(), acc.end(), T(0));
      const int64_t keys = causal ? std::min(m0 + rows, d.S) : d.S;
      for (int64_t n0 = 0; n0 < keys; n0 += d.kvsplit) {
        const int64_t kv = std::min(d.kvsplit, keys - n0);
        gemm<T>(false, true, rows, kv, d.D, alpha, qt, q.stride(2), kb + n0 * k.stride(2),
                k.stride(2), T(0), z.data(), kv);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = m0 + r;
          T* row = z.data() + r * kv;
          const void* mrow = mask.kind == kBoolMask ? (const void*)mask.row<bool>(b, h, i, n0)
                             : mask.kind == kAddMask ? (const void*)mask.row<T>(b, h, i, n0)
                                                     : nullptr;
          const T m_new = std::max(mx[r], cap_row<T>(row, visible(causal, i, n0, kv), kv, cap,
                                                     mask, mrow));
          if (m_new == neg_inf) {  // nothing visible yet: weights 0, running state unchanged
            std::fill(row, row + kv, T(0));
            continue;
          }
          const T rescale = std::exp(mx[r] - m_new);  // 0 when mx was −inf
          sum[r] = exp_row<T>(row, kv, m_new) + rescale * sum[r];
          mx[r] = m_new;
          if (n0 > 0 && rescale != T(1)) {
            T* a = acc.data() + r * d.Dv;
            at::vec::map<T>([rescale](auto x) { return x * decltype(x)(rescale); }, a, a, d.Dv);
          }
        }
        gemm<T>(false, false, rows, d.Dv, kv, T(1), z.data(), kv, vb + n0 * v.stride(2),
                v.stride(2), T(1), acc.data(), d.Dv);
      }
      for (int64_t r = 0; r < rows; ++r) {  // a row with no visible key: out 0, lse +inf
        const int64_t i = m0 + r;
        const T inv = sum[r] > T(0) ? T(1) / sum[r] : T(0);
        T* o = op + ((b * d.H + h) * d.N + i) * d.Dv;
        const T* a = acc.data() + r * d.Dv;
        at::vec::map<T>([inv](auto x) { return x * decltype(x)(inv); }, o, a, d.Dv);
        lp[(b * d.H + h) * d.N + i] = sum[r] > T(0) ? mx[r] + std::log(sum[r])
                                                     : std::numeric_limits<T>::infinity();
      }
    }
  });
}

// From u (in p) and dP (in g): p ← exp(f − lse), g ← p·(dP − δ)·(1 − tanh²u) on the first
// `len` entries, 0 on the rest of the row and where a bool mask hides the key.
template <typename T>
void grad_row(T* p, T* g, int64_t len, int64_t width, T cap, T lse, T delta, const Mask& mask,
              const void* mrow) {
  using Vec = at::vec::Vectorized<T>;
  const Vec vc(cap), vl(lse), vd(delta), one(T(1)), zero(T(0));
  const T* add = mask.kind == kAddMask ? static_cast<const T*>(mrow) : nullptr;
  vec_loop<Vec::size()>(len, [&](int64_t j, int64_t w, auto tail) {
    const Vec t = Ops<T>::tanh(load<Vec>(p + j, w, tail));
    Vec f = t * vc;
    if (add) f = f + (mask.ss ? load<Vec>(add + j, w, tail) : Vec(add[0]));
    Vec e = Ops<T>::exp(f - vl);
    if constexpr (decltype(tail)::value) e = Vec::set(zero, e, w);
    const Vec dz = e * (load<Vec>(g + j, w, tail) - vd) * at::vec::fnmadd(t, t, one);
    store(e, p + j, w, tail);
    store(dz, g + j, w, tail);
  });
  const int64_t from = std::max<int64_t>(len, 0);
  std::fill(p + from, p + width, T(0));
  std::fill(g + from, g + width, T(0));
  if (mask.kind == kBoolMask) {
    const bool* keep = static_cast<const bool*>(mrow);
    for (int64_t j = 0; j < len; ++j) {
      if (!keep[j * mask.ss]) p[j] = g[j] = T(0);
    }
  }
}

template <typename T>
void backward_impl(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                   const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                   const Mask& mask, bool causal, double scale, const std::vector<double>& caps,
                   at::Tensor& dq, at::Tensor& dk, at::Tensor& dv) {
  // dout, out, dq contiguous (B, H, N, ·); dk, dv contiguous (B, H, S, ·) (one slice per query
  // head), zero-initialized.
  const Dims d = dims_of(q, k, v);
  const T *qp = q.const_data_ptr<T>(), *kp = k.const_data_ptr<T>(), *vp = v.const_data_ptr<T>();
  const T *gp = dout.const_data_ptr<T>(), *op = out.const_data_ptr<T>();
  const T* lp = lse.const_data_ptr<T>();
  T *dqp = dq.data_ptr<T>(), *dkp = dk.data_ptr<T>(), *dvp = dv.data_ptr<T>();
  const T s = static_cast<T>(scale);
  at::parallel_for(0, d.B * d.H, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> pz(d.qsplit * d.kvsplit), gz(d.qsplit * d.kvsplit), delta(d.qsplit);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / d.H, h = bh % d.H, hk = h / d.group;
      const T cap = static_cast<T>(caps[h]), alpha = static_cast<T>(scale / caps[h]);
      const T* qb = qp + b * q.stride(0) + h * q.stride(1);
      const T* kb = kp + b * k.stride(0) + hk * k.stride(1);
      const T* vb = vp + b * v.stride(0) + hk * v.stride(1);
      const T* gb = gp + bh * d.N * d.Dv;
      T* dkb = dkp + bh * d.S * d.D;
      T* dvb = dvp + bh * d.S * d.Dv;
      for (int64_t m0 = 0; m0 < d.N; m0 += d.qsplit) {
        const int64_t rows = std::min(d.qsplit, d.N - m0);
        for (int64_t r = 0; r < rows; ++r) {  // δ_i = dO_i · O_i
          using Vec = at::vec::Vectorized<T>;
          const int64_t o = (bh * d.N + m0 + r) * d.Dv;
          delta[r] = at::vec::map2_reduce_all<T>([](Vec x, Vec y) { return x * y; },
                                                 [](Vec x, Vec y) { return x + y; },
                                                 gp + o, op + o, d.Dv);
        }
        const T* qt = qb + m0 * q.stride(2);
        const T* gt = gb + m0 * d.Dv;
        T* dqt = dqp + (bh * d.N + m0) * d.D;
        const int64_t keys = causal ? std::min(m0 + rows, d.S) : d.S;
        for (int64_t n0 = 0; n0 < keys; n0 += d.kvsplit) {
          const int64_t kv = std::min(d.kvsplit, keys - n0);
          const T* kt = kb + n0 * k.stride(2);
          gemm<T>(false, true, rows, kv, d.D, alpha, qt, q.stride(2), kt, k.stride(2), T(0),
                  pz.data(), kv);  // u
          gemm<T>(false, true, rows, kv, d.Dv, T(1), gt, d.Dv, vb + n0 * v.stride(2),
                  v.stride(2), T(0), gz.data(), kv);  // dP
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t i = m0 + r;
            const T l = lp[bh * d.N + i];
            const void* mrow = mask.kind == kBoolMask ? (const void*)mask.row<bool>(b, h, i, n0)
                               : mask.kind == kAddMask ? (const void*)mask.row<T>(b, h, i, n0)
                                                       : nullptr;
            // A row with no visible key (lse = +inf) has zero weights and gradients.
            const int64_t len = std::isinf(l) ? 0 : visible(causal, i, n0, kv);
            grad_row<T>(pz.data() + r * kv, gz.data() + r * kv, len, kv, cap, l, delta[r], mask,
                        mrow);
          }
          gemm<T>(true, false, kv, d.Dv, rows, T(1), pz.data(), kv, gt, d.Dv, T(1),
                  dvb + n0 * d.Dv, d.Dv);  // dV += pᵀ·dO
          gemm<T>(false, false, rows, d.D, kv, s, gz.data(), kv, kt, k.stride(2), T(1), dqt,
                  d.D);  // dQ += s·dZ·K
          gemm<T>(true, false, kv, d.D, rows, s, gz.data(), kv, qt, q.stride(2), T(1),
                  dkb + n0 * d.D, d.D);  // dK += s·dZᵀ·Q
        }
      }
    }
  });
}

// A unit last stride and a row stride the GEMMs accept; anything else is copied.
at::Tensor rows_ok(const at::Tensor& t) {
  return t.stride(3) == 1 && t.stride(2) >= std::max<int64_t>(1, t.size(3)) ? t : t.contiguous();
}

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const std::vector<double>& caps) {
  for (const at::Tensor* t : {&q, &k, &v}) {
    TORCH_CHECK(t->device().is_cpu() && t->dim() == 4 && t->scalar_type() == q.scalar_type(),
                "q, k, v must be 4-d CPU tensors of one dtype");
  }
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
              "softcap kernel: float32 or float64 only");
  TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0) && k.size(3) == q.size(3) &&
                  v.size(1) == k.size(1) && v.size(2) == k.size(2) && k.size(1) > 0 &&
                  q.size(1) % k.size(1) == 0,
              "k, v must be (B, Hkv, S, ·) with q (B, H, N, D), H a multiple of Hkv");
  TORCH_CHECK(static_cast<int64_t>(caps.size()) == q.size(1), "cap: one value per query head");
}

}  // namespace

// q (B, H, N, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv); mask None or 4-d bool/additive
// broadcasting to (B, H, N, S); caps one positive cap per query head. Returns (out (B, H, N, Dv),
// lse (B, H, N)); lse = +inf on rows that see no key.
std::vector<at::Tensor> softcap_forward(const at::Tensor& q_in, const at::Tensor& k_in,
                                        const at::Tensor& v_in,
                                        const c10::optional<at::Tensor>& mask_opt, bool causal,
                                        double scale, const std::vector<double>& caps) {
  check_inputs(q_in, k_in, v_in, caps);
  const at::Tensor q = rows_ok(q_in), k = rows_ok(k_in), v = rows_ok(v_in);
  at::Tensor keep;
  const Mask mask = make_mask(mask_opt, q.scalar_type(), keep);
  auto out = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
  auto lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options());
  if (out.numel() == 0 || k.size(2) == 0) {
    out.zero_();
    lse.fill_(std::numeric_limits<double>::infinity());
    return {out, lse};
  }
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "softcap_forward", [&] {
    forward_impl<scalar_t>(q, k, v, mask, causal, scale, caps, out, lse);
  });
  return {out, lse};
}

// Gradients (dq, dk, dv) of softcap_forward's out, given dout and its saved (out, lse).
std::vector<at::Tensor> softcap_backward(const at::Tensor& dout, const at::Tensor& q_in,
                                         const at::Tensor& k_in, const at::Tensor& v_in,
                                         const at::Tensor& out, const at::Tensor& lse,
                                         const c10::optional<at::Tensor>& mask_opt, bool causal,
                                         double scale, const std::vector<double>& caps) {
  check_inputs(q_in, k_in, v_in, caps);
  const at::Tensor q = rows_ok(q_in), k = rows_ok(k_in), v = rows_ok(v_in);
  at::Tensor keep;
  const Mask mask = make_mask(mask_opt, q.scalar_type(), keep);
  const int64_t B = q.size(0), H = q.size(1), Hkv = k.size(1), S = k.size(2);
  auto dq = at::zeros(q.sizes(), q.options());
  auto dk = at::zeros({B, H, S, k.size(3)}, q.options());
  auto dv = at::zeros({B, H, S, v.size(3)}, q.options());
  if (dq.numel() > 0 && S > 0 && v.size(3) > 0) {
    const at::Tensor g = dout.contiguous().to(q.scalar_type());
    const at::Tensor o = out.contiguous(), l = lse.contiguous();
    AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "softcap_backward", [&] {
      backward_impl<scalar_t>(g, q, k, v, o, l, mask, causal, scale, caps, dq, dk, dv);
    });
  }
  if (H != Hkv) {  // GQA: sum the query heads' slices of each key/value head
    dk = dk.view({B, Hkv, H / Hkv, S, k.size(3)}).sum(2);
    dv = dv.view({B, Hkv, H / Hkv, S, v.size(3)}).sum(2);
  }
  return {dq, dk, dv};
}

// The float32 tanh the kernel uses, elementwise (tests measure its error).
at::Tensor fast_tanh(const at::Tensor& x_in) {
  TORCH_CHECK(x_in.scalar_type() == at::kFloat, "fast_tanh takes float32");
  const at::Tensor x = x_in.contiguous();
  auto y = at::empty_like(x);
  using Vec = at::vec::Vectorized<float>;
  const float* xp = x.const_data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for (int64_t j = 0; j < x.numel(); j += Vec::size()) {
    const int64_t w = std::min<int64_t>(Vec::size(), x.numel() - j);
    Ops<float>::tanh(Vec::loadu(xp + j, w)).store(yp + j, w);
  }
  return y;
}

// Whether GEMMs go to BLAS (true) or ATen (false); returns the previous setting. For tests.
bool set_blas(bool on) { return g_use_blas.exchange(on); }

// "blas" when GEMMs go to the BLAS symbols (found and not switched off), else "aten".
std::string gemm_backend() { return have_blas<float>() && g_use_blas ? "blas" : "aten"; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &softcap_forward, py::call_guard<py::gil_scoped_release>());
  m.def("backward", &softcap_backward, py::call_guard<py::gil_scoped_release>());
  m.def("fast_tanh", &fast_tanh);
  m.def("set_blas", &set_blas);
  m.def("gemm_backend", &gemm_backend);
  m.def("capability", [] { return std::string(ATTNSCALE_STR(CPU_CAPABILITY)); });
}
