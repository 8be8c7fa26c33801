// ag::cross_entropy, the fused loss op: values by hand and PyTorch's, masked (−inf) logits
// with PyTorch's semantics (value and gradient, with and without label smoothing and
// ignore_index), agreement with −log_softmax composed of elementary ops, float64 gradchecks
// of every reduction, negative controls, one graph node, the same bits at any thread count, and
// the errors.
#define BOOST_TEST_MODULE cross_entropy_op
#include "test_support.hpp"

#include <cmath>
#include <limits>

using namespace test_support::prelude;
using ag::CrossEntropyOptions;
using ag::Reduction;
using Targets = std::vector<std::int64_t>;

namespace {

constexpr double inf = std::numeric_limits<double>::infinity();

// loss_n = −(1−ε)·log_softmax(x_n)_t − ε/C · Σ_c log_softmax(x_n)_c from elementary ops (rows of
// (N, C) logits, no ignored rows), the target entries picked by index so that −inf entries
// elsewhere are not multiplied by zero.
Tensor composed(const Tensor& x, const Targets& t, double eps = 0.0) {
  const std::int64_t C = x.size(-1);
  const Tensor ls = ag::log_softmax(x, -1);
  Targets flat;
  for (std::size_t n = 0; n < t.size(); ++n) flat.push_back(static_cast<std::int64_t>(n) * C + t[n]);
  Tensor loss = -ag::index_select(ag::reshape(ls, {-1}), 0, flat);
  if (eps > 0) loss = loss * (1 - eps) - ag::sum(ls, -1) * (eps / static_cast<double>(C));
  return loss;
}

// softmax(x) of one row, for expected gradients.
std::vector<double> softmax_row(const std::vector<double>& x) {
  double z = 0;
  for (double v : x) z += std::exp(v);
  std::vector<double> p;
  for (double v : x) p.push_back(std::exp(v) / z);
  return p;
}

// The same loss, with a backward that ignores label smoothing (softmax − onehot).
struct CrossEntropyUnsmoothedBackward : ag::Function<CrossEntropyUnsmoothedBackward> {
  static constexpr const char* name = "cross_entropy_unsmoothed_backward";
  static Tensor forward(ag::FunctionCtx& ctx, const Tensor& x) {
    ctx.save_for_backward({x});
    return ag::cross_entropy(x, Targets{1, 0}, {.reduction = Reduction::Sum, .label_smoothing = 0.2});
  }
  static TensorList backward(ag::FunctionCtx& ctx, const TensorList& g) {
    const Tensor x = ctx.saved_tensors()[0];
    const Tensor onehot = f64({0, 1, 0, 1, 0, 0}, {2, 3});
    return {(ag::softmax(x, -1) - onehot) * g[0]};
  }
};

}  // namespace

// ---------------------------------------------------------------- values

BOOST_AUTO_TEST_CASE(values_by_hand_and_pytorchs) {
  // log(e¹ + e² + e³) − 3 = log(1 + e⁻¹ + e⁻²)
  check_values(ag::cross_entropy(f64({1, 2, 3}, {1, 3}), Targets{2}), {}, {std::log(1 + std::exp(-1.0) + std::exp(-2.0))});
  // F.cross_entropy([[1, 2, 3], [0.5, −1, 2], [3, 0, −2]], [2, 0, 1]) with each reduction
  const Tensor x = f64({1, 2, 3, 0.5, -1, 2, 3, 0, -2}, {3, 3});
  check_values(ag::cross_entropy(x, Targets{2, 0, 1}), {}, {1.734634165492895});
  check_values(ag::cross_entropy(x, Targets{2, 0, 1}, {.reduction = Reduction::Sum}), {}, {5.203902496478685});
  check_values(ag::cross_entropy(x, Targets{2, 0, 1}, {.reduction = Reduction::None}), {3},
               {0.4076059644443804, 1.7413112966571571, 3.0549852353771474});
  check_values(ag::cross_entropy(x, Targets{2, 0, 1}, {.label_smoothing = 0.2}), {}, {1.7790786099373395});
  check_values(ag::cross_entropy(x, Targets{2, -100, 1}), {}, {1.731295599910764});
  // targets as a tensor, logits (B, T, C)
  check_values(ag::cross_entropy(ag::reshape(x, {1, 3, 3}), f64({2, 0, 1}, {1, 3}), {.reduction = Reduction::None}),
               {1, 3}, {0.4076059644443804, 1.7413112966571571, 3.0549852353771474});
}

