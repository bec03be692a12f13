// Scaled dot-product attention that also returns per-head statistics of its logits.
//
// The same contract as attnscale.measure.stats.attention_with_sums (the Python version, which is the
// reference this kernel is tested against): out = softmax(scale·q·kᵀ masked)·v, plus the
// per-head sums of SUM_FIELDS (stats.py) and max |logit| per head.
//
// Why a kernel: the monitor must cost little next to SDPA. Materializing the (B, H, N, S)
// logits with batched matmuls, as the Python version does, writes and rereads them through
// memory; here one (batch, head) is done at a time and a block of its logits stays in cache,
// the way PyTorch's CPU flash-attention kernel works. Order of operations as in that kernel:
// the product is scaled after the matmul, e = exp(z − max) uses the same fast exp
// (Vectorized::exp_u20), and rows are divided by Σe after the product with v.
#include <torch/extension.h>

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
constexpr int64_t kFields = 14;   // len(stats.SUM_FIELDS), in that order
constexpr int kRows = 4;  // query rows per register tile
const float kNegInf = -std::numeric_limits<float>::infinity();

struct Sums {  // what one logits row adds
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0, t1 = 0, t2 = 0, amax = 0;
};

float hsum(const Vec& x) {
  return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, x);
}

float hmax(const Vec& x) {
  return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, x);
}

// Σe, Σe·(z − m), Σe², Σe³, Σz, Σz², max|z| over the visible entries of a row padded with −inf
// to a multiple of the vector width; e = exp(z − m) overwrites z.
Sums row_pass(float* z, int64_t width, float m) {
  const Vec vm(m), zero(0.f), neg_inf(kNegInf);
  Vec s0(0.f), s1(0.f), s2(0.f), s3(0.f), t1(0.f), t2(0.f), amax(0.f);
  for (int64_t j = 0; j < width; j += Vec::size()) {
    Vec zj = Vec::loadu(z + j);
    Vec vis = zj > neg_inf;  // all-ones lanes where the key is visible
    Vec zv = Vec::blendv(zero, zj, vis);
    Vec zc = Vec::blendv(zero, zj - vm, vis);
    Vec e = Vec::blendv(zero, zc.exp_u20(), vis);
    Vec e2 = e * e;
    s0 = s0 + e;
    s1 = s1 + e * zc;
    s2 = s2 + e2;
    s3 = s3 + e2 * e;
    t1 = t1 + zv;
    t2 = t2 + zv * zv;
    amax = at::vec::maximum(amax, zv.abs());
    e.store(z + j);
  }
  Sums r;
  r.s0 = hsum(s0), r.s1 = hsum(s1), r.s2 = hsum(s2), r.s3 = hsum(s3);
  r.t1 = hsum(t1), r.t2 = hsum(t2), r.amax = hmax(amax);
  return r;
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

float row_max(const float* zr, int64_t width) {
  Vec mx(kNegInf);
  for (int64_t j = 0; j < width; j += Vec::size()) mx = at::vec::maximum(mx, Vec::loadu(zr + j));
  return hmax(mx);
}

// The row statistics of stats.head_sums, added to acc (kFields doubles).
void add_row(double* acc, const Sums& r, float m, int64_t n_vis, double saturation) {
  const double s0 = r.s0, p2 = r.s2 / (s0 * s0), p3 = r.s3 / (s0 * s0 * s0);
  const double entropy = std::log(s0) - r.s1 / s0, lse = m + std::log(s0);
  const double max_weight = 1.0 / s0;
  const double values[kFields] = {
      1.0, entropy, std::log(static_cast<double>(n_vis)), max_weight, 1.0 / std::max(p2, 1e-30),
      max_weight > saturation ? 1.0 : 0.0, std::sqrt(std::max(p2 - 2 * p3 + p2 * p2, 0.0)),
      lse, lse * lse, n_vis >= 2 ? entropy / std::log(static_cast<double>(n_vis)) : 0.0,
      n_vis >= 2 ? 1.0 : 0.0, static_cast<double>(n_vis), r.t1, r.t2};
  for (int64_t f = 0; f < kFields; ++f) acc[f] += values[f];
}

}  // namespace

