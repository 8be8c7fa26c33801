// ag::jvp, ag::vjp, ag::jacobian and ag::hessian, in float64, through matmul, softmax, layer_norm,
// the attention ops and nn::MultiHeadAttention: jvp against central differences (Richardson-
// extrapolated), the dot-product identity ⟨u, J v⟩ = ⟨Jᵀu, v⟩, forward-mode Jacobians against
// reverse-mode ones and against finite differences, Hessians symmetric and equal to finite
// differences of the gradient, and every transform against torch.func on the committed fixture
// tests/data/transforms_reference.txt (written by tests/data/make_transforms_reference.py). Each
// checker has a negative control that must fail it. Bad arguments throw messages naming the
// transform and the shapes.
#define BOOST_TEST_MODULE transforms
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <Eigen/Core>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

#include "test_support.hpp"

using namespace test_support::prelude;

namespace {

// ---- the functions under test ----

Tensor randn64(const Shape& shape, std::uint64_t seed) {
  ag::Generator gen(seed);
  return ag::randn(shape, Dtype::Float64, gen);
}

TensorList randn_like(const TensorList& like, std::uint64_t seed) {
  TensorList out;
  for (const auto& t : like) out.push_back(randn64(t.shape(), seed++));
  return out;
}

struct Case {
  std::string name;
  ag::TensorListFn fn;
  TensorList inputs;
};

TensorList f_matmul(const TensorList& x) {
  return {ag::matmul(ag::tanh(x[0]), x[1]), ag::sum(ag::square(ag::matmul(x[0], x[1])))};
}
TensorList f_softmax(const TensorList& x) { return {ag::softmax(ag::matmul(x[0], x[1]), -1)}; }
TensorList f_layer_norm(const TensorList& x) { return {ag::layer_norm(x[0], {x[0].size(-1)}, x[1], x[2])}; }
TensorList f_attention_causal(const TensorList& x) {
  return {ag::scaled_dot_product_attention(x[0], x[1], x[2], {.is_causal = true}).output};
}

// The cases of the finite-difference and dot-product checks.
std::vector<Case> cases() {
  std::vector<Case> c;
  c.push_back({"matmul", f_matmul, {randn64({3, 4}, 1), randn64({4, 2}, 2)}});
  c.push_back({"softmax", f_softmax, {randn64({2, 3, 4}, 3), randn64({4, 5}, 4)}});
  c.push_back({"layer_norm", f_layer_norm, {randn64({3, 5}, 5), randn64({5}, 6), randn64({5}, 7)}});
  // Both results of the attention op (output and weights), with a learned additive mask.
  c.push_back({"attention (output and weights, learned mask)",
               [](const TensorList& x) {
                 const auto r = ag::scaled_dot_product_attention(x[0], x[1], x[2], {.attn_mask = x[3]});
                 return TensorList{r.output, r.weights};
               },
               {randn64({2, 2, 3, 2}, 8), randn64({2, 2, 4, 2}, 9), randn64({2, 2, 4, 3}, 10), randn64({3, 4}, 11)}});
  c.push_back({"attention causal", f_attention_causal,
               {randn64({1, 2, 3, 2}, 12), randn64({1, 2, 3, 2}, 13), randn64({1, 2, 3, 2}, 14)}});
  c.push_back({"attention heads-last",
               [](const TensorList& x) {
                 return TensorList{ag::scaled_dot_product_attention_heads_last(x[0], x[1], x[2], 2).output};
               },
               {randn64({2, 3, 4}, 15), randn64({2, 4, 4}, 16), randn64({2, 4, 6}, 17)}});
  c.push_back(
      {"attention packed, causal, no weights",
       [](const TensorList& x) {
         return TensorList{
             ag::scaled_dot_product_attention_packed(x[0], 2, {.need_weights = false, .is_causal = true}).output};
       },
       {randn64({2, 3, 12}, 18)}});
  return c;
}

// Every op family of ops.hpp, several results per function. The kinks of relu, abs, clamp, max and
// maximum are more than the differencing step away from the random points (clamp's bounds ±0.4 are
// chosen so: x holds 0.4998, which ±0.5 would put within 1e-3 of a kink).
std::vector<Case> op_sweep_cases() {
  const Tensor x = randn64({3, 4}, 21), y = randn64({3, 4}, 22), w = randn64({4, 3}, 23), b = randn64({3}, 24);
  const auto positive = [](const Tensor& t) { return ag::square(t) + 0.5; };
  std::vector<Case> c;
  c.push_back({"unary",
               [positive](const TensorList& a) {
                 const Tensor& t = a[0];
                 return TensorList{ag::exp(t),  ag::log(positive(t)), ag::sqrt(positive(t)), ag::rsqrt(positive(t)),
                                   ag::tanh(t), ag::sigmoid(t),       ag::gelu(t),
                                   ag::gelu(t, ag::GeluApproximation::Tanh),
                                   ag::abs(t),  ag::relu(t),          ag::clamp(t, -0.4, 0.4), -t};
               },
               {x}});
  c.push_back({"binary",
               [positive](const TensorList& a) {
                 const Tensor &s = a[0], &t = a[1];
                 return TensorList{s + t, s - t, s * t, s / positive(t), ag::pow(positive(s), t), ag::maximum(s, t),
                                   ag::minimum(s, t), ag::pow(s, 3.0), ag::rdiv(positive(s), 2.0), 2.0 - s * 0.5,
                                   s + ag::sum(t, 0)};
               },
               {x, y}});
  c.push_back({"selection",
               [](const TensorList& a) {
                 const Tensor mask = ag::gt(a[1].detach(), 0.0);
                 return TensorList{ag::masked_fill(a[0], mask, 1.5), ag::where(mask, a[0], a[1] * 2.0)};
               },
               {x, y}});
  c.push_back({"reductions",
               [](const TensorList& a) {
                 const Tensor& t = a[0];
                 return TensorList{ag::sum(t, 1), ag::mean(t, 0, true), ag::max(t, 1), ag::max(t), ag::mean(t),
                                   ag::sum(t, std::vector<std::int64_t>{0, 1})};
               },
               {x}});
  c.push_back({"shape and join",
               [](const TensorList& a) {
                 const Tensor &s = a[0], &t = a[1], &bias = a[2];
                 return TensorList{ag::reshape(s, {4, 3}) * 2.0,  ag::transpose(s, 0, 1) * ag::sum(t),
                                   ag::permute(ag::unsqueeze(s, 0), {2, 0, 1}) * 1.5, ag::cat({s, t * s}, 0),
                                   ag::stack({s, t}, 1),           ag::split(s * t, 2, 1)[1],
                                   ag::narrow(s, 1, 1, 2),         ag::slice(t * t, 1, 0, 4, 2),
                                   ag::expand(ag::unsqueeze(bias, 0), {2, 3}) * bias, ag::flatten(s * s),
                                   ag::squeeze(ag::unsqueeze(bias * bias, 1))};
               },
               {x, y, b}});
  c.push_back({"indexing",
               [](const TensorList& a) {
                 const Tensor index = ag::tensor(std::vector<std::int64_t>{2, 0, 1, 1, 3, 0}, {3, 2});
                 const Tensor ids = ag::tensor(std::vector<std::int64_t>{3, 1, 3}, {3});
                 return TensorList{ag::index_select(a[0] * a[0], 1, std::vector<std::int64_t>{2, 0, 2}),
                                   ag::gather(ag::tanh(a[0]), 1, index), ag::embedding(a[1] * a[1], ids)};
               },
               {x, w}});
  c.push_back({"linear",
               [](const TensorList& a) {
                 const std::vector<Tensor> weights = {a[1], a[1] * a[1]}, biases = {a[2], Tensor()};
                 return TensorList{ag::linear(a[0], a[1], a[2]), ag::linear_cat(a[0], weights, biases),
                                   ag::matmul(a[0], ag::matmul(a[1], ag::sum(a[1]) * a[2]))};
               },
               {x, w, b}});
  c.push_back({"log_softmax and cross_entropy",
               [](const TensorList& a) {
                 const Tensor targets = ag::tensor(std::vector<std::int64_t>{1, 3, 0}, {3});
                 ag::CrossEntropyOptions smooth;
                 smooth.label_smoothing = 0.1;
                 smooth.reduction = ag::Reduction::None;
                 return TensorList{ag::log_softmax(a[0], 0), ag::cross_entropy(a[0], targets),
                                   ag::cross_entropy(a[0] * a[0], targets, smooth), ag::softmax(a[0], 0)};
               },
               {x}});
  return c;
}

// All results of fn, flattened and laid end to end: one output, for jacobian and hessian.
ag::GradcheckFn concatenated(const ag::TensorListFn& fn) {
  return [fn](const TensorList& x) {
    TensorList flat;
    for (const auto& y : fn(x)) flat.push_back(ag::flatten(ag::reshape(y, {-1})));
    return ag::cat(flat, 0);
  };
}

// nn::MultiHeadAttention(8, 2) in float64, self-attention on its input x (B, T, 8).
struct MhaCase {
  ag::Generator gen{42};
  nn::MultiHeadAttention mha{nn::MultiHeadAttentionOptions{.embed_dim = 8, .num_heads = 2, .dtype = Dtype::Float64},
                             gen};
  ag::TensorListFn fn() {
    return [this](const TensorList& x) { return TensorList{mha.forward(x[0], x[0], x[0]).output}; };
  }
};

// ---- numerical derivatives ----

TensorList evaluate(const ag::TensorListFn& fn, const TensorList& x) {
  ag::NoGradGuard no_grad;
  return fn(x);
}

TensorList shifted(const TensorList& x, const TensorList& v, double h) {
  ag::NoGradGuard no_grad;
  TensorList out;
  for (std::size_t i = 0; i < x.size(); ++i) out.push_back(x[i] + v[i] * h);
  return out;
}

using Values = std::vector<std::vector<double>>;  // one vector per output

// The directional derivative of fn at x along v by central differences D(h) = (f(x + hv) − f(x − hv)) / 2h,
// Richardson-extrapolated: (4·D(h/2) − D(h)) / 3 cancels the h² term, leaving O(h⁴) truncation
// (1e-12 at h = 1e-3) against rounding of order 1e-16 / h.
Values numeric_jvp(const ag::TensorListFn& fn, const TensorList& x, const TensorList& v, double h = 1e-3) {
  const auto central = [&](double step) {
    const TensorList plus = evaluate(fn, shifted(x, v, step)), minus = evaluate(fn, shifted(x, v, -step));
    Values d;
    for (std::size_t j = 0; j < plus.size(); ++j) {
      const auto p = plus[j].to_vector(), m = minus[j].to_vector();
      std::vector<double> dj(p.size());
      for (std::size_t k = 0; k < p.size(); ++k) dj[k] = (p[k] - m[k]) / (2 * step);
      d.push_back(dj);
    }
    return d;
  };
  const Values coarse = central(h), fine = central(h / 2);
  Values r = fine;
  for (std::size_t j = 0; j < r.size(); ++j)
    for (std::size_t k = 0; k < r[j].size(); ++k) r[j][k] = (4 * fine[j][k] - coarse[j][k]) / 3;
  return r;
}

// max |a − n| / max |n| over every element of every output.
double relative_error(const TensorList& a, const Values& n) {
  BOOST_REQUIRE_EQUAL(a.size(), n.size());
  double worst = 0, scale = 0;
  for (std::size_t j = 0; j < a.size(); ++j) {
    const auto v = a[j].to_vector();
    BOOST_REQUIRE_EQUAL(v.size(), n[j].size());
    for (std::size_t k = 0; k < v.size(); ++k) {
      worst = std::max(worst, std::abs(v[k] - n[j][k]));
      scale = std::max(scale, std::abs(n[j][k]));
    }
  }
  BOOST_REQUIRE_MESSAGE(scale > 0, "the numerical derivative is zero throughout: nothing is checked");
  return worst / scale;
}

// max |a − b| / max |b| over two tensors of one shape.
double relative_error(const Tensor& a, const Tensor& b) {
  BOOST_REQUIRE(a.defined() && b.defined());
  BOOST_REQUIRE_MESSAGE(a.shape() == b.shape(), ag::shape_str(a.shape()) << " vs " << ag::shape_str(b.shape()));
  const auto x = a.to_vector(), y = b.to_vector();
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    BOOST_REQUIRE(std::isfinite(x[i]));
    worst = std::max(worst, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  BOOST_REQUIRE_MESSAGE(scale > 0, "the reference is zero throughout: nothing is checked");
  return worst / scale;
}

double inner(const TensorList& a, const TensorList& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto x = a[i].to_vector(), y = b[i].to_vector();
    for (std::size_t k = 0; k < x.size(); ++k) s += x[k] * y[k];
  }
  return s;
}

constexpr double kFiniteDifferenceTol = 1e-9;  // relative, against the Richardson-extrapolated differences
constexpr double kExactTol = 1e-12;            // identities that hold to rounding

// The jvp checker: relative error of ag::jvp(fn, x, v_claimed) against central differences along v.
double jvp_error(const ag::TensorListFn& fn, const TensorList& x, const TensorList& v, const TensorList& v_claimed) {
  const ag::JvpResult r = ag::jvp(fn, x, v_claimed);
  const TensorList y = evaluate(fn, x);
  BOOST_REQUIRE_EQUAL(r.outputs.size(), y.size());
  for (std::size_t j = 0; j < y.size(); ++j) BOOST_TEST(test_support::max_abs_diff(r.outputs[j], y[j]) <= 1e-14);
  return relative_error(r.tangents, numeric_jvp(fn, x, v));
}


// The Jacobian of fn's first output by Richardson-extrapolated central differences, one column per
// input element, shaped output.shape ++ input.shape like ag::jacobian's.
TensorList numeric_jacobian(const ag::GradcheckFn& fn, const TensorList& x) {
  const ag::TensorListFn list_fn = [&](const TensorList& a) { return TensorList{fn(a)}; };
  const Tensor y = evaluate(list_fn, x)[0];
  TensorList J;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::int64_t N = x[i].numel(), M = y.numel();
    std::vector<double> values(static_cast<std::size_t>(M * N));
    for (std::int64_t n = 0; n < N; ++n) {
      TensorList v;
      for (std::size_t c = 0; c < x.size(); ++c) v.push_back(ag::zeros(x[c].shape(), Dtype::Float64));
      v[i].data<double>()[n] = 1;
      const Values d = numeric_jvp(list_fn, x, v);
      for (std::int64_t m = 0; m < M; ++m) values[static_cast<std::size_t>(m * N + n)] = d[0][static_cast<std::size_t>(m)];
    }
    Shape shape = y.shape();
    for (auto s : x[i].shape()) shape.push_back(s);
    J.push_back(ag::tensor(values, shape, Dtype::Float64));
  }
  return J;
}

