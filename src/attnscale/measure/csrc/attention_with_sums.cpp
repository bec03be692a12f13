// Scaled dot-product attention that also returns per-head statistics of its logits, for the
// model's own scale and, from the same pass, for other scores of the same q and k.
//
// The same contract as attnscale.measure.rowstats.attention_with_sums (the Python version, which
// is the reference this kernel is tested against): out = softmax(scale·q·kᵀ masked)·v, plus the
// per-head sums of SUM_FIELDS (rowstats.py) and max |logit| per head.
//
// Why a kernel: the monitor must cost little next to SDPA. Materializing the (B, H, N, S)
// logits with batched matmuls, as the Python version does, writes and rereads them through
// memory; here one (batch, head) is done at a time and a block of its logits stays in cache,
// the way PyTorch's CPU flash-attention kernel works. Order of operations as in that kernel:
// the product is scaled after the matmul, e = exp(z − max) uses the same fast exp
// (Vectorized::exp_u20), and rows are divided by Σe after the product with v.
//
// Counterfactual variants reuse the logits block while it is in cache, so q and k are read and
// multiplied once for all of them: a "dot" variant with scale s has logits (s/scale)·z, whose
// row max is (s/scale)·max z (s, scale > 0); a "cosine" variant with temperature τ has logits
// τ·q·k/(‖q‖‖k‖) = z·τ/(scale·‖q_i‖)·(1/‖k_j‖), with norms clamped below at eps as
// F.normalize does. Cosine logits lie in [−τ, τ], so for τ ≤ kFixedShiftMax the exponentials are
// shifted by τ instead of the row max (no max pass; statistics are shift-invariant) and the
// largest weight is exp(max − τ)/Σe; for τ ≤ 1 a short polynomial replaces exp_u20. Each
// variant costs one more pass over a row already in L1, against the two products (q·kᵀ, p·v)
// every row pays for once (figures: benchmarks/monitor_overhead.py).
//
// Without a bool mask a row's visible keys are a prefix (all of them, or 0..i under causal):
// the passes skip the per-lane visibility test up to its last full vector and stop after it.
//
// Non-finite logits (rowstats.py and headstats.py state the rule every path follows): a kept row
// whose visible logits include NaN or ±inf adds its visible count to "scored" and its non-finite
// count to "nonfinite", sets max |logit| to +inf, and adds nothing else. The count comes from the
// row-max pass: every non-finite entry of the row, less the hidden keys (all −inf). Variants are
// computed from these logits, so such a row is one of theirs too, with the same count; where
// the product scale·q·k overflowed but a variant's own logits would not, that variant is wrong
// for the row, and the monitor recomputes the counterfactuals of such calls by their own scores.
//
// Vectorized<float> takes its width from CPU_CAPABILITY (attnscale.util.cppext): AVX512, AVX2, or
// DEFAULT, ATen's portable implementation, which compiles on any CPU (ARM included).
// The Tensor class and only the operators used (ATen's per-operator headers), with torch's
// pybind11 casters, not <torch/extension.h>: that one also pulls in every operator and the
// whole C++ frontend (torch::nn, torch::optim). Headers alone: 25 s -> 8 s of compile time.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/utils/pybind.h>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kFields = 16;  // len(rowstats.SUM_FIELDS), in that order
constexpr int64_t kScored = 14, kNonfinite = 15;  // their indices of "scored" and "nonfinite"
constexpr int kRows = 4;         // query rows per register tile
// Largest τ whose fixed shift keeps every e³ = exp(3(x − τ)) ≥ exp(−6τ) a normal float32 with
// room to spare (Σe³ feeds the Jacobian norm).
constexpr double kFixedShiftMax = 8.0;
const float kInf = std::numeric_limits<float>::infinity();
const float kNegInf = -kInf;

struct Sums {  // what one logits row adds
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0, t1 = 0, t2 = 0, amax = 0, zmax = 0;
};

float hsum(const Vec& x) {
  return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, x);
}

float hmax(const Vec& x) {
  return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, x);
}

