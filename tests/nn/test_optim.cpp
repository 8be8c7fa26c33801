// Optimizers, schedules and clipping: updates against hand-computed values and against
// torch.optim (float64 reference values printed by PyTorch 2.x; the snippet is quoted at each).
#define BOOST_TEST_MODULE optim
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include <nn/nn.hpp>

namespace ag = autograd;

namespace {

ag::Tensor param(std::vector<double> v, ag::Dtype dtype = ag::Dtype::Float64) {
  const auto n = static_cast<std::int64_t>(v.size());
  return ag::tensor(v, {n}, dtype).requires_grad_(true);
}

void set_grad(ag::Tensor& p, std::vector<double> g) {
  p.set_grad(ag::tensor(g, {static_cast<std::int64_t>(g.size())}, p.dtype()));
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol = 1e-12) {
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) BOOST_CHECK_MESSAGE(std::abs(got[i] - want[i]) <= tol,
                                                                   "element " << i << ": got " << got[i] << ", want " << want[i]);
}

// Steps an optimizer through the gradients G and returns the parameter after each step.
template <class Opt, class Options>
std::vector<std::vector<double>> run(const Options& options, const std::vector<std::vector<double>>& grads) {
  ag::Tensor p = param({1.0, -2.0});
  Opt opt({p}, options);
  std::vector<std::vector<double>> out;
  for (const auto& g : grads) {
    set_grad(p, g);
    opt.step();
    out.push_back(p.to_vector());
  }
  return out;
}

const std::vector<std::vector<double>> kGrads = {{0.5, -1.0}, {-1.0, 0.25}, {0.3, 0.3}};

}  // namespace

BOOST_AUTO_TEST_CASE(sgd_step_is_p_minus_lr_times_grad) {
  ag::Tensor p = param({1.0, 2.0});
  nn::SGD opt({p}, {.lr = 0.1});
  set_grad(p, {0.5, -1.0});
  opt.step();
  // 1 - 0.1·0.5 = 0.95;  2 - 0.1·(-1) = 2.1
  check_close(p.to_vector(), {0.95, 2.1});
}

BOOST_AUTO_TEST_CASE(sgd_weight_decay_adds_decay_times_p_to_the_gradient) {
  ag::Tensor p = param({1.0, 2.0});
  nn::SGD opt({p}, {.lr = 0.1, .weight_decay = 0.5});
  set_grad(p, {0.5, -1.0});
  opt.step();
  // g = (0.5 + 0.5·1, -1 + 0.5·2) = (1, 0)  =>  p = (0.9, 2)
  check_close(p.to_vector(), {0.9, 2.0});
}

BOOST_AUTO_TEST_CASE(sgd_momentum_buffer_starts_at_the_gradient) {
  ag::Tensor p = param({1.0});
  nn::SGD opt({p}, {.lr = 0.1, .momentum = 0.9});
  set_grad(p, {1.0});
  opt.step();  // b = 1, p = 1 - 0.1 = 0.9
  check_close(p.to_vector(), {0.9});
  set_grad(p, {2.0});
  opt.step();  // b = 0.9·1 + 2 = 2.9, p = 0.9 - 0.29 = 0.61
  check_close(p.to_vector(), {0.61});
  set_grad(p, {0.0});
  opt.step();  // b = 0.9·2.9 = 2.61, p = 0.61 - 0.261 = 0.349
  check_close(p.to_vector(), {0.349});
}

BOOST_AUTO_TEST_CASE(sgd_nesterov_with_weight_decay_matches_torch) {
  // torch.optim.SGD([p], lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01), p = [1, -2]
  const auto got = run<nn::SGD>(nn::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true}, kGrads);
  check_close(got[0], {0.9031, -1.8062});
  check_close(got[1], {1.05007411, -1.76764822});
  check_close(got[2], {1.034168458191, -1.7657186663820001});
}

BOOST_AUTO_TEST_CASE(sgd_dampening_matches_torch) {
  // torch.optim.SGD([p], lr=0.1, momentum=0.9, dampening=0.5)
  const auto got = run<nn::SGD>(nn::SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.5}, kGrads);
  check_close(got[0], {0.95, -1.9});
  check_close(got[1], {0.955, -1.8225});
  check_close(got[2], {0.9445, -1.76775});
}

