// FactoredMatrix: a matrix kept as the product of two factors, with its norm, SVD and eigenvalues
// computed from the factors.
#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <vector>

#include <Eigen/Dense>
#include <autograd/autograd.hpp>

#include "nn/circuits.hpp"

namespace nn::circuits {

namespace {

using Matrix = Eigen::MatrixXd;
using RowMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

ag::Shape leading_of(const ag::Tensor& t) {
  const ag::Shape& s = t.shape();
  return ag::Shape(s.begin(), s.end() - 2);
}

ag::Shape with_last_two(ag::Shape lead, std::int64_t a, std::int64_t b) {
  lead.push_back(a);
  lead.push_back(b);
  return lead;
}

std::int64_t count_of(const ag::Shape& s) {
  std::int64_t n = 1;
  for (auto x : s) n *= x;
  return n;
}

// The batch of a (lead..., rows, cols) tensor as float64 matrices, one per leading index. The
// decompositions need finite entries (Eigen's SVD returns made-up values for NaN): `op` and
// `factor` name the call and the factor in the refusal.
std::vector<Matrix> batch_matrices(const ag::Tensor& t, const char* op, const char* factor) {
  const std::int64_t rows = t.size(-2), cols = t.size(-1);
  const std::int64_t n = count_of(leading_of(t));
  const ag::Tensor flat = ag::reshape(t.detach().to(ag::Dtype::Float64).clone(), {n, rows, cols});
  const double* p = flat.data<double>();
  for (std::int64_t i = 0; i < n * rows * cols; ++i)
    if (!std::isfinite(p[i]))
      ag::fail(op, "factor {} {} holds {} at flat index {}: its decomposition needs finite entries", factor,
               ag::shape_str(t.shape()), p[i], i);
  std::vector<Matrix> out;
  out.reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    out.emplace_back(Eigen::Map<const RowMatrix>(p + i * rows * cols, rows, cols));
  return out;
}

// Matrices (all rows x cols) back into a (lead..., rows, cols) tensor of `dtype`.
ag::Tensor from_batch(const std::vector<Matrix>& ms, const ag::Shape& lead, std::int64_t rows, std::int64_t cols,
                      ag::Dtype dtype) {
  std::vector<double> values;
  values.reserve(ms.size() * static_cast<std::size_t>(rows * cols));
  for (const auto& m : ms)
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) values.push_back(m(i, j));
  return ag::tensor(values, with_last_two(lead, rows, cols), ag::Dtype::Float64).to(dtype);
}

ag::Tensor vectors_to_tensor(const std::vector<Eigen::VectorXd>& vs, ag::Shape lead, std::int64_t k, ag::Dtype dtype) {
  std::vector<double> values;
  for (const auto& v : vs)
    for (std::int64_t i = 0; i < k; ++i) values.push_back(v(i));
  lead.push_back(k);
  return ag::tensor(values, lead, ag::Dtype::Float64).to(dtype);
}

struct ThinSvd {
  Matrix U;
  Eigen::VectorXd S;
  Matrix V;
};

ThinSvd thin_svd(const Matrix& m) {
  Eigen::JacobiSVD<Matrix> svd(m, Eigen::ComputeThinU | Eigen::ComputeThinV);
  return {svd.matrixU(), svd.singularValues(), svd.matrixV()};
}

}  // namespace