// The gradient of a scalar fn at x, by ag::grad (independent of the transforms).
TensorList gradient(const ag::GradcheckFn& fn, const TensorList& x) {
  TensorList leaves;
  for (const auto& t : x) leaves.push_back(t.detach().clone().requires_grad_());
  const Tensor y = fn(leaves);
  ag::GradOptions o;
  o.allow_unused = true;
  TensorList g = ag::grad({y}, leaves, o);
  for (std::size_t i = 0; i < g.size(); ++i)
    if (!g[i].defined()) g[i] = ag::zeros(x[i].shape(), Dtype::Float64);
  return g;
}

// A list of Hessian blocks H[i][j] as one matrix over the inputs laid end to end.
Eigen::MatrixXd assemble(const std::vector<TensorList>& H, const TensorList& x) {
  std::int64_t N = 0;
  std::vector<std::int64_t> offset;
  for (const auto& t : x) offset.push_back(N), N += t.numel();
  Eigen::MatrixXd M(N, N);
  for (std::size_t i = 0; i < x.size(); ++i)
    for (std::size_t j = 0; j < x.size(); ++j) {
      const auto v = H[i][j].to_vector();
      BOOST_REQUIRE_EQUAL(static_cast<std::int64_t>(v.size()), x[i].numel() * x[j].numel());
      for (std::int64_t a = 0; a < x[i].numel(); ++a)
        for (std::int64_t b = 0; b < x[j].numel(); ++b)
          M(offset[i] + a, offset[j] + b) = v[static_cast<std::size_t>(a * x[j].numel() + b)];
    }
  return M;
}

