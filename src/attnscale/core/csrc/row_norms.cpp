// Row normalizations over the last dimension, forward and backward, one pass over memory each.
//
//   kind 0, LayerNorm without weight (Ba et al. 2016, arXiv 1607.06450):
//           μ = mean(x), r = 1/√(mean((x − μ)²) + eps), y = (x − μ)·r
//   kind 1, RMSNorm without weight (Zhang & Sennrich 2019, arXiv 1910.07467):
//           r = 1/√(mean(x²) + eps), y = x·r
//   kind 2, unit norm (F.normalize): r = 1/max(‖x‖, eps), y = x·r
//
// Backward, with c = dot_scale·⟨y, dy⟩ per row (dot_scale = r/d for kinds 0 and 1, r for
// kind 2, and 0 where kind 2's clamp is active) and m = r·mean(dy) for kind 0 only:
//   dx = r·dy − c·y − m
// The forward returns r and dot_scale per row for the backward.
//
// A row of D elements is read once into cache and every sum over it is taken there, so each
// direction streams its inputs once and writes one output (the elementwise-op version of the
// same formulas, for LayerNorm, makes 4 passes forward and 6 backward over (rows, D) arrays).
// The caller (attnscale.core.native_rows) permutes x so that its rows lie in memory order; y
// and dx are allocated contiguous in that order, which is x's own layout. Inputs may have any
// strides over the leading dimensions (dy keeps the layout SDPA's backward gave it) but a unit
// stride along the row. Sums run in the input precision (float32 or float64) over vector
// lanes, then across lanes. Rows are split over PyTorch's intra-op threads (at::parallel_for).
// The Tensor class and only the operators used (ATen's per-operator headers), with torch's
// pybind11 casters, not <torch/extension.h>: that one also pulls in every operator and the
// whole C++ frontend (torch::nn, torch::optim). Headers alone: 25 s -> 8 s of compile time.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <ATen/Parallel.h>
#include <ATen/Dispatch.h>
#include <ATen/TensorIterator.h>  // at::internal::GRAIN_SIZE
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#define ATTNSCALE_STR2(x) #x
#define ATTNSCALE_STR(x) ATTNSCALE_STR2(x)

namespace {

using at::vec::Vectorized;

constexpr int64_t kLayer = 0, kRms = 1, kUnit = 2;

// Walks the rows of a tensor whose last dimension has unit stride: the offset of row i, then
// of each following row, over its leading dimensions in row-major order (an odometer).
class Rows {
 public:
  explicit Rows(const at::Tensor& t) {
    for (int64_t i = 0; i + 1 < t.dim(); ++i) {
      sizes_.push_back(t.size(i));
      strides_.push_back(t.stride(i));
    }
    index_.assign(sizes_.size(), 0);
  }
  void seek(int64_t row) {
    offset_ = 0;
    for (int64_t i = static_cast<int64_t>(sizes_.size()) - 1; i >= 0; --i) {
      index_[i] = row % sizes_[i];
      row /= sizes_[i];
      offset_ += index_[i] * strides_[i];
    }
  }
  void next() {
    for (int64_t i = static_cast<int64_t>(sizes_.size()) - 1; i >= 0; --i) {
      offset_ += strides_[i];
      if (++index_[i] < sizes_[i]) return;
      offset_ -= index_[i] * strides_[i];
      index_[i] = 0;
    }
  }
  int64_t offset() const { return offset_; }

 private:
  std::vector<int64_t> sizes_, strides_, index_;
  int64_t offset_ = 0;
};

template <typename T>
T lanes_sum(const Vectorized<T>& v) {
  T buf[Vectorized<T>::size()];
  v.store(buf);
  T s = 0;
  for (int64_t i = 0; i < Vectorized<T>::size(); ++i) s += buf[i];
  return s;
}

// Σ x over one row (Σ x² with squares).
template <typename T>
T row_sum(const T* x, int64_t d, bool squares) {
  using Vec = Vectorized<T>;
  Vec acc(0);
  int64_t j = 0;
  for (; j + Vec::size() <= d; j += Vec::size()) {
    Vec v = Vec::loadu(x + j);
    acc = squares ? at::vec::fmadd(v, v, acc) : acc + v;
  }
  T s = lanes_sum(acc);
  for (; j < d; ++j) s += squares ? x[j] * x[j] : x[j];
  return s;
}

// Σ (x − μ)² of one row: the variance after centring, with no cancellation.
template <typename T>
T centred_squares(const T* x, int64_t d, T mu) {
  using Vec = Vectorized<T>;
  Vec q(0), m(mu);
  int64_t j = 0;
  for (; j + Vec::size() <= d; j += Vec::size()) {
    Vec v = Vec::loadu(x + j) - m;
    q = at::vec::fmadd(v, v, q);
  }
  T qq = lanes_sum(q);
  for (; j < d; ++j) qq += (x[j] - mu) * (x[j] - mu);
  return qq;
}

// y = (x − shift)·r over one row.
template <typename T>
void shift_scale(const T* x, T* y, int64_t d, T shift, T r) {
  using Vec = Vectorized<T>;
  Vec s(shift), vr(r);
  int64_t j = 0;
  for (; j + Vec::size() <= d; j += Vec::size()) ((Vec::loadu(x + j) - s) * vr).store(y + j);
  for (; j < d; ++j) y[j] = (x[j] - shift) * r;
}

template <typename T>
void forward_rows(const at::Tensor& x, at::Tensor& y, at::Tensor& r, at::Tensor& dot_scale,
                  int64_t kind, double eps) {
  const int64_t d = x.size(-1), rows = y.numel() / d;
  const T* xp = x.data_ptr<T>();
  T* yp = y.data_ptr<T>();
  T* rp = r.data_ptr<T>();
  T* dsp = dot_scale.data_ptr<T>();
  const T e = static_cast<T>(eps), inv_d = T(1) / static_cast<T>(d);
  const int64_t grain = std::max<int64_t>(1, at::internal::GRAIN_SIZE / d);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    Rows in(x);
    in.seek(begin);
    for (int64_t i = begin; i < end; ++i, in.next()) {
      const T* row = xp + in.offset();
      T shift = 0, scale, ds;
      if (kind == kLayer) {
        shift = row_sum(row, d, false) * inv_d;
        scale = T(1) / std::sqrt(centred_squares(row, d, shift) * inv_d + e);
        ds = scale * inv_d;
      } else {
        const T sq = row_sum(row, d, true);
        if (kind == kRms) {
          scale = T(1) / std::sqrt(sq * inv_d + e);
          ds = scale * inv_d;
        } else {
          const T norm = std::sqrt(sq);
          scale = T(1) / std::max(norm, e);
          ds = norm > e ? scale : T(0);  // the clamp's derivative is 0
        }
      }
      shift_scale(row, yp + i * d, d, shift, scale);
      rp[i] = scale;
      dsp[i] = ds;
    }
  });
}