FactoredMatrix::FactoredMatrix(ag::Tensor A, ag::Tensor B) {
  constexpr const char* op = "circuits::FactoredMatrix";
  if (!A.defined() || !B.defined()) ag::fail(op, "needs two defined factors");
  if (A.dim() < 2 || B.dim() < 2)
    ag::fail(op, "factors must have at least 2 dims, got A {} and B {}", ag::shape_str(A.shape()),
             ag::shape_str(B.shape()));
  if (A.dtype() != B.dtype())
    ag::fail(op, "factors of different dtypes: A {} and B {}", ag::dtype_name(A.dtype()), ag::dtype_name(B.dtype()));
  if (A.dtype() == ag::Dtype::Int64) ag::fail(op, "needs Float32 or Float64 factors, got Int64");
  if (A.size(-1) != B.size(-2))
    ag::fail(op, "inner dimensions differ: A {} and B {}", ag::shape_str(A.shape()), ag::shape_str(B.shape()));
  if (A.size(-2) == 0 || A.size(-1) == 0 || B.size(-1) == 0)
    ag::fail(op, "the matrix dimensions must be positive, got A {} and B {}", ag::shape_str(A.shape()),
             ag::shape_str(B.shape()));
  const ag::Shape lead = ag::broadcast_shapes(op, leading_of(A), leading_of(B));
  const ag::Shape a_shape = with_last_two(lead, A.size(-2), A.size(-1));
  const ag::Shape b_shape = with_last_two(lead, B.size(-2), B.size(-1));
  A_ = A.shape() == a_shape ? A : ag::expand(A, a_shape);
  B_ = B.shape() == b_shape ? B : ag::expand(B, b_shape);
}

ag::Shape FactoredMatrix::shape() const { return with_last_two(leading_of(A_), ldim(), rdim()); }
ag::Shape FactoredMatrix::leading_shape() const { return leading_of(A_); }

ag::Tensor FactoredMatrix::AB() const { return ag::matmul(A_, B_); }

ag::Tensor FactoredMatrix::BA() const {
  if (ldim() != rdim())
    ag::fail("circuits::FactoredMatrix::BA", "needs a square matrix, got shape {}", ag::shape_str(shape()));
  return ag::matmul(B_, A_);
}

FactoredMatrix FactoredMatrix::T() const { return FactoredMatrix(ag::transpose(B_, -2, -1), ag::transpose(A_, -2, -1)); }

FactoredMatrix FactoredMatrix::matmul(const ag::Tensor& M) const {
  constexpr const char* op = "circuits::FactoredMatrix::matmul";
  if (!M.defined()) ag::fail(op, "the right operand is undefined");
  if (M.dim() < 2) ag::fail(op, "takes a matrix, got shape {} (use matvec for a vector)", ag::shape_str(M.shape()));
  if (M.size(-2) != rdim())
    ag::fail(op, "inner dimensions differ: {} x {}", ag::shape_str(shape()), ag::shape_str(M.shape()));
  if (rdim() > mdim()) return FactoredMatrix(A_, ag::matmul(B_, M));
  return FactoredMatrix(AB(), M);
}

ag::Tensor FactoredMatrix::matvec(const ag::Tensor& v) const {
  constexpr const char* op = "circuits::FactoredMatrix::matvec";
  if (!v.defined() || v.dim() != 1 || v.size(0) != rdim())
    ag::fail(op, "takes a vector of {} elements for shape {}, got {}", rdim(), ag::shape_str(shape()),
             v.defined() ? ag::shape_str(v.shape()) : std::string("an undefined tensor"));
  return ag::squeeze(ag::matmul(A_, ag::matmul(B_, ag::unsqueeze(v, -1))), -1);
}

FactoredMatrix FactoredMatrix::rmatmul(const ag::Tensor& M) const {
  constexpr const char* op = "circuits::FactoredMatrix::rmatmul";
  if (!M.defined()) ag::fail(op, "the left operand is undefined");
  if (M.dim() < 2) ag::fail(op, "takes a matrix, got shape {} (use vecmat for a vector)", ag::shape_str(M.shape()));
  if (M.size(-1) != ldim())
    ag::fail(op, "inner dimensions differ: {} x {}", ag::shape_str(M.shape()), ag::shape_str(shape()));
  if (ldim() > mdim()) return FactoredMatrix(ag::matmul(M, A_), B_);
  return FactoredMatrix(M, AB());
}

ag::Tensor FactoredMatrix::vecmat(const ag::Tensor& v) const {
  constexpr const char* op = "circuits::FactoredMatrix::vecmat";
  if (!v.defined() || v.dim() != 1 || v.size(0) != ldim())
    ag::fail(op, "takes a vector of {} elements for shape {}, got {}", ldim(), ag::shape_str(shape()),
             v.defined() ? ag::shape_str(v.shape()) : std::string("an undefined tensor"));
  return ag::squeeze(ag::matmul(ag::matmul(ag::unsqueeze(v, -2), A_), B_), -2);
}