// d(gradient)/dx by Richardson-extrapolated central differences of ag::grad, column by column.
Eigen::MatrixXd numeric_hessian(const ag::GradcheckFn& fn, const TensorList& x, double h = 1e-3) {
  std::int64_t N = 0;
  for (const auto& t : x) N += t.numel();
  Eigen::MatrixXd M(N, N);
  std::int64_t col = 0;
  const auto flat = [](const TensorList& g) {
    std::vector<double> out;
    for (const auto& t : g)
      for (double v : t.to_vector()) out.push_back(v);
    return out;
  };
  for (std::size_t i = 0; i < x.size(); ++i)
    for (std::int64_t n = 0; n < x[i].numel(); ++n, ++col) {
      TensorList v;
      for (const auto& t : x) v.push_back(ag::zeros(t.shape(), Dtype::Float64));
      v[i].data<double>()[n] = 1;
      const auto central = [&](double step) {
        const auto p = flat(gradient(fn, shifted(x, v, step))), m = flat(gradient(fn, shifted(x, v, -step)));
        std::vector<double> d(p.size());
        for (std::size_t k = 0; k < p.size(); ++k) d[k] = (p[k] - m[k]) / (2 * step);
        return d;
      };
      const auto coarse = central(h), fine = central(h / 2);
      for (std::int64_t r = 0; r < N; ++r)
        M(r, col) = (4 * fine[static_cast<std::size_t>(r)] - coarse[static_cast<std::size_t>(r)]) / 3;
    }
  return M;
}

double relative_error(const Eigen::MatrixXd& a, const Eigen::MatrixXd& b) {
  BOOST_REQUIRE(b.cwiseAbs().maxCoeff() > 0);
  return (a - b).cwiseAbs().maxCoeff() / b.cwiseAbs().maxCoeff();
}

// The symmetry checker: max |H − Hᵀ| / max |H|.
double asymmetry(const Eigen::MatrixXd& H) {
  BOOST_REQUIRE(H.rows() == H.cols());
  BOOST_REQUIRE(H.cwiseAbs().maxCoeff() > 0);
  return (H - H.transpose()).cwiseAbs().maxCoeff() / H.cwiseAbs().maxCoeff();
}

// The scalar of the Hessian checks: L(x) = Σ c·y0 + ½ Σ y0², y0 the first output of fn.
ag::GradcheckFn scalar_of(const ag::TensorListFn& fn, const Tensor& c) {
  return [fn, c](const TensorList& x) {
    const Tensor y = fn(x)[0];
    return ag::sum(c * y) + 0.5 * ag::sum(ag::square(y));
  };
}

ag::GradcheckFn first_output(const ag::TensorListFn& fn) {
  return [fn](const TensorList& x) { return fn(x)[0]; };
}

// ---- the torch.func fixture (the format of tests/data/mha_*.txt) ----

struct Reference {
  std::map<std::string, std::int64_t> config;
  std::map<std::string, Tensor> tensors;
  std::int64_t cfg(const std::string& key) const {
    auto it = config.find(key);
    if (it == config.end()) throw std::runtime_error("reference file lacks config " + key);
    return it->second;
  }
  const Tensor& at(const std::string& name) const {
    auto it = tensors.find(name);
    if (it == tensors.end()) throw std::runtime_error("reference file lacks tensor " + name);
    return it->second;
  }
};

const Reference& reference() {
  static const Reference ref = [] {
    const std::string path = std::string(HEADGRAD_TEST_DATA_DIR) + "/transforms_reference.txt";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path + " (run tests/data/make_transforms_reference.py)");
    Reference r;
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      std::istringstream ss(line);
      std::string kind, name;
      ss >> kind >> name;
      if (kind == "config") {
        std::int64_t v;
        ss >> v;
        r.config[name] = v;
      } else if (kind == "tensor") {
        std::int64_t ndim;
        ss >> ndim;
        Shape shape(static_cast<std::size_t>(ndim));
        for (auto& d : shape) ss >> d;
        std::vector<double> values(static_cast<std::size_t>(ag::shape_numel(shape)));
        for (auto& v : values) {
          std::string token;
          ss >> token;
          v = std::strtod(token.c_str(), nullptr);
        }
        if (!ss) throw std::runtime_error("short tensor line for " + name + " in " + path);
        r.tensors[name] = ag::tensor(values, shape, Dtype::Float64);
      }
    }
    return r;
  }();
  return ref;
}