BOOST_AUTO_TEST_CASE(every_target_ignored_gives_nan_for_the_mean_and_zero_for_the_sum) {
  const Tensor x = input({2, 3}, 1);
  BOOST_TEST(std::isnan(ag::cross_entropy(x, Targets{-100, -100}).item()));
  check_values(ag::cross_entropy(x, Targets{-100, -100}, {.reduction = Reduction::Sum}), {}, {0});
  ag::cross_entropy(x, Targets{-100, -100}, {.reduction = Reduction::Sum}).backward();
  check_values(x.grad(), {2, 3}, std::vector<double>(6, 0.0));
}

// ---------------------------------------------------------------- masked logits

BOOST_AUTO_TEST_CASE(a_masked_class_adds_nothing_and_gets_no_gradient) {
  // F.cross_entropy([[-inf, 0, 1]], [1]) = log(e⁰ + e¹) − 0 = 1.3133; gradient softmax − onehot
  const Tensor x = f64({-inf, 0, 1}, {1, 3}).requires_grad_();
  const Tensor loss = ag::cross_entropy(x, Targets{1});
  check_values(loss, {}, {std::log(1 + std::exp(1.0))});
  loss.backward();
  const auto p = softmax_row({0, 1});
  check_values(x.grad(), {1, 3}, {0, p[0] - 1, p[1]});
  // float32 too
  const Tensor x32 = ag::tensor({-inf, 0, 1}, {1, 3}).requires_grad_();
  ag::cross_entropy(x32, Targets{1}).backward();
  check_values(ag::cross_entropy(x32, Targets{1}), {}, {1.3132616875182228}, 1e-6);
  check_values(x32.grad(), {1, 3}, {0, p[0] - 1, p[1]}, 1e-6);
}

BOOST_AUTO_TEST_CASE(a_masked_target_gives_inf_with_a_finite_gradient) {
  // PyTorch: loss inf; gradient −1 at the target (softmax 0 there), softmax elsewhere
  const Tensor x = f64({-inf, 0, 1, 0.5, -inf, 2}, {2, 3}).requires_grad_();
  const Tensor loss = ag::cross_entropy(x, Targets{0, 2}, {.reduction = Reduction::None});
  const auto q = softmax_row({0.5, 2});
  check_values_nonfinite(loss, {2}, {inf, std::log(std::exp(0.5) + std::exp(2.0)) - 2});
  loss.backward(f64({1, 1}, {2}));
  const auto p = softmax_row({0, 1});
  check_values(x.grad(), {2, 3}, {-1, p[0], p[1], q[0], 0, q[1] - 1});
  check_values_nonfinite(ag::cross_entropy(x, Targets{0, 2}), {}, {inf});
}