// e^y for y in [−2, 0] (the shifted logits of a cosine variant with τ ≤ 1): a degree-8
// polynomial in t = y + 1 ∈ [−1, 1], near-minimax (a Chebyshev fit of e^{t−1}), relative
// error under 4e-7 in float32 -- below exp_u20's -- with half its operations and no range
// reduction.
Vec exp_bounded(const Vec& y) {
  static constexpr float c[9] = {0.36787945f, 0.36787939f, 0.18393971f, 0.061313756f,
                                 0.015328396f, 0.0030638478f, 0.00051070895f, 7.5352051e-05f,
                                 9.3858553e-06f};
  const Vec t = y + Vec(1.f);
  Vec p(c[8]);
  for (int i = 7; i >= 0; --i) p = at::vec::fmadd(p, t, Vec(c[i]));
  return p;
}

// For the logits x = z·f·fk (kScale: times f; kPerKey: times fk[j]) of a row z padded with −inf:
// Σe, Σe·(x − m), Σe², Σe³ and (kMoments) Σx, Σx², max|x|, max x over the visible entries
// (z > −inf) of z[0, end), with e = exp(x − m). Entries before `dense` (a multiple of the
// vector width) are all visible and skip the per-lane test; those from `end` on are hidden and
// skipped. kStore: e overwrites z (the attention weights the product with v needs), 0 from
// `end` to `width`. kBounded: x − m lies in [−2, 0], and exp_bounded replaces exp_u20.
template <bool kStore, bool kScale, bool kPerKey, bool kMoments, bool kBounded = false>
Sums row_pass(float* z, int64_t dense, int64_t end, int64_t width, float m, float f,
              const float* fk) {
  const Vec vm(m), vf(f), zero(0.f), neg_inf(kNegInf);
  Vec s0(0.f), s1(0.f), s2(0.f), s3(0.f), t1(0.f), t2(0.f), amax(0.f), zmax(kNegInf);
  auto step = [&](int64_t j, auto masked) {
    Vec x = Vec::loadu(z + j);
    const Vec vis = masked ? Vec(x > neg_inf) : Vec();  // all-ones lanes where visible
    if constexpr (kScale) x = x * vf;
    if constexpr (kPerKey) x = x * Vec::loadu(fk + j);
    Vec xc = x - vm, e;
    if constexpr (decltype(masked)::value) {
      x = Vec::blendv(zero, x, vis), xc = Vec::blendv(zero, xc, vis);
      e = Vec::blendv(zero, kBounded ? exp_bounded(xc) : xc.exp_u20(), vis);
    } else {
      e = kBounded ? exp_bounded(xc) : xc.exp_u20();
    }
    const Vec e2 = e * e;
    s0 = s0 + e;
    s1 = at::vec::fmadd(e, xc, s1);
    s2 = s2 + e2;
    s3 = at::vec::fmadd(e2, e, s3);
    if constexpr (kMoments) {
      t1 = t1 + x;
      t2 = at::vec::fmadd(x, x, t2);
      amax = at::vec::maximum(amax, x.abs());
      if constexpr (decltype(masked)::value) x = Vec::blendv(neg_inf, x, vis);
      zmax = at::vec::maximum(zmax, x);
    }
    if constexpr (kStore) e.store(z + j);
  };
  int64_t j = 0;
  for (; j < dense; j += Vec::size()) step(j, std::false_type());
  for (; j < end; j += Vec::size()) step(j, std::true_type());
  if constexpr (kStore) std::fill(z + end, z + width, 0.f);
  Sums r;
  r.s0 = hsum(s0), r.s1 = hsum(s1), r.s2 = hsum(s2), r.s3 = hsum(s3);
  if constexpr (kMoments) r.t1 = hsum(t1), r.t2 = hsum(t2), r.amax = hmax(amax), r.zmax = hmax(zmax);
  return r;
}

// max over the visible j < end of z_j·f·fk_j.
float scaled_max(const float* z, int64_t end, float f, const float* fk) {
  const Vec vf(f), neg_inf(kNegInf);
  Vec mx(kNegInf);
  for (int64_t j = 0; j < end; j += Vec::size()) {
    const Vec zj = Vec::loadu(z + j);
    mx = at::vec::maximum(mx, Vec::blendv(neg_inf, zj * vf * Vec::loadu(fk + j), zj > neg_inf));
  }
  return hmax(mx);
}