// The fixture's functions, as the script writes them in torch.
ag::TensorListFn reference_function(const std::string& name) {
  if (name == "matmul") return f_matmul;
  if (name == "softmax") return f_softmax;
  if (name == "layer_norm") return f_layer_norm;
  if (name == "attention") return f_attention_causal;
  throw std::runtime_error("no function for reference case " + name);
}

TensorList reference_list(const std::string& prefix, std::int64_t n) {
  TensorList out;
  for (std::int64_t i = 0; i < n; ++i) out.push_back(reference().at(fmt::format("{}.{}", prefix, i)));
  return out;
}

constexpr double kTorchTol = 1e-10;

// The worst relative error of every transform of fn at the fixture's inputs against torch.func.
double error_against_torch(const std::string& name, const ag::TensorListFn& fn) {
  const Reference& ref = reference();
  const std::int64_t n_in = ref.cfg(name + ".inputs"), n_out = ref.cfg(name + ".outputs");
  const TensorList x = reference_list(name + ".input", n_in);
  const TensorList t = reference_list(name + ".tangent", n_in);
  const TensorList u = reference_list(name + ".cotangent", n_out);
  double worst = 0;
  const auto note = [&](const std::string& what, double e) {
    BOOST_TEST_MESSAGE(fmt::format("{} {}: relative error {:.3g} against torch.func", name, what, e));
    worst = std::max(worst, e);
  };
  const ag::JvpResult j = ag::jvp(fn, x, t);
  BOOST_REQUIRE_EQUAL(static_cast<std::int64_t>(j.tangents.size()), n_out);
  for (std::int64_t k = 0; k < n_out; ++k) {
    note(fmt::format("output {}", k), relative_error(j.outputs[static_cast<std::size_t>(k)],
                                                     ref.at(fmt::format("{}.output.{}", name, k))));
    note(fmt::format("jvp {}", k), relative_error(j.tangents[static_cast<std::size_t>(k)],
                                                  ref.at(fmt::format("{}.jvp.{}", name, k))));
  }
  const ag::VjpResult v = ag::vjp(fn, x, u);
  const TensorList Jr = ag::jacobian(first_output(fn), x);
  const TensorList Jf = ag::jacobian(first_output(fn), x, {.mode = ag::JacobianMode::Forward});
  const auto H = ag::hessian(scalar_of(fn, ref.at(name + ".weights")), x);
  for (std::int64_t i = 0; i < n_in; ++i) {
    const auto s = static_cast<std::size_t>(i);
    note(fmt::format("vjp {}", i), relative_error(v.cotangents[s], ref.at(fmt::format("{}.vjp.{}", name, i))));
    note(fmt::format("jacobian (reverse) {} vs jacrev", i),
         relative_error(Jr[s], ref.at(fmt::format("{}.jacobian.{}", name, i))));
    note(fmt::format("jacobian (forward) {} vs jacfwd", i),
         relative_error(Jf[s], ref.at(fmt::format("{}.jacfwd.{}", name, i))));
    for (std::int64_t k = 0; k < n_in; ++k) {
      const Tensor& want = ref.at(fmt::format("{}.hessian.{}.{}", name, i, k));
      if (want.to_vector() == std::vector<double>(static_cast<std::size_t>(want.numel()), 0.0)) {
        BOOST_TEST(test_support::max_abs_diff(H[s][static_cast<std::size_t>(k)], want) == 0.0);
        continue;
      }
      note(fmt::format("hessian {} {}", i, k), relative_error(H[s][static_cast<std::size_t>(k)], want));
    }
  }
  return worst;
}

}  // namespace

// ---- jvp against central differences ----

BOOST_AUTO_TEST_CASE(jvp_matches_central_differences_through_every_op) {
  for (const Case& c : cases()) {
    const TensorList v = randn_like(c.inputs, 100);
    const double e = jvp_error(c.fn, c.inputs, v, v);
    BOOST_TEST_MESSAGE(fmt::format("jvp {}: relative error {:.3g} against central differences", c.name, e));
    BOOST_TEST(e <= kFiniteDifferenceTol, c.name << ": " << e);
  }
}

BOOST_AUTO_TEST_CASE(jvp_matches_central_differences_through_multi_head_attention) {
  MhaCase m;
  const TensorList x = {randn64({2, 3, 8}, 200)};
  const TensorList v = randn_like(x, 201);
  const double e = jvp_error(m.fn(), x, v, v);
  BOOST_TEST_MESSAGE(fmt::format("jvp MultiHeadAttention: relative error {:.3g}", e));
  BOOST_TEST(e <= kFiniteDifferenceTol, e);
}

// Negative control: the checker fails a jvp taken along a tangent other than the one differenced.
BOOST_AUTO_TEST_CASE(jvp_checker_fails_a_wrong_tangent) {
  for (const Case& c : cases()) {
    const TensorList v = randn_like(c.inputs, 100);
    TensorList wrong = v;
    wrong.back() = v.back() * 1.01;  // one tangent 1% off
    const double e = jvp_error(c.fn, c.inputs, v, wrong);
    BOOST_TEST_MESSAGE(fmt::format("jvp {} along a wrong tangent: relative error {:.3g}", c.name, e));
    BOOST_TEST(e > 1e3 * kFiniteDifferenceTol, c.name << ": " << e);
  }
}

// ---- the dot-product test ----

BOOST_AUTO_TEST_CASE(jvp_and_vjp_satisfy_the_dot_product_identity) {
  std::vector<Case> all = cases();
  MhaCase m;
  all.push_back({"MultiHeadAttention", m.fn(), {randn64({2, 3, 8}, 300)}});
  for (const Case& c : all) {
    const TensorList v = randn_like(c.inputs, 400);
    const ag::JvpResult j = ag::jvp(c.fn, c.inputs, v);
    const TensorList u = randn_like(j.outputs, 500);
    const ag::VjpResult r = ag::vjp(c.fn, c.inputs, u);
    const double lhs = inner(u, j.tangents), rhs = inner(r.cotangents, v);
    const double e = std::abs(lhs - rhs) / std::max(std::abs(lhs), std::abs(rhs));
    BOOST_TEST_MESSAGE(fmt::format("{}: <u, Jv> = {:.17g}, <J^T u, v> = {:.17g}, relative {:.3g}", c.name, lhs, rhs, e));
    BOOST_TEST(e <= kExactTol, c.name << ": " << e);
    // Negative control: another cotangent on one side breaks the identity.
    const ag::VjpResult other = ag::vjp(c.fn, c.inputs, randn_like(j.outputs, 600));
    const double wrong = inner(other.cotangents, v);
    BOOST_TEST(std::abs(lhs - wrong) / std::max(std::abs(lhs), std::abs(wrong)) > 1e-3, c.name);
  }
}

// ---- Jacobians ----