BOOST_AUTO_TEST_CASE(label_smoothing_over_a_masked_logit_gives_inf_as_in_pytorch) {
  // (1−ε)·nll + ε·mean_c(−log_softmax_c): the mean holds −log 0 = inf
  const double eps = 0.3;
  const Tensor x = f64({-inf, 0, 1}, {1, 3}).requires_grad_();
  const Tensor loss = ag::cross_entropy(x, Targets{1}, {.label_smoothing = eps});
  check_values_nonfinite(loss, {}, {inf});
  loss.backward();
  // gradient softmax − q, q = (1−ε)·onehot + ε/3: −ε/3 at the masked logit, finite everywhere
  const auto p = softmax_row({0, 1});
  check_values(x.grad(), {1, 3}, {-eps / 3, p[0] - (1 - eps) - eps / 3, p[1] - eps / 3});
  // ε = 1: the target's weight is zero; the smoothing term alone is inf (PyTorch: 0·inf = NaN)
  check_values_nonfinite(ag::cross_entropy(x, Targets{0}, {.label_smoothing = 1.0}), {}, {inf});
  // a row without masked logits is finite with smoothing
  const Tensor y = f64({0, 1, 2}, {1, 3});
  check_values(ag::cross_entropy(y, Targets{1}, {.label_smoothing = 1.0}), {},
               {std::log(1 + std::exp(1.0) + std::exp(2.0)) - 1});
}

BOOST_AUTO_TEST_CASE(a_fully_masked_row_gives_inf_with_zero_gradient) {
  // No class can be chosen: −log_softmax (which is −inf throughout, gradient zero) gives +inf.
  // PyTorch gives NaN.
  const Tensor x = f64({-inf, -inf, -inf, 1, 2, 3}, {2, 3}).requires_grad_();
  const Tensor loss = ag::cross_entropy(x, Targets{1, 2}, {.reduction = Reduction::None});
  check_values_nonfinite(loss, {2}, {inf, std::log(1 + std::exp(-1.0) + std::exp(-2.0))});
  loss.backward(f64({1, 1}, {2}));
  const auto p = softmax_row({1, 2, 3});
  check_values(x.grad(), {2, 3}, {0, 0, 0, p[0], p[1], p[2] - 1});
  check_values_nonfinite(ag::cross_entropy(x, Targets{1, 2}, {.label_smoothing = 0.1}), {}, {inf});
  // log_softmax of that row, for comparison
  check_values_nonfinite(ag::log_softmax(x.detach(), -1), {2, 3},
                         {-inf, -inf, -inf, std::log(p[0]), std::log(p[1]), std::log(p[2])});
}

BOOST_AUTO_TEST_CASE(ignored_rows_may_be_masked) {
  // an ignored row, masked or not, contributes neither value nor gradient
  const Tensor x = f64({-inf, -inf, -inf, -inf, 0, 1, 1, 2, 3}, {3, 3}).requires_grad_();
  const Tensor loss = ag::cross_entropy(x, Targets{-100, -100, 2}, {.label_smoothing = 0.1});
  const auto p = softmax_row({1, 2, 3});
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  check_values(loss, {}, {0.9 * (lse - 3) + 0.1 * (lse - 2)});
  loss.backward();
  check_values(x.grad(), {3, 3}, {0, 0, 0, 0, 0, 0, p[0] - 0.1 / 3, p[1] - 0.1 / 3, p[2] - 0.9 - 0.1 / 3});
}

BOOST_AUTO_TEST_CASE(masked_rows_agree_with_minus_log_softmax) {
  // random logits with −inf entries (one row fully masked, one with a masked target): value and
  // gradient of the fused op against −log_softmax picked at the target
  Tensor base = input({6, 5}, 2).detach();
  const Tensor mask = f64({0, -inf, 0, 0, -inf,  -inf, -inf, -inf, -inf, -inf,  0, 0, 0, 0, 0,
                           -inf, 0, 0, -inf, 0,  0, 0, -inf, 0, 0,  -inf, -inf, -inf, -inf, 0},
                          {6, 5});
  const Targets t = {2, 3, 4, 0, 1, 4};
  const Tensor w = f64({1, -2, 0.5, 3, -1, 2}, {6});
  for (double eps : {0.0, 0.25}) {
    const Tensor x1 = (base + mask).detach().requires_grad_(), x2 = x1.detach().requires_grad_();
    const Tensor got = ag::cross_entropy(x1, t, {.reduction = Reduction::None, .label_smoothing = eps});
    const Tensor want = composed(x2, t, eps);
    check_values_nonfinite(got, {6}, want.to_vector());
    ag::sum(got * w).backward();
    ag::sum(want * w).backward();
    check_values(x1.grad(), {6, 5}, x2.grad().to_vector());
    for (double g : x1.grad().to_vector()) BOOST_TEST(std::isfinite(g));
  }
}