BOOST_AUTO_TEST_CASE(adam_first_step_moves_each_weight_by_lr_against_its_gradient_sign) {
  // Step 1: m̂ = g, v̂ = g², so the update is lr·g/(|g| + eps) ≈ lr·sign(g).
  ag::Tensor p = param({1.0, -2.0, 3.0});
  nn::Adam opt({p}, {.lr = 0.1});
  p.set_grad(ag::tensor({0.5, -1.0, 1e-3}, {3}, ag::Dtype::Float64));
  opt.step();
  check_close(p.to_vector(), {1.0 - 0.1 * 0.5 / (0.5 + 1e-8), -2.0 + 0.1 * 1.0 / (1.0 + 1e-8),
                              3.0 - 0.1 * 1e-3 / (1e-3 + 1e-8)});
}

BOOST_AUTO_TEST_CASE(adam_matches_torch_over_three_steps) {
  // torch.optim.Adam([p], lr=0.1)
  const auto got = run<nn::Adam>(nn::AdamOptions{.lr = 0.1}, kGrads);
  check_close(got[0], {0.900000002, -1.900000001});
  check_close(got[1], {0.9366103542405654, -1.8530531845234584});
  check_close(got[2], {0.9473774736526891, -1.8360790631814412});
}

BOOST_AUTO_TEST_CASE(adam_weight_decay_is_an_l2_term_in_the_gradient) {
  // torch.optim.Adam([p], lr=0.1, weight_decay=0.1)
  const auto got = run<nn::Adam>(nn::AdamOptions{.lr = 0.1, .weight_decay = 0.1}, kGrads);
  check_close(got[0], {0.9000000016666666, -1.9000000008333333});
  check_close(got[1], {0.9252635194456061, -1.8367957569894449});
  check_close(got[2], {0.921979323363058, -1.794328355644954});
}

BOOST_AUTO_TEST_CASE(adamw_decays_weights_directly) {
  // torch.optim.AdamW([p], lr=0.1, weight_decay=0.1): step 1 = Adam's step from p·(1 - 0.01)
  const auto got = run<nn::AdamW>(nn::AdamWOptions{.lr = 0.1, .weight_decay = 0.1}, kGrads);
  check_close(got[0], {0.890000002, -1.880000001});
  check_close(got[1], {0.9177103542205653, -1.8142531845134584});
  check_close(got[2], {0.9193003700904834, -1.7791365313263066});
}

BOOST_AUTO_TEST_CASE(adam_and_adamw_defaults_are_torch_optims) {
  // torch.optim.Adam / AdamW: lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay 0 / 0.01, amsgrad=False
  ag::Tensor p = param({1.0});
  const nn::Adam adam({p});
  const nn::AdamW adamw({p});
  for (const nn::AdamOptions& o : {adam.options(), adamw.options()}) {
    BOOST_TEST(o.lr == 1e-3);
    BOOST_TEST(o.beta1 == 0.9);
    BOOST_TEST(o.beta2 == 0.999);
    BOOST_TEST(o.eps == 1e-8);
    BOOST_TEST(!o.amsgrad);
  }
  BOOST_TEST(adam.options().weight_decay == 0.0);
  BOOST_TEST(adamw.options().weight_decay == 1e-2);
  // Options given to AdamW reach the update unchanged.
  const nn::AdamW custom({p}, {.lr = 0.5, .beta1 = 0.8, .beta2 = 0.7, .eps = 1e-3, .weight_decay = 0.2, .amsgrad = true});
  BOOST_TEST(custom.options().lr == 0.5);
  BOOST_TEST(custom.options().beta1 == 0.8);
  BOOST_TEST(custom.options().beta2 == 0.7);
  BOOST_TEST(custom.options().eps == 1e-3);
  BOOST_TEST(custom.options().weight_decay == 0.2);
  BOOST_TEST(custom.options().amsgrad);
}