BOOST_AUTO_TEST_CASE(forward_and_reverse_jacobians_agree_and_match_finite_differences) {
  std::vector<Case> all = cases();
  MhaCase m;
  all.push_back({"MultiHeadAttention", m.fn(), {randn64({1, 3, 8}, 700)}});
  for (const Case& c : all) {
    const ag::GradcheckFn f = first_output(c.fn);
    const TensorList Jr = ag::jacobian(f, c.inputs);
    const TensorList Jf = ag::jacobian(f, c.inputs, {.mode = ag::JacobianMode::Forward});
    const TensorList Jn = numeric_jacobian(f, c.inputs);
    BOOST_REQUIRE_EQUAL(Jr.size(), c.inputs.size());
    for (std::size_t i = 0; i < c.inputs.size(); ++i) {
      Shape expected = evaluate(c.fn, c.inputs)[0].shape();
      for (auto s : c.inputs[i].shape()) expected.push_back(s);
      BOOST_TEST(ag::shape_str(Jr[i].shape()) == ag::shape_str(expected));
      const double fr = relative_error(Jf[i], Jr[i]), nr = relative_error(Jr[i], Jn[i]);
      BOOST_TEST_MESSAGE(fmt::format("{} input {}: forward vs reverse {:.3g}, reverse vs differences {:.3g}", c.name,
                                     i, fr, nr));
      BOOST_TEST(fr <= kExactTol, c.name << " input " << i << ": " << fr);
      BOOST_TEST(nr <= kFiniteDifferenceTol, c.name << " input " << i << ": " << nr);
    }
  }
}

// Negative control: the Jacobian of a slightly different function (its first input bent by
// x + 0.05·x², which no op here is invariant to, as layer_norm is to scaling) fails both comparisons.
BOOST_AUTO_TEST_CASE(jacobian_checkers_fail_a_wrong_function) {
  for (const Case& c : cases()) {
    const ag::GradcheckFn f = first_output(c.fn);
    const ag::GradcheckFn wrong = [f](const TensorList& x) {
      TensorList moved = x;
      moved[0] = x[0] + 0.05 * ag::square(x[0]);
      return f(moved);
    };
    const TensorList Jr = ag::jacobian(f, c.inputs);
    const TensorList Jw = ag::jacobian(wrong, c.inputs, {.mode = ag::JacobianMode::Forward});
    const TensorList Jn = numeric_jacobian(f, c.inputs);
    BOOST_TEST(relative_error(Jw[0], Jr[0]) > 1e-4, c.name);
    BOOST_TEST(relative_error(Jw[0], Jn[0]) > 1e-4, c.name);
  }
}

// ---- Hessians ----

BOOST_AUTO_TEST_CASE(hessians_are_symmetric_and_match_differences_of_the_gradient) {
  std::vector<Case> all = cases();
  MhaCase m;
  all.push_back({"MultiHeadAttention", m.fn(), {randn64({1, 3, 8}, 800)}});
  for (const Case& c : all) {
    const Tensor weights = randn64(evaluate(c.fn, c.inputs)[0].shape(), 900);
    const ag::GradcheckFn L = scalar_of(c.fn, weights);
    const Eigen::MatrixXd H = assemble(ag::hessian(L, c.inputs), c.inputs);
    const Eigen::MatrixXd N = numeric_hessian(L, c.inputs);
    const double s = asymmetry(H), e = relative_error(H, N);
    BOOST_TEST_MESSAGE(fmt::format("{}: Hessian {}x{}, asymmetry {:.3g}, vs differences of the gradient {:.3g}",
                                   c.name, H.rows(), H.cols(), s, e));
    BOOST_TEST(s <= kExactTol, c.name << ": " << s);
    BOOST_TEST(e <= kFiniteDifferenceTol, c.name << ": " << e);
  }
}

// Negative controls: a Jacobian that is not a Hessian fails the symmetry check, and the Hessian
// of another function fails the comparison with differences of this one's gradient.
BOOST_AUTO_TEST_CASE(hessian_checkers_fail_an_asymmetric_matrix_and_a_wrong_function) {
  const Tensor x = randn64({4}, 1000), W = randn64({4, 4}, 1001);
  const ag::GradcheckFn map = [W](const TensorList& a) { return ag::tanh(ag::matmul(W, a[0])); };
  const Tensor J = ag::jacobian(map, {x})[0];
  BOOST_TEST(asymmetry(assemble({{J}}, {x})) > 1e-2);

  const Case c = cases()[1];
  const Tensor weights = randn64(evaluate(c.fn, c.inputs)[0].shape(), 900);
  const ag::GradcheckFn L = scalar_of(c.fn, weights);
  const ag::GradcheckFn other = [L](const TensorList& a) { return L(a) + 0.01 * ag::sum(a[0] * a[0] * a[0]); };
  const Eigen::MatrixXd H = assemble(ag::hessian(other, c.inputs), c.inputs);
  BOOST_TEST(relative_error(H, numeric_hessian(L, c.inputs)) > 1e-4);
}

// ---- every op family ----

BOOST_AUTO_TEST_CASE(jvp_vjp_jacobian_and_hessian_through_every_op_family) {
  for (const Case& c : op_sweep_cases()) {
    const TensorList v = randn_like(c.inputs, 1100);
    const double e = jvp_error(c.fn, c.inputs, v, v);
    TensorList wrong = v;
    wrong[0] = v[0] * 1.01;
    const double e_wrong = jvp_error(c.fn, c.inputs, v, wrong);
    const ag::JvpResult j = ag::jvp(c.fn, c.inputs, v);
    const TensorList u = randn_like(j.outputs, 1200);
    const double lhs = inner(u, j.tangents), rhs = inner(ag::vjp(c.fn, c.inputs, u).cotangents, v);
    const double dot_error = std::abs(lhs - rhs) / std::max(std::abs(lhs), std::abs(rhs));
    const ag::GradcheckFn all = concatenated(c.fn);
    const TensorList Jr = ag::jacobian(all, c.inputs);
    const TensorList Jf = ag::jacobian(all, c.inputs, {.mode = ag::JacobianMode::Forward});
    const TensorList Jn = numeric_jacobian(all, c.inputs);
    double fr = 0, nr = 0;
    for (std::size_t i = 0; i < c.inputs.size(); ++i)
      fr = std::max(fr, relative_error(Jf[i], Jr[i])), nr = std::max(nr, relative_error(Jr[i], Jn[i]));
    const ag::TensorListFn all_list = [all](const TensorList& x) { return TensorList{all(x)}; };
    const ag::GradcheckFn L = scalar_of(all_list, randn64(evaluate(all_list, c.inputs)[0].shape(), 1300));
    const Eigen::MatrixXd H = assemble(ag::hessian(L, c.inputs), c.inputs);
    const double s = asymmetry(H), h = relative_error(H, numeric_hessian(L, c.inputs));
    BOOST_TEST_MESSAGE(fmt::format("{}: jvp vs differences {:.3g} (wrong tangent {:.3g}), dot product {:.3g}, "
                                   "jacobian forward vs reverse {:.3g}, vs differences {:.3g}, hessian asymmetry "
                                   "{:.3g}, vs differences {:.3g}",
                                   c.name, e, e_wrong, dot_error, fr, nr, s, h));
    BOOST_TEST(e <= kFiniteDifferenceTol, c.name << ": " << e);
    BOOST_TEST(e_wrong > 1e3 * kFiniteDifferenceTol, c.name << ": " << e_wrong);
    BOOST_TEST(dot_error <= kExactTol, c.name << ": " << dot_error);
    BOOST_TEST(fr <= kExactTol, c.name << ": " << fr);
    BOOST_TEST(nr <= kFiniteDifferenceTol, c.name << ": " << nr);
    BOOST_TEST(s <= kExactTol, c.name << ": " << s);
    BOOST_TEST(h <= kFiniteDifferenceTol, c.name << ": " << h);
  }
}