FactoredMatrix FactoredMatrix::matmul(const FactoredMatrix& other) const {
  if (other.ldim() != rdim())
    ag::fail("circuits::FactoredMatrix::matmul", "inner dimensions differ: {} x {}", ag::shape_str(shape()),
             ag::shape_str(other.shape()));
  return matmul(other.A_).matmul(other.B_);
}

FactoredMatrix FactoredMatrix::scaled(double s) const { return FactoredMatrix(A_ * s, B_); }

FactoredMatrix FactoredMatrix::operator[](std::int64_t index) const {
  constexpr const char* op = "circuits::FactoredMatrix::operator[]";
  if (A_.dim() < 3) ag::fail(op, "a matrix of shape {} has no leading dim to index", ag::shape_str(shape()));
  const std::int64_t n = A_.size(0);
  const std::int64_t i = index < 0 ? index + n : index;
  if (i < 0 || i >= n) ag::fail(op, "index {} is out of range for a leading dim of {}", index, n);
  return FactoredMatrix(ag::squeeze(ag::narrow(A_, 0, i, 1), 0), ag::squeeze(ag::narrow(B_, 0, i, 1), 0));
}

FactoredMatrix FactoredMatrix::unsqueeze(std::int64_t dim) const {
  const std::int64_t lead = A_.dim() - 2;
  const std::int64_t d = dim < 0 ? dim + lead + 1 : dim;
  if (d < 0 || d > lead)
    ag::fail("circuits::FactoredMatrix::unsqueeze", "dim {} is out of range for {} leading dims (shape {})", dim,
             lead, ag::shape_str(shape()));
  return FactoredMatrix(ag::unsqueeze(A_, d), ag::unsqueeze(B_, d));
}

ag::Tensor FactoredMatrix::norm() const {
  // ‖AB‖² = tr(Bᵀ AᵀA B) = Σ_ij (AᵀA)_ij (BBᵀ)_ij  [r x r], of the factors scaled to a largest
  // magnitude near 1 (the Gram products of factors like 1e-20 and 1e20 would underflow or overflow
  // though AB is finite) and scaled back: ‖AB‖ = sa·sb·‖(A/sa)(B/sb)‖.
  double sa = 1.0, sb = 1.0;
  {
    ag::NoGradGuard no_grad;
    const double ma = ag::max(ag::abs(A_)).item(), mb = ag::max(ag::abs(B_)).item();
    // powers of two, so the scaling itself rounds nothing
    if (std::isfinite(ma) && ma > 0.0 && std::isfinite(mb) && mb > 0.0)
      sa = std::ldexp(1.0, std::ilogb(ma)), sb = std::ldexp(1.0, std::ilogb(mb));
  }
  const ag::Tensor a = sa == 1.0 ? A_ : A_ / sa, b = sb == 1.0 ? B_ : B_ / sb;
  const ag::Tensor gram_a = ag::matmul(ag::transpose(a, -2, -1), a);  // (..., r, r)
  const ag::Tensor gram_b = ag::matmul(b, ag::transpose(b, -2, -1));  // (..., r, r)
  const ag::Tensor sq = ag::sum(gram_a * gram_b, {-2, -1});
  // Rounding can leave a tiny negative sum for a product that is 0.
  const ag::Tensor n = ag::sqrt(ag::clamp(sq, 0.0, INFINITY));
  return sa == 1.0 && sb == 1.0 ? n : n * sa * sb;
}