// q (B, H, N, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv) float32 with unit last stride, H a multiple
// of Hkv (query head h reads key/value head h / (H / Hkv), as SDPA's enable_gqa); keep a bool
// tensor expanded to (B, H, N, S) or undefined; rows_kept (B, N) contiguous bool; a row is
// saturated when its largest weight exceeds `saturation` (stats.SATURATION). Returns out
// (B, H, N, Dv) -- an empty tensor when with_output is false, the statistics alone -- sums
// (H, kFields) float64 and max |logit| (H,) float64.
std::vector<at::Tensor> attention_with_sums(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const c10::optional<at::Tensor>& keep_opt, bool is_causal, double scale_d,
    const at::Tensor& rows_kept, double saturation, bool with_output) {
  for (const at::Tensor* t : {&q, &k, &v}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat && t->dim() == 4 &&
                    t->stride(3) == 1,
                "q, k, v must be 4-d float32 CPU tensors with a unit last stride");
  }
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3);
  const int64_t S = k.size(2), Dv = v.size(3);
  TORCH_CHECK(k.size(0) == B && v.size(0) == B && k.size(3) == D && v.size(1) == k.size(1) &&
                  v.size(2) == S && k.size(1) > 0 && H % k.size(1) == 0,
              "k and v must be (B, Hkv, S, ·) with q (B, H, N, D), H a multiple of Hkv");
  TORCH_CHECK(rows_kept.scalar_type() == at::kBool && rows_kept.is_contiguous() &&
                  rows_kept.sizes() == at::IntArrayRef({B, N}),
              "rows_kept must be a contiguous (B, N) bool tensor");
  if (keep_opt.has_value() && keep_opt->defined()) {
    TORCH_CHECK(keep_opt->device().is_cpu() && keep_opt->scalar_type() == at::kBool &&
                    keep_opt->sizes() == at::IntArrayRef({B, H, N, S}),
                "keep must be a CPU bool tensor expanded to (B, H, N, S)");
  }
  const int64_t group = H / k.size(1);
  const int64_t width = (S + Vec::size() - 1) / Vec::size() * Vec::size();
  const float scale = static_cast<float>(scale_d);
  // (B, H, N, Dv) stored as (B, N, H, Dv), SDPA's own output layout: the models' next step,
  // transpose(1, 2).contiguous(), is then free.
  auto out = with_output ? at::empty({B, N, H, Dv}, q.options()).permute({0, 2, 1, 3})
                        : at::empty({0}, q.options());
  auto partial = at::zeros({B, H, kFields}, q.options().dtype(at::kDouble));
  auto partial_max = at::zeros({B, H}, q.options().dtype(at::kDouble));
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
    std::vector<float> kt(D * width), z(kRows * width);  // kRows rows of logits
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H, hk = h / group;
      const float* qb = qp + b * qs0 + h * qs1;
      const float* kb = kp + b * ks0 + hk * ks1;
      const float* vb = vp + b * vs0 + hk * vs1;
      float* ob = with_output ? op + b * N * H * Dv + h * Dv : nullptr;  // row i: + i·H·Dv
      double* acc = pp + bh * kFields;
      double head_max = 0;
      for (int64_t c = 0; c < D; ++c) {  // kᵀ, so the product runs along contiguous keys
        float* row = kt.data() + c * width;
        for (int64_t j = 0; j < S; ++j) row[j] = kb[j * ks2 + c];
        std::fill(row + S, row + width, 0.f);
      }
      auto rows = [&](auto tile, int64_t i0) {  // query rows i0 .. i0 + R - 1
        constexpr int R = decltype(tile)::value;
        float inv[R];
        qk_rows<R>(qb + i0 * qs2, qs2, D, kt.data(), width, scale, z.data());
        for (int r = 0; r < R; ++r) {
          const int64_t i = i0 + r;
          float* zr = z.data() + r * width;
          std::fill(zr + S, zr + width, kNegInf);  // padding: hidden
          int64_t n_vis = S;
          if (is_causal) {  // aligned to the upper left, as SDPA's is_causal
            n_vis = std::min(i + 1, S);
            std::fill(zr + n_vis, zr + S, kNegInf);
          }
          if (has_keep) {
            const bool* kr = keep + b * ms[0] + h * ms[1] + i * ms[2];
            n_vis = 0;
            for (int64_t j = 0; j < S; ++j) {
              if (!kr[j * ms[3]]) zr[j] = kNegInf;
              n_vis += zr[j] > kNegInf;
            }
          }
          if (n_vis == 0) {  // SDPA gives 0 for a row with no visible key
            std::fill(zr, zr + width, 0.f);
            inv[r] = 0.f;
            continue;
          }
          const float m = row_max(zr, width);
          const Sums sums = row_pass(zr, width, m);
          if (kept_rows[b * N + i]) {
            add_row(acc, sums, m, n_vis, saturation);
            head_max = std::max(head_max, static_cast<double>(sums.amax));
          }
          inv[r] = 1.f / sums.s0;
        }
        if (with_output) {
          pv_rows<R>(z.data(), width, S, vb, vs2, Dv, inv, ob + i0 * H * Dv, H * Dv);
        }
      };
      int64_t i0 = 0;
      for (; i0 + kRows <= N; i0 += kRows) rows(std::integral_constant<int, kRows>(), i0);
      for (; i0 < N; ++i0) rows(std::integral_constant<int, 1>(), i0);
      pm[bh] = head_max;
    }
  });
  return {out, partial.sum(0), std::get<0>(partial_max.max(0))};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // The work runs in torch's thread pool: other Python threads may go on meanwhile.
  m.def("attention_with_sums", &attention_with_sums,
        py::call_guard<py::gil_scoped_release>());
}