// ---- torch.func ----

BOOST_AUTO_TEST_CASE(transforms_match_torch_func) {
  for (const std::string name : {"matmul", "softmax", "layer_norm", "attention"}) {
    const double e = error_against_torch(name, reference_function(name));
    BOOST_TEST_MESSAGE(fmt::format("{}: worst relative error against torch.func {:.3g}", name, e));
    BOOST_TEST(e <= kTorchTol, name << ": " << e);
  }
}

// Negative control: a different function (softmax over another dim, attention without the causal
// mask, a layer_norm without its bias, tanh dropped) fails the comparison.
BOOST_AUTO_TEST_CASE(torch_func_comparison_fails_a_wrong_function) {
  const std::map<std::string, ag::TensorListFn> wrong = {
      {"matmul", [](const TensorList& x) {
         return TensorList{ag::matmul(x[0], x[1]), ag::sum(ag::square(ag::matmul(x[0], x[1])))};
       }},
      {"softmax", [](const TensorList& x) { return TensorList{ag::softmax(ag::matmul(x[0], x[1]), 0)}; }},
      {"layer_norm",
       [](const TensorList& x) { return TensorList{ag::layer_norm(x[0], {x[0].size(-1)}, x[1]) + 0.0 * x[2]}; }},
      {"attention",
       [](const TensorList& x) { return TensorList{ag::scaled_dot_product_attention(x[0], x[1], x[2]).output}; }},
  };
  for (const auto& [name, fn] : wrong) {
    const double e = error_against_torch(name, fn);
    BOOST_TEST_MESSAGE(fmt::format("{} (wrong function): worst relative error {:.3g}", name, e));
    BOOST_TEST(e > 1e-3, name << ": " << e);
  }
}

// ---- semantics ----

BOOST_AUTO_TEST_CASE(inputs_need_not_require_grad_and_get_no_grad) {
  const Tensor a = randn64({3}, 1), b = randn64({3}, 2).requires_grad_();
  const ag::TensorListFn f = [](const TensorList& x) { return TensorList{x[0] * x[1]}; };
  const auto r = ag::jvp(f, {a, b}, {ag::ones({3}, Dtype::Float64), ag::zeros({3}, Dtype::Float64)});
  check_values(r.tangents[0], {3}, b.to_vector());
  BOOST_TEST(!a.requires_grad());
  BOOST_TEST(!b.grad().defined());
  BOOST_TEST(!r.outputs[0].requires_grad());
  BOOST_TEST(!r.tangents[0].requires_grad());
  const auto J = ag::jacobian([](const TensorList& x) { return x[0] * x[1]; }, {a, b});
  BOOST_TEST(!b.grad().defined());
  BOOST_TEST(!J[0].requires_grad());
}

BOOST_AUTO_TEST_CASE(identity_and_constant_outputs) {
  const Tensor x = randn64({2, 3}, 3);
  const Tensor v = randn64({2, 3}, 4);
  // The identity: J = I, so J·v = v (the output is the input leaf itself).
  const auto id = ag::jvp([](const TensorList& a) { return a; }, {x}, {v});
  check_values(id.tangents[0], {2, 3}, v.to_vector());
  const auto back = ag::vjp([](const TensorList& a) { return a; }, {x}, {v});
  check_values(back.cotangents[0], {2, 3}, v.to_vector());
  const Tensor J = ag::jacobian([](const TensorList& a) { return a[0]; }, {x}, {.mode = ag::JacobianMode::Forward})[0];
  const Tensor Jr = ag::jacobian([](const TensorList& a) { return a[0]; }, {x})[0];
  BOOST_TEST(test_support::max_abs_diff(J, Jr) == 0.0);
  const auto I = J.to_vector();
  for (std::size_t k = 0; k < I.size(); ++k) BOOST_TEST(I[k] == (k % 7 == 0 ? 1.0 : 0.0));
  // An output independent of the inputs, and an input no output uses: zeros.
  const Tensor c = randn64({2}, 5);
  const auto r = ag::jvp([c](const TensorList& a) { return TensorList{c, ag::sum(a[0])}; }, {x, c}, {v, c});
  check_values(r.tangents[0], {2}, {0, 0});
  check_values(r.tangents[1], {}, {ag::sum(v).item()});
  const auto Jc = ag::jacobian([c](const TensorList&) { return c * 2.0; }, {x});
  check_values(Jc[0], {2, 2, 3}, std::vector<double>(12, 0.0));
  const auto H = ag::hessian([](const TensorList& a) { return ag::sum(a[0]) * 3.0; }, {x});
  check_values(H[0][0], {2, 3, 2, 3}, std::vector<double>(36, 0.0));
}

BOOST_AUTO_TEST_CASE(transforms_run_under_no_grad_guard_and_on_empty_tensors) {
  const Tensor x = randn64({3}, 11), v = randn64({3}, 12);
  const ag::TensorListFn f = [](const TensorList& a) { return TensorList{ag::exp(a[0])}; };
  ag::JvpResult r;
  {
    ag::NoGradGuard no_grad;
    r = ag::jvp(f, {x}, {v});
    BOOST_TEST(!ag::is_grad_enabled());
  }
  const auto ex = ag::exp(x).to_vector(), vv = v.to_vector();
  std::vector<double> expected(3);
  for (std::size_t k = 0; k < 3; ++k) expected[k] = ex[k] * vv[k];
  check_values(r.tangents[0], {3}, expected);
  // No elements: empty tangents and Jacobians of the right shapes.
  const Tensor e = ag::zeros({0, 2}, Dtype::Float64);
  const auto re = ag::jvp(f, {e}, {e});
  BOOST_TEST(ag::shape_str(re.tangents[0].shape()) == "[0, 2]");
  for (auto mode : {ag::JacobianMode::Reverse, ag::JacobianMode::Forward}) {
    const auto J = ag::jacobian([](const TensorList& a) { return ag::exp(a[0]); }, {e, x}, {.mode = mode});
    BOOST_TEST(ag::shape_str(J[0].shape()) == "[0, 2, 0, 2]");
    BOOST_TEST(ag::shape_str(J[1].shape()) == "[0, 2, 3]");
  }
}