BOOST_AUTO_TEST_CASE(amsgrad_keeps_the_largest_second_moment) {
  // torch.optim.Adam([p], lr=0.1, betas=(0.9, 0.5), amsgrad=True / False)
  const std::vector<std::vector<double>> grads = {{2.0, -2.0}, {0.1, 0.1}, {0.1, -0.1}};
  const auto ams = run<nn::Adam>(nn::AdamOptions{.lr = 0.1, .beta2 = 0.5, .amsgrad = true}, grads);
  check_close(ams[1], {0.8387627573054205, -1.8452087829048498});
  check_close(ams[2], {0.7945855447468235, -1.8054248843023564});
  const auto plain = run<nn::Adam>(nn::AdamOptions{.lr = 0.1, .beta2 = 0.5}, grads);
  check_close(plain[2], {0.725914029405694, -1.7437288415459937});
}

BOOST_AUTO_TEST_CASE(float32_parameters_are_updated_in_float32) {
  ag::Tensor p = param({1.0, -2.0}, ag::Dtype::Float32);
  nn::Adam opt({p}, {.lr = 0.1});
  set_grad(p, {0.5, -1.0});
  opt.step();
  BOOST_CHECK(p.dtype() == ag::Dtype::Float32);
  check_close(p.to_vector(), {0.9, -1.9}, 1e-6);
}

BOOST_AUTO_TEST_CASE(parameters_without_gradient_are_left_alone) {
  ag::Tensor a = param({1.0}), b = param({5.0});
  nn::SGD opt({a, b}, {.lr = 0.5, .momentum = 0.9});
  set_grad(a, {1.0});
  opt.step();
  check_close(a.to_vector(), {0.5});
  check_close(b.to_vector(), {5.0});
  // b has no state until it gets a gradient
  for (const auto& [name, t] : opt.state_dict()) BOOST_CHECK(name.rfind("state.1.", 0) != 0);
}

BOOST_AUTO_TEST_CASE(step_bumps_the_parameter_version) {
  ag::Tensor p = param({1.0});
  nn::SGD opt({p}, {.lr = 0.1});
  const auto before = p.version();
  set_grad(p, {1.0});
  opt.step();
  BOOST_CHECK_GT(p.version(), before);
}

BOOST_AUTO_TEST_CASE(zero_grad_zeroes_or_clears_gradients) {
  ag::Tensor p = param({1.0, 2.0});
  nn::SGD opt({p}, {.lr = 0.1});
  set_grad(p, {3.0, 4.0});
  opt.zero_grad();
  BOOST_REQUIRE(p.grad().defined());
  check_close(p.grad().to_vector(), {0.0, 0.0});
  opt.zero_grad(true);
  BOOST_CHECK(!p.grad().defined());
}

BOOST_AUTO_TEST_CASE(state_dict_restores_a_run_exactly) {
  ag::Tensor a = param({1.0, -2.0});
  nn::Adam opt_a({a}, {.lr = 0.1, .amsgrad = true});
  set_grad(a, {0.5, -1.0});
  opt_a.step();
  set_grad(a, {-1.0, 0.25});
  opt_a.step();

  ag::Tensor b = param(a.to_vector());
  nn::Adam opt_b({b}, {.lr = 0.7, .amsgrad = true});
  opt_b.load_state_dict(opt_a.state_dict());
  BOOST_CHECK_EQUAL(opt_b.lr(), 0.1);
  BOOST_CHECK_EQUAL(opt_b.step_count(), 2);
  for (int i = 0; i < 2; ++i) {
    set_grad(a, {0.3, 0.3});
    set_grad(b, {0.3, 0.3});
    opt_a.step();
    opt_b.step();
  }
  const auto va = a.to_vector(), vb = b.to_vector();
  BOOST_CHECK(va == vb);  // bit for bit
}

BOOST_AUTO_TEST_CASE(state_dict_uses_torch_names) {
  ag::Tensor p = param({1.0, 2.0});
  nn::Adam opt({p});
  set_grad(p, {1.0, 1.0});
  opt.step();
  std::vector<std::string> names;
  for (const auto& [name, t] : opt.state_dict()) names.push_back(name);
  const std::vector<std::string> want = {"state.0.step", "state.0.exp_avg", "state.0.exp_avg_sq", "param_groups.0.lr",
                                         "step_count"};
  BOOST_CHECK(names == want);
}