// ---------------------------------------------------------------- gradients

BOOST_AUTO_TEST_CASE(gradients_for_every_reduction) {
  const Tensor t = f64({4, 0, -100, 2, 3, 1}, {2, 3});
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None})
    for (double eps : {0.0, 0.1, 1.0})
      check_gradients(fmt::format("reduction {} smoothing {}", static_cast<int>(red), eps),
                      [&](const TensorList& in) {
                        return ag::cross_entropy(in[0], t, {.reduction = red, .label_smoothing = eps});
                      },
                      {input({2, 3, 5}, 3)});
  // through an upstream op, so that the incoming gradient is not all ones
  const Tensor w = f64({1, -2, 3, 0.5, 4, -1}, {2, 3});
  check_gradients("upstream",
                  [&](const TensorList& in) {
                    return ag::sum(ag::cross_entropy(in[0] * in[1], t, {.reduction = Reduction::None}) * w);
                  },
                  {input({2, 3, 5}, 4), input({2, 3, 5}, 5)});
}

BOOST_AUTO_TEST_CASE(gradients_with_masked_logits) {
  // −inf logits that are not targets stay −inf under perturbation: the loss is finite (no
  // smoothing) and their gradient is 0
  const Tensor mask = f64({0, -inf, 0, -inf,  -inf, 0, 0, 0,  0, 0, -inf, -inf}, {3, 4});
  check_gradients("masked", [&](const TensorList& in) { return ag::cross_entropy(in[0] + mask, Targets{2, 3, 0}); },
                  {input({3, 4}, 6)});
}

BOOST_AUTO_TEST_CASE(gradients_of_a_large_input_on_the_threaded_path) {
  ag::GradcheckOptions opt;
  opt.max_full_jacobian = 0;  // random projections
  opt.num_projections = 4;
  Targets t;
  for (std::int64_t n = 0; n < 400; ++n) t.push_back(n % 9 == 0 ? -100 : (n * 7) % 100);
  const auto r = ag::gradcheck(
      [&](const TensorList& in) { return ag::cross_entropy(in[0], t, {.label_smoothing = 0.05}); }, {input({400, 100}, 7)},
      opt);
  BOOST_TEST(r.ok, fmt::format("{}", r));
}

BOOST_AUTO_TEST_CASE(gradcheck_catches_wrong_gradients) {
  // Negative controls: a backward that ignores label smoothing, and one off by a factor of two.
  const Tensor x = input({2, 3}, 8);
  const auto unsmoothed = ag::gradcheck([](const TensorList& in) { return CrossEntropyUnsmoothedBackward::apply(in[0]); }, {x});
  BOOST_TEST(!unsmoothed.ok, fmt::format("{}", unsmoothed));
  const auto doubled = ag::gradcheck(
      [](const TensorList& in) {
        const Tensor loss = ag::cross_entropy(in[0], Targets{1, 0});
        const Tensor twice = ag::cross_entropy(in[0] * 1.0, Targets{1, 0});
        return loss + twice - twice.detach();  // value of loss, gradient of 2·loss
      },
      {x});
  BOOST_TEST(!doubled.ok, fmt::format("{}", doubled));
  // and the op itself passes
  check_gradients("the op",
                  [](const TensorList& in) {
                    return ag::cross_entropy(in[0], Targets{1, 0}, {.reduction = Reduction::Sum, .label_smoothing = 0.2});
                  },
                  {x});
}

// ---------------------------------------------------------------- graph, threads