// z (R rows of width) = (q · kᵀ) · scale for R query rows lq apart, with kt the keys
// transposed (D rows of width, zero-padded). A register tile of R rows × 2 vectors of keys:
// each loaded vector of keys serves R rows, the way a GEMM micro-kernel reuses its operands.
template <int R>
void qk_rows(const float* q, int64_t lq, int64_t D, const float* kt, int64_t width, float scale,
             float* z) {
  constexpr int64_t V = Vec::size();
  const Vec vs(scale);
  for (int64_t j = 0; j < width;) {
    const bool pair = j + 2 * V <= width;  // width is a multiple of V, not always of 2V
    Vec a[R][2];
    for (auto& row : a) row[0] = row[1] = Vec(0.f);
    for (int64_t c = 0; c < D; ++c) {
      const float* kr = kt + c * width + j;
      const Vec k0 = Vec::loadu(kr), k1 = pair ? Vec::loadu(kr + V) : Vec(0.f);
      for (int r = 0; r < R; ++r) {
        const Vec qc(q[r * lq + c]);
        a[r][0] = at::vec::fmadd(qc, k0, a[r][0]);
        a[r][1] = at::vec::fmadd(qc, k1, a[r][1]);
      }
    }
    for (int r = 0; r < R; ++r) {
      (a[r][0] * vs).store(z + r * width + j);
      if (pair) (a[r][1] * vs).store(z + r * width + j + V);
    }
    j += pair ? 2 * V : V;
  }
}

// out (R rows, ldo apart) = (e · v) · inv per row, e R rows of width (0 at hidden keys), rows
// of v lv apart. Register tile of R rows × 2 vectors of outputs, summed over keys in order.
template <int R>
void pv_rows(const float* e, int64_t width, int64_t S, const float* v, int64_t lv, int64_t Dv,
             const float* inv, float* out, int64_t ldo) {
  constexpr int64_t V = Vec::size();
  int64_t c = 0;
  while (c + V <= Dv) {
    const bool pair = c + 2 * V <= Dv;
    Vec a[R][2];
    for (auto& row : a) row[0] = row[1] = Vec(0.f);
    for (int64_t j = 0; j < S; ++j) {
      const float* vr = v + j * lv + c;
      const Vec v0 = Vec::loadu(vr), v1 = pair ? Vec::loadu(vr + V) : Vec(0.f);
      for (int r = 0; r < R; ++r) {
        const Vec ej(e[r * width + j]);
        a[r][0] = at::vec::fmadd(ej, v0, a[r][0]);
        a[r][1] = at::vec::fmadd(ej, v1, a[r][1]);
      }
    }
    for (int r = 0; r < R; ++r) {
      (a[r][0] * Vec(inv[r])).store(out + r * ldo + c);
      if (pair) (a[r][1] * Vec(inv[r])).store(out + r * ldo + c + V);
    }
    c += pair ? 2 * V : V;
  }
  for (; c < Dv; ++c) {  // fewer than V outputs left
    for (int r = 0; r < R; ++r) {
      float a = 0.f;
      for (int64_t j = 0; j < S; ++j) a += e[r * width + j] * v[j * lv + c];
      out[r * ldo + c] = a * inv[r];
    }
  }
}

// The max of zr[0, end) (NaN if any entry is NaN), and in *nonfinite the number of its entries
// that are NaN or ±inf, hidden keys (−inf) included.
float row_max(const float* zr, int64_t end, int64_t* nonfinite) {
  const Vec inf(kInf), one(1.f), zero(0.f);
  Vec mx(kNegInf), count(0.f);  // per-lane counts stay exact in float32 below 2^24
  for (int64_t j = 0; j < end; j += Vec::size()) {
    const Vec x = Vec::loadu(zr + j);
    mx = at::vec::maximum(mx, x);
    count = count + Vec::blendv(one, zero, x.abs() < inf);  // NaN compares false: counted
  }
  *nonfinite = static_cast<int64_t>(hsum(count));
  return hmax(mx);
}

// The row statistics of rowstats.head_sums, added to acc (kFields doubles); m the shift of the
// exponentials, top the largest e (1 when m is the row max), log_n = ln n_vis.
void add_row(double* acc, const Sums& r, double m, double top, int64_t n_vis, double log_n,
             double saturation) {
  const double inv = 1.0 / r.s0, log_s0 = std::log(static_cast<double>(r.s0));
  const double p2 = r.s2 * inv * inv, p3 = r.s3 * inv * inv * inv;
  const double entropy = log_s0 - r.s1 * inv, lse = m + log_s0;
  const double max_weight = top * inv;
  const double values[kFields] = {
      1.0, entropy, log_n, max_weight, 1.0 / std::max(p2, 1e-30),
      max_weight > saturation ? 1.0 : 0.0, std::sqrt(std::max(p2 - 2 * p3 + p2 * p2, 0.0)),
      lse, lse * lse, n_vis >= 2 ? entropy / log_n : 0.0,
      n_vis >= 2 ? 1.0 : 0.0, static_cast<double>(n_vis), r.t1, r.t2,
      static_cast<double>(n_vis), 0.0};
  for (int64_t f = 0; f < kFields; ++f) acc[f] += values[f];
}