BOOST_AUTO_TEST_CASE(bad_state_dict_is_rejected_and_changes_nothing) {
  ag::Tensor p = param({1.0, 2.0});
  nn::Adam opt({p}, {.lr = 0.1});
  set_grad(p, {1.0, 1.0});
  opt.step();
  const nn::NamedTensors good = opt.state_dict();
  auto with = [&](const std::string& name, ag::Tensor t) {
    nn::NamedTensors s = good;
    bool replaced = false;
    for (auto& [n, v] : s)
      if (n == name) {
        v = t;
        replaced = true;
      }
    if (!replaced) s.emplace_back(name, t);
    return s;
  };
  auto without = [&](const std::string& name) {
    nn::NamedTensors s;
    for (const auto& e : good)
      if (e.first != name) s.push_back(e);
    return s;
  };
  const auto expect_error = [&](const nn::NamedTensors& s, const std::string& fragment) {
    try {
      opt.load_state_dict(s);
      BOOST_ERROR("no error for a state that should mention: " << fragment);
    } catch (const std::invalid_argument& e) {
      BOOST_CHECK_MESSAGE(std::string(e.what()).find(fragment) != std::string::npos, e.what());
    }
  };
  expect_error(with("state.0.exp_avg", ag::zeros({3}, ag::Dtype::Float64)), "has shape [3] but parameter 0 is [2]");
  expect_error(with("state.0.exp_avg", ag::zeros({2}, ag::Dtype::Float32)), "is Float32 but parameter 0 is Float64");
  expect_error(with("state.0.momentum_buffer", ag::zeros({2}, ag::Dtype::Float64)), "unexpected state slot 'momentum_buffer'");
  expect_error(with("state.4.exp_avg", ag::zeros({2}, ag::Dtype::Float64)), "refers to parameter 4");
  expect_error(with("state.0.step", ag::scalar_tensor(1.5, ag::Dtype::Float64)), "non-negative integer");
  expect_error(with("bogus", ag::scalar_tensor(1.0)), "unexpected entry 'bogus'");
  expect_error(without("state.0.exp_avg_sq"), "missing 'state.0.exp_avg_sq'");
  expect_error(without("param_groups.0.lr"), "missing 'param_groups.0.lr'");

  // Nothing changed: the next step equals that of an untouched copy.
  ag::Tensor q = param(p.to_vector());
  nn::Adam ref({q}, {.lr = 0.1});
  ref.load_state_dict(good);
  set_grad(p, {0.2, -0.2});
  set_grad(q, {0.2, -0.2});
  opt.step();
  ref.step();
  BOOST_CHECK(p.to_vector() == q.to_vector());
}

BOOST_AUTO_TEST_CASE(constructor_rejects_bad_settings) {
  ag::Tensor p = param({1.0});
  BOOST_CHECK_THROW(nn::SGD({p}, {.lr = -1.0}), std::invalid_argument);
  BOOST_CHECK_THROW(nn::SGD({p}, {.lr = 0.1, .nesterov = true}), std::invalid_argument);
  BOOST_CHECK_THROW(nn::Adam({p}, {.beta1 = 1.0}), std::invalid_argument);
  BOOST_CHECK_THROW(nn::Adam({p, p}), std::invalid_argument);
  BOOST_CHECK_THROW(nn::Adam(std::vector<ag::Tensor>{}), std::invalid_argument);
  BOOST_CHECK_THROW(nn::Adam({ag::mul(p, 2.0)}), std::invalid_argument);  // not a leaf
  BOOST_CHECK_NO_THROW(nn::Adam({p, ag::tensor({1.0}, {1})}));  // a frozen leaf is skipped
}