BOOST_AUTO_TEST_CASE(hessian_of_a_quadratic_form_is_the_symmetrised_matrix) {
  // L = xᵀ A y + ½ xᵀ x: d²L/dx² = I, d²L/dx dy = A, d²L/dy dx = Aᵀ, d²L/dy² = 0.
  const Tensor A = randn64({3, 2}, 6), x = randn64({3}, 7), y = randn64({2}, 8);
  const auto H = ag::hessian(
      [A](const TensorList& a) { return ag::sum(a[0] * ag::matmul(A, a[1])) + 0.5 * ag::sum(a[0] * a[0]); }, {x, y});
  check_values(H[0][0], {3, 3}, {1, 0, 0, 0, 1, 0, 0, 0, 1});
  check_values(H[0][1], {3, 2}, A.to_vector());
  check_values(H[1][0], {2, 3}, ag::transpose(A, 0, 1).clone().to_vector());
  check_values(H[1][1], {2, 2}, {0, 0, 0, 0});
}

BOOST_AUTO_TEST_CASE(float32_and_mixed_dtypes) {
  const Tensor x = randn64({4}, 9).to(Dtype::Float32), v = randn64({4}, 10).to(Dtype::Float32);
  const auto r = ag::jvp([](const TensorList& a) { return TensorList{ag::exp(a[0])}; }, {x}, {v});
  BOOST_TEST((r.tangents[0].dtype() == Dtype::Float32));
  const auto ex = ag::exp(x).to_vector(), vv = v.to_vector(), t = r.tangents[0].to_vector();
  for (std::size_t k = 0; k < t.size(); ++k) BOOST_TEST(std::abs(t[k] - ex[k] * vv[k]) <= 1e-6 * (1 + std::abs(t[k])));
  // A Float64 function of a Float32 input: the Jacobian is Float64, forward equal to reverse.
  const ag::GradcheckFn f = [](const TensorList& a) { return ag::square(a[0].to(Dtype::Float64)); };
  const Tensor Jr = ag::jacobian(f, {x})[0], Jf = ag::jacobian(f, {x}, {.mode = ag::JacobianMode::Forward})[0];
  BOOST_TEST((Jr.dtype() == Dtype::Float64));
  BOOST_TEST((Jf.dtype() == Dtype::Float64));
  BOOST_TEST(test_support::max_abs_diff(Jr, Jf) == 0.0);
}

// ---- refusals ----

BOOST_AUTO_TEST_CASE(bad_arguments_are_refused_by_name_with_the_shapes) {
  const Tensor x = randn64({2, 3}, 1), w = randn64({3}, 2);
  const ag::TensorListFn f = [](const TensorList& a) { return TensorList{a[0] * a[1]}; };
  const ag::GradcheckFn g = [](const TensorList& a) { return a[0] * a[1]; };
  using E = std::invalid_argument;
  check_throws<E>([&] { ag::jvp(f, {x, w}, {randn64({3, 2}, 3), w}); },
                  {"jvp: tangents[0] is [3, 2] Float64 but input 0 is [2, 3] Float64"});
  check_throws<E>([&] { ag::jvp(f, {x, w}, {x, w.to(Dtype::Float32)}); },
                  {"jvp: tangents[1] is [3] Float32 but input 1 is [3] Float64"});
  check_throws<E>([&] { ag::jvp(f, {x, w}, {x}); }, {"jvp: 2 inputs but 1 tangents"});
  check_throws<E>([&] { ag::jvp(f, {x, w}, {x, Tensor()}); }, {"jvp: tangents[1] is an undefined tensor"});
  check_throws<E>([&] { ag::jvp(f, {}, {}); }, {"jvp: no inputs given"});
  check_throws<E>([&] { ag::jvp(nullptr, {x}, {x}); }, {"jvp: no function given"});
  check_throws<E>([&] { ag::jvp(f, {x, Tensor()}, {x, w}); }, {"jvp: input 1 is an undefined tensor"});
  const Tensor ids = ag::tensor(std::vector<std::int64_t>{1, 2, 3}, {3});
  check_throws<E>([&] { ag::jvp(f, {x, ids}, {x, ids}); },
                  {"jvp: input 1 is [3] Int64", "only Float32 and Float64"});
  check_throws<E>([&] { ag::jvp([](const TensorList& a) { return TensorList{ag::argmax(a[0], 1)}; }, {x}, {x}); },
                  {"jvp: output 0 of the function is [2] Int64", "not floating point"});
  check_throws<E>([&] { ag::jvp([](const TensorList&) { return TensorList{}; }, {x}, {x}); },
                  {"jvp: the function returned no outputs"});
  check_throws<E>([&] { ag::jvp([](const TensorList& a) { return TensorList{a[0], Tensor()}; }, {x}, {x}); },
                  {"jvp: output 1 of the function is an undefined tensor"});
  check_throws<E>([&] { ag::vjp(f, {x, w}, {w}); }, {"vjp: cotangents[0] is [3] Float64 but output 0 is [2, 3] Float64"});
  check_throws<E>([&] { ag::vjp(f, {x, w}, {x, x}); }, {"vjp: 1 outputs but 2 cotangents"});
  check_throws<E>([&] { ag::jacobian([](const TensorList& a) { return ag::argmax(a[0], 0); }, {x}); },
                  {"jacobian: output 0 of the function is [3] Int64"});
  check_throws<E>([&] { ag::jacobian(g, {x, ids}); }, {"jacobian: input 1 is [3] Int64"});
  check_throws<E>([&] { ag::jacobian(g, {x, w}, {.mode = static_cast<ag::JacobianMode>(7)}); },
                  {"jacobian: mode 7 is neither"});
  check_throws<E>([&] { ag::jacobian(nullptr, {x}); }, {"jacobian: no function given"});
  check_throws<E>([&] { ag::hessian(g, {x, w}); },
                  {"hessian: the function must return one element (a scalar), got shape [2, 3]"});
  check_throws<E>([&] { ag::hessian([](const TensorList& a) { return ag::sum(a[0]); }, {ids}); },
                  {"hessian: input 0 is [3] Int64"});
  check_throws<E>([&] { ag::hessian([](const TensorList&) { return Tensor(); }, {x}); },
                  {"hessian: output 0 of the function is an undefined tensor"});
  // A function that reads an input itself instead of its argument (as a module reads its
  // parameters) would get zeros for it: refused, naming the input.
  Tensor p = randn64({3}, 4);
  p.requires_grad_().set_name("attn.W_Q");
  const ag::TensorListFn reads_p = [p](const TensorList& a) { return TensorList{a[0] * p}; };
  check_throws<E>([&] { ag::jvp(reads_p, {x, p}, {x, p}); },
                  {"jvp: the function's result depends on input 1 'attn.W_Q' [3] itself, not on the argument"});
  check_throws<E>([&] { ag::vjp(reads_p, {x, p}, {x}); }, {"vjp: the function's result depends on input 1"});
  check_throws<E>([&] { ag::jacobian([p](const TensorList& a) { return a[0] * p; }, {x, p}); },
                  {"jacobian: the function's result depends on input 1"});
  check_throws<E>([&] { ag::hessian([p](const TensorList& a) { return ag::sum(a[0] * p * p); }, {x, p}); },
                  {"hessian: the function's result depends on input 1"});
  // Through its argument it is differentiated, and a parameter that is not an input is a constant.
  const auto through = ag::jacobian([](const TensorList& a) { return a[0] * a[1]; }, {x, p});
  BOOST_TEST(ag::shape_str(through[1].shape()) == "[2, 3, 3]");
  const auto constant = ag::jvp(reads_p, {x}, {ag::ones({2, 3}, Dtype::Float64)});
  check_values(constant.tangents[0], {2, 3}, ag::expand(ag::unsqueeze(p.detach(), 0), {2, 3}).to_vector());
  // A backward that cannot be differentiated again: forward mode and the Hessian name it.
  check_throws<std::runtime_error>([&] { ag::jvp([](const TensorList& a) { return TensorList{test_support::CubeOnce::apply(a[0])}; },
                                                 {x}, {x}); },
                                   {"jvp: differentiating the backward pass", "'cube_once'", "once_differentiable"});
  check_throws<std::runtime_error>(
      [&] { ag::jacobian([](const TensorList& a) { return test_support::CubeOnce::apply(a[0]); }, {x}, {.mode = ag::JacobianMode::Forward}); },
      {"jacobian: differentiating the backward pass", "'cube_once'"});
  check_throws<std::runtime_error>([&] { ag::hessian([](const TensorList& a) { return ag::sum(test_support::CubeOnce::apply(a[0])); }, {x}); },
                                   {"hessian: differentiating the backward pass", "'cube_once'"});
  // Reverse mode goes through it.
  const Tensor J = ag::jacobian([](const TensorList& a) { return test_support::CubeOnce::apply(a[0]); }, {w})[0];
  const auto wv = w.to_vector(), Jv = J.to_vector();
  for (std::size_t k = 0; k < 3; ++k) BOOST_TEST(std::abs(Jv[k * 4] - 3 * wv[k] * wv[k]) <= 1e-12 * (1 + Jv[k * 4]));
}