template <typename T>
void backward_rows(const at::Tensor& y, const at::Tensor& dy, const at::Tensor& r,
                   const at::Tensor& dot_scale, bool centred, at::Tensor& dx) {
  using Vec = Vectorized<T>;
  const int64_t d = y.size(-1), rows = y.numel() / d;
  const T* yp = y.data_ptr<T>();
  const T* dyp = dy.data_ptr<T>();
  const T* rp = r.data_ptr<T>();
  const T* dsp = dot_scale.data_ptr<T>();
  T* dxp = dx.data_ptr<T>();
  const T inv_d = T(1) / static_cast<T>(d);
  const int64_t grain = std::max<int64_t>(1, at::internal::GRAIN_SIZE / d);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    Rows grad(dy);
    grad.seek(begin);
    for (int64_t i = begin; i < end; ++i, grad.next()) {
      const T* yr = yp + i * d;
      const T* g = dyp + grad.offset();
      Vec s(0), p(0);
      int64_t j = 0;
      for (; j + Vec::size() <= d; j += Vec::size()) {
        Vec vg = Vec::loadu(g + j);
        if (centred) s = s + vg;
        p = at::vec::fmadd(Vec::loadu(yr + j), vg, p);
      }
      T sg = lanes_sum(s), py = lanes_sum(p);
      for (; j < d; ++j) {
        sg += g[j];
        py += yr[j] * g[j];
      }
      const T scale = rp[i], c = dsp[i] * py, m = centred ? scale * sg * inv_d : T(0);
      // dx = r·dy − c·y − m
      const Vec vr(scale), vc(-c), vm(-m);
      T* out = dxp + i * d;
      j = 0;
      for (; j + Vec::size() <= d; j += Vec::size()) {
        at::vec::fmadd(Vec::loadu(g + j), vr, at::vec::fmadd(Vec::loadu(yr + j), vc, vm))
            .store(out + j);
      }
      for (; j < d; ++j) out[j] = scale * g[j] - c * yr[j] - m;
    }
  });
}

void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, name,
              " must be float32 or float64");
  TORCH_CHECK(t.dim() >= 1 && t.size(-1) >= 1, name, " needs rows of at least one element");
  TORCH_CHECK(t.size(-1) == 1 || t.stride(-1) == 1, name,
              " needs a unit stride along its last dimension");
}

// (y, r, dot_scale): y contiguous with x's shape, r and dot_scale of shape x.shape[:-1].
std::tuple<at::Tensor, at::Tensor, at::Tensor> rows_forward(const at::Tensor& x, int64_t kind,
                                                            double eps) {
  check_rows(x, "x");
  TORCH_CHECK(kind == kLayer || kind == kRms || kind == kUnit, "kind must be 0, 1 or 2");
  auto y = at::empty(x.sizes(), x.options());
  auto lead = x.sizes().slice(0, x.dim() - 1);
  auto r = at::empty(lead, x.options()), dot_scale = at::empty(lead, x.options());
  if (y.numel() > 0) {
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rows_forward", [&] {
      forward_rows<scalar_t>(x, y, r, dot_scale, kind, eps);
    });
  }
  return {y, r, dot_scale};
}

// dx, contiguous with y's shape; y, r and dot_scale as rows_forward returned them.
at::Tensor rows_backward(const at::Tensor& y, const at::Tensor& dy, const at::Tensor& r,
                         const at::Tensor& dot_scale, bool centred) {
  check_rows(y, "y");
  check_rows(dy, "dy");
  TORCH_CHECK(y.is_contiguous() && r.is_contiguous() && dot_scale.is_contiguous(),
              "y, r and dot_scale must be contiguous (as rows_forward returns them)");
  TORCH_CHECK(dy.sizes() == y.sizes() && dy.scalar_type() == y.scalar_type() &&
                  r.scalar_type() == y.scalar_type() && dot_scale.scalar_type() == y.scalar_type(),
              "dy, r and dot_scale must match y");
  TORCH_CHECK(r.numel() * y.size(-1) == y.numel() && dot_scale.numel() == r.numel(),
              "r and dot_scale need one value per row of y");
  auto dx = at::empty(y.sizes(), y.options());
  if (y.numel() > 0) {
    AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "rows_backward", [&] {
      backward_rows<scalar_t>(y, dy, r, dot_scale, centred, dx);
    });
  }
  return dx;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &rows_forward, py::call_guard<py::gil_scoped_release>());
  m.def("backward", &rows_backward, py::call_guard<py::gil_scoped_release>());
  m.def("capability", [] { return std::string(ATTNSCALE_STR(CPU_CAPABILITY)); });
}