BOOST_AUTO_TEST_CASE(warmup_cosine_rises_linearly_then_follows_half_a_cosine) {
  const auto lr = nn::warmup_cosine_lr(1.0, 4, 14, 0.1);
  BOOST_CHECK_CLOSE(lr(0), 0.25, 1e-12);
  BOOST_CHECK_CLOSE(lr(1), 0.5, 1e-12);
  BOOST_CHECK_CLOSE(lr(3), 1.0, 1e-12);
  BOOST_CHECK_CLOSE(lr(4), 1.0, 1e-12);                                      // cosine starts at the peak
  BOOST_CHECK_CLOSE(lr(9), 0.55, 1e-10);                                     // halfway: (1 + 0.1) / 2
  BOOST_CHECK_CLOSE(lr(6), 0.1 + 0.45 * (1 + std::cos(std::numbers::pi * 0.2)), 1e-10);
  BOOST_CHECK_CLOSE(lr(14), 0.1, 1e-12);
  BOOST_CHECK_CLOSE(lr(100), 0.1, 1e-12);
  BOOST_CHECK_THROW(nn::warmup_cosine_lr(1.0, 10, 5), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(step_lr_multiplies_by_gamma_every_step_size_steps) {
  const auto lr = nn::step_lr(1.0, 3, 0.5);
  BOOST_CHECK_EQUAL(lr(0), 1.0);
  BOOST_CHECK_EQUAL(lr(2), 1.0);
  BOOST_CHECK_EQUAL(lr(3), 0.5);
  BOOST_CHECK_EQUAL(lr(7), 0.25);
}

BOOST_AUTO_TEST_CASE(scheduler_sets_the_optimizer_rate_each_step) {
  ag::Tensor p = param({0.0});
  nn::SGD opt({p}, {.lr = 123.0});
  nn::LRScheduler sched(opt, nn::warmup_cosine_lr(1.0, 2, 10));
  BOOST_CHECK_EQUAL(opt.lr(), 0.5);
  sched.step();
  BOOST_CHECK_EQUAL(opt.lr(), 1.0);
  sched.set_step(10);
  BOOST_CHECK_EQUAL(opt.lr(), 0.0);
}

BOOST_AUTO_TEST_CASE(clip_grad_norm_scales_all_gradients_together) {
  // torch.nn.utils.clip_grad_norm_([p, q], 1.0) with grads [3, 4] and [12]: norm 13
  ag::Tensor p = param({0.0, 0.0}), q = param({0.0});
  set_grad(p, {3.0, 4.0});
  set_grad(q, {12.0});
  const double norm = nn::clip_grad_norm_({p, q}, 1.0);
  BOOST_CHECK_CLOSE(norm, 13.0, 1e-12);
  check_close(p.grad().to_vector(), {0.23076921301775288, 0.3076922840236705});
  check_close(q.grad().to_vector(), {0.9230768520710115});
}

BOOST_AUTO_TEST_CASE(clip_grad_norm_leaves_small_gradients_alone) {
  ag::Tensor p = param({0.0, 0.0});
  set_grad(p, {0.3, 0.4});
  BOOST_CHECK_CLOSE(nn::clip_grad_norm_({p}, 1.0), 0.5, 1e-12);
  check_close(p.grad().to_vector(), {0.3, 0.4});
}

BOOST_AUTO_TEST_CASE(clip_grad_norm_supports_the_max_norm) {
  ag::Tensor p = param({0.0, 0.0});
  set_grad(p, {-6.0, 2.0});
  BOOST_CHECK_CLOSE(nn::clip_grad_norm_({p}, 3.0, INFINITY), 6.0, 1e-12);
  check_close(p.grad().to_vector(), {-6.0 * 3.0 / (6.0 + 1e-6), 2.0 * 3.0 / (6.0 + 1e-6)});
}

BOOST_AUTO_TEST_CASE(clip_grad_value_clamps_each_element) {
  ag::Tensor p = param({0.0, 0.0, 0.0});
  p.set_grad(ag::tensor({-3.0, 0.5, 2.0}, {3}, ag::Dtype::Float64));
  nn::clip_grad_value_({p}, 1.0);
  check_close(p.grad().to_vector(), {-1.0, 0.5, 1.0});
}