BOOST_AUTO_TEST_CASE(one_node_named_cross_entropy) {
  const Tensor x = input({2, 3}, 9);
  const Tensor loss = ag::cross_entropy(x, Targets{0, 1});
  BOOST_REQUIRE(loss.grad_fn() != nullptr);
  BOOST_TEST(loss.grad_fn()->name() == "cross_entropy");
  ag::NoGradGuard no_grad;
  BOOST_TEST(ag::cross_entropy(x, Targets{0, 1}).grad_fn() == nullptr);
}

BOOST_AUTO_TEST_CASE(same_bits_at_any_thread_count) {
  const int before = ag::get_num_threads();
  Targets t;
  for (std::int64_t n = 0; n < 600; ++n) t.push_back(n % 5 == 0 ? -100 : (n * 13) % 97);
  for (Dtype dt : {Dtype::Float32, Dtype::Float64})
    for (Reduction red : {Reduction::Mean, Reduction::None}) {
      const Tensor x0 = ag::mul(input({600, 97}, 10).detach(), 3.0).to(dt);
      const Tensor dy = red == Reduction::None ? input({600}, 11).detach().to(dt) : ag::ones({}, dt);
      std::vector<std::vector<double>> first;
      for (int threads : {1, 2, 3, 4}) {
        ag::set_num_threads(threads);
        const Tensor x = x0.detach().requires_grad_();
        const Tensor loss = ag::cross_entropy(x, t, {.reduction = red, .label_smoothing = 0.1});
        loss.backward(dy);
        const std::vector<std::vector<double>> got = {loss.to_vector(), x.grad().to_vector()};
        if (first.empty()) first = got;
        BOOST_TEST((got[0] == first[0]), "loss differs at " << threads << " threads");
        BOOST_TEST((got[1] == first[1]), "gradient differs at " << threads << " threads");
      }
    }
  ag::set_num_threads(before);
}

// ---------------------------------------------------------------- errors

BOOST_AUTO_TEST_CASE(errors_name_the_op_and_the_values) {
  const Tensor x = ag::zeros({3, 3}, Dtype::Float64);
  check_message([] { ag::cross_entropy(Tensor(), Targets{0}); }, "cross_entropy: logits is an undefined tensor");
  check_message([&] { ag::cross_entropy(x, Tensor()); }, "cross_entropy: targets is an undefined tensor");
  check_message([] { ag::cross_entropy(ag::scalar_tensor(1.0), Targets{0}); }, "logits need a class dimension");
  check_message([] { ag::cross_entropy(ag::zeros({3, 0}), Targets{0, 0, 0}); }, "logits have no classes: shape [3, 0]");
  check_message([&] { ag::cross_entropy(x, Targets{2, 3, 0}); },
                "cross_entropy: target 3 at position 1 is out of range for 3 classes (ignore_index is -100)");
  check_message([&] { ag::cross_entropy(x, Targets{2, -1, 0}); }, "target -1");
  check_message([&] { ag::cross_entropy(x, ag::tensor({0, 1}, {2})); },
                "cross_entropy: targets [2] do not match logits [3, 3]: expected targets [3]");
  check_message([&] { ag::cross_entropy(x, f64({0, 1.5, 2}, {3})); },
                "cross_entropy: target at position 1 is 1.5, not an integral class index");
  check_message([&] { ag::cross_entropy(x, f64({0, 5, 2}, {3})); }, "target 5 at position 1 is out of range");
  check_message([&] { ag::cross_entropy(x, Targets{0, 1}); }, "cross_entropy: 2 targets for logits [3, 3] (3 rows of 3 classes)");
  check_message([&] { ag::cross_entropy(x, Targets{0, 1, 2}, {.label_smoothing = -0.1}); },
                "cross_entropy: label_smoothing must be in [0, 1], got -0.1");
  check_message([&] { ag::cross_entropy(x, Targets{0, 1, 2}, {.label_smoothing = std::nan("")}); }, "label_smoothing");
}