// A row with `nonfinite` > 0 of its n_vis visible logits not finite: counted, nothing else.
void add_nonfinite_row(double* acc, double* vmax, int64_t n_vis, int64_t nonfinite) {
  acc[kScored] += static_cast<double>(n_vis);
  acc[kNonfinite] += static_cast<double>(nonfinite);
  *vmax = std::numeric_limits<double>::infinity();
}

// The counterfactual variants of one row of masked logits z (scaled by `scale`, not yet
// exponentiated; see row_pass for dense and end): measure() before the row's own pass
// overwrites z, add() after it, into acc + kFields·(1 + v) and vmax[1 + v]. A dot variant's
// Σx, Σx² and max|x| are the row's own times r, r² and r, so its pass skips them.
struct Variants {
  std::vector<float> dot;     // s/scale per "dot" variant
  std::vector<float> cosine;  // τ per "cosine" variant
  float scale = 1.f, eps = 1e-12f;

  int64_t count() const { return 1 + static_cast<int64_t>(dot.size() + cosine.size()); }

  void measure(float* z, int64_t dense, int64_t end, int64_t width, float m, float qnorm,
               const float* inv_k, Sums* out, float* shifts) const {
    for (const float r : dot) {
      *out++ = row_pass<false, true, false, false>(z, dense, end, width, m * r, r, nullptr);
      *shifts++ = m * r;
    }
    for (const float tau : cosine) {
      const float f = tau / (scale * std::max(qnorm, eps));
      const float shift = tau <= kFixedShiftMax ? tau : scaled_max(z, end, f, inv_k);
      *out++ = tau <= 1.f  // x − τ in [−2τ, 0]: the short polynomial
                   ? row_pass<false, true, true, true, true>(z, dense, end, width, shift, f, inv_k)
                   : row_pass<false, true, true, true>(z, dense, end, width, shift, f, inv_k);
      *shifts++ = shift;
    }
  }

  void add(const Sums* sums, const float* shifts, const Sums& own, int64_t n_vis, double log_n,
           double saturation, double* acc, double* vmax) const {
    int64_t v = 1;
    for (const float r : dot) {
      Sums s = *sums++;
      s.t1 = own.t1 * r, s.t2 = own.t2 * r * r, s.amax = own.amax * r;
      add_row(acc + kFields * v, s, *shifts++, 1.0, n_vis, log_n, saturation);
      vmax[v] = std::max(vmax[v], static_cast<double>(s.amax));
      ++v;
    }
    for (std::size_t c = 0; c < cosine.size(); ++c, ++v) {
      const Sums& s = *sums++;
      const double shift = *shifts++;  // exp(max − shift): the largest e (1 for the row max)
      add_row(acc + kFields * v, s, shift, std::exp(static_cast<double>(s.zmax) - shift), n_vis,
              log_n, saturation);
      vmax[v] = std::max(vmax[v], static_cast<double>(s.amax));
    }
  }
};

// ‖x‖ of D contiguous floats.
float norm(const float* x, int64_t D) {
  return std::sqrt(at::vec::map_reduce_all<float>(
      [](Vec v) { return v * v; }, [](Vec a, Vec b) { return a + b; }, x, D));
}

void check_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const c10::optional<at::Tensor>& keep_opt, const at::Tensor& rows_kept) {
  for (const at::Tensor* t : {&q, &k, &v}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat && t->dim() == 4 &&
                    t->stride(3) == 1,
                "q, k, v must be 4-d float32 CPU tensors with a unit last stride");
  }
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), S = k.size(2);
  TORCH_CHECK(k.size(0) == B && v.size(0) == B && k.size(3) == q.size(3) &&
                  v.size(1) == k.size(1) && v.size(2) == S && k.size(1) > 0 && H % k.size(1) == 0,
              "k and v must be (B, Hkv, S, ·) with q (B, H, N, D), H a multiple of Hkv");
  TORCH_CHECK(rows_kept.scalar_type() == at::kBool && rows_kept.is_contiguous() &&
                  rows_kept.sizes() == at::IntArrayRef({B, N}),
              "rows_kept must be a contiguous (B, N) bool tensor");
  if (keep_opt.has_value() && keep_opt->defined()) {
    TORCH_CHECK(keep_opt->device().is_cpu() && keep_opt->scalar_type() == at::kBool &&
                    keep_opt->sizes() == at::IntArrayRef({B, H, N, S}),
                "keep must be a CPU bool tensor expanded to (B, H, N, S)");
  }
}

}  // namespace