// ---- transforms composed ----

namespace {

// f(x, w) = Σ tanh(W x)·w³ + Σ x²w: every second derivative is non-zero and differs per element.
Tensor composed_f(const TensorList& a) {
  const Tensor W = ag::tensor({0.3, -0.7, 0.2, 0.5, 0.1, -0.4, 0.8, 0.6, -0.2}, {3, 3}, Dtype::Float64);
  return ag::sum(ag::tanh(ag::matmul(W, a[0])) * a[1] * a[1] * a[1]) + ag::sum(a[0] * a[0] * a[1]);
}

// torch.func's jacrev: the gradient of composed_f with respect to input i, as a transform of its own.
ag::GradcheckFn gradient_of(std::size_t i) {
  return [i](const TensorList& a) { return ag::jacobian(composed_f, a)[i]; };
}

}  // namespace

// jacfwd(jacrev(f)) and jacrev(jacrev(f)) are the Hessian; jvp of a vjp is a Hessian-vector
// product; a transform called inside another keeps its results in the graph for it.
BOOST_AUTO_TEST_CASE(composed_transforms_give_the_hessian_and_its_products) {
  const TensorList x{randn64({3}, 1300), randn64({3}, 1301)};
  const auto H = ag::hessian(composed_f, x);
  for (auto mode : {ag::JacobianMode::Reverse, ag::JacobianMode::Forward})
    for (std::size_t i = 0; i < 2; ++i) {
      const TensorList Hi = ag::jacobian(gradient_of(i), x, {.mode = mode});
      for (std::size_t j = 0; j < 2; ++j) {
        const double e = relative_error(Hi[j], H[i][j]);
        BOOST_TEST(e <= kExactTol, "jacobian of the gradient, block " << i << j << ": " << e);
        BOOST_TEST(!Hi[j].requires_grad());  // the outermost transform's results are outside any graph
      }
    }
  // jvp(x ↦ vjp(f, x, 1)) along v: H·v.
  const TensorList v{randn64({3}, 1302), randn64({3}, 1303)};
  const auto grad_f = [](const TensorList& a) {
    return ag::vjp([](const TensorList& b) { return TensorList{composed_f(b)}; }, a, {ag::ones({}, Dtype::Float64)})
        .cotangents;
  };
  const auto hv = ag::jvp(grad_f, x, v);
  const TensorList want = ag::hvp(composed_f, {x[0].detach().clone().requires_grad_(),
                                               x[1].detach().clone().requires_grad_()}, v);
  for (std::size_t i = 0; i < 2; ++i) BOOST_TEST(relative_error(hv.tangents[i], want[i]) <= kExactTol);
  // Third order: the Jacobian of the Hessian against central differences of the Hessian.
  const ag::GradcheckFn hessian_xx = [](const TensorList& a) { return ag::hessian(composed_f, a)[0][0]; };
  const Tensor T = ag::jacobian(hessian_xx, x)[1];  // d H_xx / dw: [3, 3, 3]
  const double h = 1e-4;
  std::vector<double> numeric;
  for (std::int64_t k = 0; k < 3; ++k) {
    TensorList p{x[0], x[1].clone()}, m{x[0], x[1].clone()};
    p[1].data<double>()[k] += h;
    m[1].data<double>()[k] -= h;
    const auto hp = hessian_xx(p).to_vector(), hm = hessian_xx(m).to_vector();
    for (std::size_t e = 0; e < hp.size(); ++e) numeric.push_back((hp[e] - hm[e]) / (2 * h));
  }
  // numeric is laid out [k][a][b]; T is [a][b][k].
  const auto t = T.to_vector();
  double worst = 0, scale = 0;
  for (std::size_t a = 0; a < 9; ++a)
    for (std::size_t k = 0; k < 3; ++k) {
      worst = std::max(worst, std::abs(t[a * 3 + k] - numeric[k * 9 + a]));
      scale = std::max(scale, std::abs(numeric[k * 9 + a]));
    }
  BOOST_TEST(scale > 0.1);
  BOOST_TEST(worst / scale <= 1e-7, "third derivatives against differences of the Hessian: " << worst / scale);
}

// Negative control: the composed Hessian is not the Hessian of another function, and a transform
// whose inner result were cut from the graph (detached) would give zeros, which the check rejects.
BOOST_AUTO_TEST_CASE(composed_transform_checks_fail_a_wrong_or_cut_inner_transform) {
  const TensorList x{randn64({3}, 1300), randn64({3}, 1301)};
  const auto H = ag::hessian(composed_f, x);
  const ag::GradcheckFn cut = [](const TensorList& a) { return ag::jacobian(composed_f, a)[0].detach(); };
  const Tensor zeros_block = ag::jacobian(cut, x)[0];
  BOOST_TEST(test_support::max_abs_diff(zeros_block, H[0][0]) > 1e-2);
  const ag::GradcheckFn other = [](const TensorList& a) {
    return ag::jacobian([](const TensorList& b) { return composed_f(b) + ag::sum(b[0] * b[0] * b[0]); }, a)[0];
  };
  BOOST_TEST(relative_error(ag::jacobian(other, x)[0], H[0][0]) > 1e-2);
}