FactoredSvd FactoredMatrix::svd() const {
  constexpr const char* op = "circuits::FactoredMatrix::svd";
  const std::vector<Matrix> as = batch_matrices(A_, op, "A"), bs = batch_matrices(B_, op, "B");
  const std::int64_t m = ldim(), n = rdim();
  const std::int64_t k = std::min({m, mdim(), n});
  std::vector<Matrix> Us, Vs;
  std::vector<Eigen::VectorXd> Ss;
  for (std::size_t i = 0; i < as.size(); ++i) {
    // A = Ua Sa Vaᵀ, B = Ub Sb Vbᵀ  =>  AB = Ua (Sa Vaᵀ Ub Sb) Vbᵀ, and the middle factor's SVD
    // Um Sm Vmᵀ gives AB = (Ua Um) Sm (Vb Vm)ᵀ.
    const ThinSvd a = thin_svd(as[i]), b = thin_svd(bs[i]);
    const Matrix middle = a.S.asDiagonal() * a.V.transpose() * b.U * b.S.asDiagonal();
    const ThinSvd mid = thin_svd(middle);
    Us.push_back((a.U * mid.U).leftCols(k));
    Ss.push_back(mid.S.head(k));
    Vs.push_back((b.V * mid.V).leftCols(k));
  }
  const ag::Shape lead = leading_shape();
  const ag::Dtype dt = A_.dtype();
  return {from_batch(Us, lead, m, k, dt), vectors_to_tensor(Ss, lead, k, dt), from_batch(Vs, lead, n, k, dt)};
}

FactoredEigenvalues FactoredMatrix::eigenvalues() const {
  if (ldim() != rdim())
    ag::fail("circuits::FactoredMatrix::eigenvalues", "needs a square matrix, got shape {}", ag::shape_str(shape()));
  const std::vector<Matrix> as = batch_matrices(A_, "circuits::FactoredMatrix::eigenvalues", "A"),
                            bs = batch_matrices(B_, "circuits::FactoredMatrix::eigenvalues", "B");
  const std::int64_t r = mdim();
  std::vector<Eigen::VectorXd> re, im;
  for (std::size_t i = 0; i < as.size(); ++i) {
    const Matrix ba = bs[i] * as[i];  // (r, r): its eigenvalues are AB's nonzero ones
    Eigen::EigenSolver<Matrix> solver(ba, /*computeEigenvectors=*/false);
    if (solver.info() != Eigen::Success)
      ag::fail("circuits::FactoredMatrix::eigenvalues", "the eigenvalue solver did not converge on matrix {}", i);
    std::vector<std::complex<double>> ev(solver.eigenvalues().data(), solver.eigenvalues().data() + r);
    std::sort(ev.begin(), ev.end(), [](const std::complex<double>& x, const std::complex<double>& y) {
      const double ax = std::abs(x), ay = std::abs(y);
      if (ax != ay) return ax > ay;
      if (x.real() != y.real()) return x.real() > y.real();
      return x.imag() > y.imag();
    });
    Eigen::VectorXd rv(r), iv(r);
    for (std::int64_t j = 0; j < r; ++j) rv(j) = ev[static_cast<std::size_t>(j)].real(), iv(j) = ev[static_cast<std::size_t>(j)].imag();
    re.push_back(rv);
    im.push_back(iv);
  }
  const ag::Shape lead = leading_shape();
  return {vectors_to_tensor(re, lead, r, A_.dtype()), vectors_to_tensor(im, lead, r, A_.dtype())};
}

std::vector<std::complex<double>> FactoredEigenvalues::values() const {
  const std::vector<double> re = real.to_vector(), im = imag.to_vector();
  std::vector<std::complex<double>> out(re.size());
  for (std::size_t i = 0; i < re.size(); ++i) out[i] = {re[i], im[i]};
  return out;
}

ag::Tensor FactoredMatrix::collapse_l() const {
  const FactoredSvd s = svd();
  return ag::unsqueeze(s.S, -1) * ag::transpose(s.V, -2, -1);  // (..., k, n)
}

ag::Tensor FactoredMatrix::collapse_r() const {
  const FactoredSvd s = svd();
  return s.U * ag::unsqueeze(s.S, -2);  // (..., m, k)
}

FactoredMatrix FactoredMatrix::make_even() const {
  const FactoredSvd s = svd();
  const ag::Tensor root = ag::sqrt(s.S);
  return FactoredMatrix(s.U * ag::unsqueeze(root, -2), ag::unsqueeze(root, -1) * ag::transpose(s.V, -2, -1));
}

}  // namespace nn::circuits