// q (B, H, N, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv) float32 with unit last stride, H a multiple
// of Hkv (query head h reads key/value head h / (H / Hkv), as SDPA's enable_gqa); keep a bool
// tensor expanded to (B, H, N, S) or undefined; rows_kept (B, N) contiguous bool; a row is
// saturated when its largest weight exceeds `saturation` (rowstats.SATURATION). Variant 0 is the
// attention itself (logits scale·q·k); then one variant per entry of dot_scales (logits s·q·k)
// and of cosine_taus (τ·cos(q, k), norms clamped at eps). Returns out (B, H, N, Dv) -- an empty
// tensor when with_output is false, the statistics alone --, sums (V, H, kFields) float64 and
// max |logit| (V, H) float64.
std::vector<at::Tensor> attention_with_sums(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const c10::optional<at::Tensor>& keep_opt, bool is_causal, double scale_d,
    const at::Tensor& rows_kept, double saturation, bool with_output,
    const std::vector<double>& dot_scales, const std::vector<double>& cosine_taus, double eps) {
  check_args(q, k, v, keep_opt, rows_kept);
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3);
  const int64_t S = k.size(2), Dv = v.size(3);
  const int64_t group = H / k.size(1);
  constexpr int64_t V = Vec::size();
  const int64_t width = (S + V - 1) / V * V;
  const float scale = static_cast<float>(scale_d);
  Variants extra;
  extra.scale = scale, extra.eps = static_cast<float>(eps);
  TORCH_CHECK((dot_scales.empty() && cosine_taus.empty()) || scale_d > 0,
              "variants need a positive scale");
  for (double s : dot_scales) {
    TORCH_CHECK(s > 0, "dot_scales must be positive");
    extra.dot.push_back(static_cast<float>(s / scale_d));
  }
  for (double tau : cosine_taus) {
    TORCH_CHECK(tau > 0, "cosine_taus must be positive");
    extra.cosine.push_back(static_cast<float>(tau));
  }
  const int64_t nv = extra.count();
  const bool cosine = !extra.cosine.empty();
  // (B, H, N, Dv) stored as (B, N, H, Dv), SDPA's own output layout: the models' next step,
  // transpose(1, 2).contiguous(), is then free.
  auto out = with_output ? at::empty({B, N, H, Dv}, q.options()).permute({0, 2, 1, 3})
                         : at::empty({0}, q.options());
  auto partial = at::zeros({B, H, nv, kFields}, q.options().dtype(at::kDouble));
  auto partial_max = at::zeros({B, H, nv}, q.options().dtype(at::kDouble));
  const bool has_keep = keep_opt.has_value() && keep_opt->defined();
  const bool* keep = has_keep ? keep_opt->data_ptr<bool>() : nullptr;
  const std::vector<int64_t> ms = has_keep ? keep_opt->strides().vec() : std::vector<int64_t>(4, 0);
  const bool* kept_rows = rows_kept.data_ptr<bool>();
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  double *pp = partial.data_ptr<double>(), *pm = partial_max.data_ptr<double>();
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1), qs2 = q.stride(2);
  const int64_t ks0 = k.stride(0), ks1 = k.stride(1), ks2 = k.stride(2);
  const int64_t vs0 = v.stride(0), vs1 = v.stride(1), vs2 = v.stride(2);

  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> kt(D * width), z(kRows * width), inv_k(cosine ? width : 0, 1.f);
    std::vector<Sums> vsums(nv);  // one row's variants, between measure() and add()
    std::vector<float> shifts(nv);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H, hk = h / group;
      const float* qb = qp + b * qs0 + h * qs1;
      const float* kb = kp + b * ks0 + hk * ks1;
      const float* vb = vp + b * vs0 + hk * vs1;
      float* ob = with_output ? op + b * N * H * Dv + h * Dv : nullptr;  // row i: + i·H·Dv
      double* acc = pp + bh * nv * kFields;
      double* vmax = pm + bh * nv;
      for (int64_t c = 0; c < D; ++c) {  // kᵀ, so the product runs along contiguous keys
        float* row = kt.data() + c * width;
        for (int64_t j = 0; j < S; ++j) row[j] = kb[j * ks2 + c];
        std::fill(row + S, row + width, 0.f);
      }
      if (cosine) {  // 1/max(‖k_j‖, eps); the padding keeps 1, so −inf stays −inf
        for (int64_t j = 0; j < S; ++j) {
          inv_k[j] = 1.f / std::max(norm(kb + j * ks2, D), extra.eps);
        }
      }
      auto rows = [&](auto tile, int64_t i0) {  // query rows i0 .. i0 + R - 1
        constexpr int R = decltype(tile)::value;
        float inv[R];
        qk_rows<R>(qb + i0 * qs2, qs2, D, kt.data(), width, scale, z.data());
        for (int r = 0; r < R; ++r) {
          const int64_t i = i0 + r;
          float* zr = z.data() + r * width;
          inv[r] = 0.f;
          const bool kept = kept_rows[b * N + i];
          if (!kept && !with_output) continue;
          std::fill(zr + S, zr + width, kNegInf);  // padding: hidden
          int64_t n_vis = S;  // the keys the query sees, whatever their logits
          if (is_causal) {  // aligned to the upper left, as SDPA's is_causal
            n_vis = std::min(i + 1, S);
            std::fill(zr + n_vis, zr + S, kNegInf);
          }
          if (has_keep) {
            const bool* kr = keep + b * ms[0] + h * ms[1] + i * ms[2];
            const int64_t seen = n_vis;
            n_vis = 0;
            for (int64_t j = 0; j < seen; ++j) {
              if (kr[j * ms[3]]) {
                ++n_vis;
              } else {
                zr[j] = kNegInf;
              }
            }
          }
          if (n_vis == 0) {  // SDPA gives 0 for a row with no visible key
            std::fill(zr, zr + width, 0.f);
            continue;
          }
          // Without a mask the visible keys are 0 .. n_vis − 1: no per-lane test before the
          // last partial vector, nothing after it.
          const int64_t end = has_keep ? width : (n_vis + V - 1) / V * V;
          const int64_t dense = has_keep ? 0 : n_vis / V * V;
          int64_t nonfinite;
          const float m = row_max(zr, end, &nonfinite);
          nonfinite -= end - n_vis;  // the hidden keys in [0, end), all −inf
          const bool extras = kept && nv > 1 && nonfinite == 0;
          if (extras) {
            extra.measure(zr, dense, end, width, m, cosine ? norm(qb + i * qs2, D) : 0.f,
                          inv_k.data(), vsums.data(), shifts.data());
          }
          Sums own;
          if (with_output) {  // the weights for the product with v, as SDPA computes them
            own = row_pass<true, false, false, true>(zr, dense, end, width, m, 1.f, nullptr);
            inv[r] = 1.f / own.s0;
          } else if (nonfinite == 0) {
            own = row_pass<false, false, false, true>(zr, dense, end, width, m, 1.f, nullptr);
          }
          if (kept && nonfinite > 0) {
            for (int64_t v = 0; v < nv; ++v) {
              add_nonfinite_row(acc + kFields * v, vmax + v, n_vis, nonfinite);
            }
          } else if (kept) {
            const double log_n = std::log(static_cast<double>(n_vis));
            add_row(acc, own, m, 1.0, n_vis, log_n, saturation);
            vmax[0] = std::max(vmax[0], static_cast<double>(own.amax));
            if (extras) {
              extra.add(vsums.data(), shifts.data(), own, n_vis, log_n, saturation, acc, vmax);
            }
          }
        }
        if (with_output) {
          pv_rows<R>(z.data(), width, S, vb, vs2, Dv, inv, ob + i0 * H * Dv, H * Dv);
        }
      };
      int64_t i0 = 0;
      for (; i0 + kRows <= N; i0 += kRows) rows(std::integral_constant<int, kRows>(), i0);
      for (; i0 < N; ++i0) rows(std::integral_constant<int, 1>(), i0);
    }
  });
  // Sum over the batch in a fixed order: the statistics do not depend on the thread count.
  return {out, partial.sum(0).permute({1, 0, 2}).contiguous(),
          std::get<0>(partial_max.max(0)).t().contiguous()};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // The work runs in torch's thread pool: other Python threads may go on meanwhile.
  m.def("attention_with_sums", &attention_with_sums,
        py::call_guard<py::gil_scoped_release>());
}
