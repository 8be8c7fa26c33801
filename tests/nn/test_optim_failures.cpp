// Optimizers and clipping that refuse their input change nothing: a step that throws leaves every
// parameter, moment and step counter as it was, and a state that no run can reach is refused on
// load, with messages naming the optimizer, the parameter and the value.
#define BOOST_TEST_MODULE optim_failures
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include <nn/nn.hpp>

#include "test_support.hpp"

using namespace test_support::prelude;

namespace {

constexpr auto F32 = ag::Dtype::Float32;

ag::Tensor param(std::vector<double> v, ag::Dtype dtype = F64) {
  const auto n = static_cast<std::int64_t>(v.size());
  return ag::tensor(v, {n}, dtype).requires_grad_(true);
}

void set_grad(const ag::Tensor& p, std::vector<double> g, ag::Dtype dtype) {
  p.set_grad(ag::tensor(g, {static_cast<std::int64_t>(g.size())}, dtype));
}

// set_grad refuses a gradient that does not match its tensor, but the gradient's own handle can
// still be changed afterwards: the step must not trust it.
void set_mismatched_grad(const ag::Tensor& p, std::vector<double> g, ag::Dtype dtype) {
  p.set_grad(ag::zeros_like(p));
  p.grad().set_data(ag::tensor(g, {static_cast<std::int64_t>(g.size())}, dtype));
}

// The bytes of a tensor, to compare values bit for bit (NaN included).
std::string bytes_of(const ag::Tensor& t) {
  const auto n = static_cast<std::size_t>(t.numel()) * ag::dtype_size(t.dtype());
  return std::string(static_cast<const char*>(t.raw_data()), n);
}

// Everything a step may change: the parameters' values and the optimizer's state.
std::vector<std::string> snapshot(const nn::Optimizer& opt) {
  std::vector<std::string> out;
  for (const auto& p : opt.params()) out.push_back(ag::shape_str(p.shape()) + bytes_of(p));
  for (const auto& [name, t] : opt.state_dict()) out.push_back(name + ag::shape_str(t.shape()) + bytes_of(t));
  out.push_back(std::to_string(opt.step_count()));
  return out;
}

// One optimizer of each kind (and setting that keeps state), over params.
struct Kind {
  std::string name;  // what the messages start with
  std::function<std::unique_ptr<nn::Optimizer>(nn::OptimizerParams)> make;
};

std::vector<Kind> kinds() {
  return {
      {"SGD", [](nn::OptimizerParams p) { return std::make_unique<nn::SGD>(std::move(p), nn::SGDOptions{.lr = 0.1}); }},
      {"SGD", [](nn::OptimizerParams p) {
         return std::make_unique<nn::SGD>(std::move(p), nn::SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true});
       }},
      {"Adam", [](nn::OptimizerParams p) { return std::make_unique<nn::Adam>(std::move(p), nn::AdamOptions{.lr = 0.1}); }},
      {"Adam", [](nn::OptimizerParams p) {
         return std::make_unique<nn::Adam>(std::move(p), nn::AdamOptions{.lr = 0.1, .weight_decay = 0.1, .amsgrad = true});
       }},
      {"AdamW", [](nn::OptimizerParams p) { return std::make_unique<nn::AdamW>(std::move(p), nn::AdamWOptions{.lr = 0.1}); }},
  };
}

// Runs a step that must throw std::invalid_argument; checks that nothing changed and that the
// message holds every fragment.
void expect_failed_step(nn::Optimizer& opt, const std::vector<std::string>& fragments) {
  const auto before = snapshot(opt);
  const std::string message = test_support::message_of<std::invalid_argument>([&] { opt.step(); }, "a refused step");
  for (const auto& f : fragments) BOOST_CHECK_MESSAGE(contains(message, f), "'" << f << "' not in: " << message);
  BOOST_CHECK_MESSAGE(snapshot(opt) == before, opt.name() << ": the failed step changed something: " << message);
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_step_with_a_wrong_dtype_gradient_changes_nothing) {
  for (const auto& kind : kinds()) {
    ag::Tensor a = param({1.0, -2.0}), b = param({3.0, 4.0}), c = param({5.0});
    auto opt = kind.make({a, b, c});
    set_grad(a, {0.5, -1.0}, F64);
    set_grad(b, {0.25, 0.5}, F64);
    set_grad(c, {1.0}, F64);
    opt->step();  // some state exists: moments and step counts must survive the failed step too
    set_mismatched_grad(b, {0.25, 0.5}, F32);
    expect_failed_step(*opt, {kind.name + ".step", "gradient of parameter 1", "[2] Float32", "[2] Float64",
                              "no parameter was changed"});
  }
}

BOOST_AUTO_TEST_CASE(a_step_with_a_wrong_shape_gradient_changes_nothing) {
  for (const auto& kind : kinds()) {
    ag::Tensor a = param({1.0, -2.0}), b = param({3.0, 4.0});
    auto opt = kind.make({a, b});
    set_grad(a, {0.5, -1.0}, F64);
    set_mismatched_grad(b, {0.25, 0.5, 1.0}, F64);
    expect_failed_step(*opt, {kind.name + ".step", "gradient of parameter 1 is [3] Float64", "parameter is [2] Float64"});
  }
}

BOOST_AUTO_TEST_CASE(a_parameter_converted_after_its_state_was_made_is_refused_without_changes) {
  // Module::to after the optimizer has state: the state is Float32, the parameter Float64. The
  // old step updated the first parameter, then failed reading the state as Float64.
  for (const auto& kind : kinds()) {
    ag::Tensor a = param({1.0, -2.0}, F32), b = param({3.0, 4.0}, F32);
    auto opt = kind.make({a, b});
    set_grad(a, {0.5, -1.0}, F32);
    set_grad(b, {0.25, 0.5}, F32);
    opt->step();
    if (opt->state_dict().size() == 4) continue;  // plain SGD keeps only step counts: nothing to mismatch
    b.set_data(b.detach().to(F64));
    set_grad(a, {0.5, -1.0}, F32);
    set_grad(b, {0.25, 0.5}, F64);
    expect_failed_step(*opt, {kind.name + ".step", "parameter 1 is [2] Float64", "state is [2] Float32",
                              "Module::to"});
  }
}

BOOST_AUTO_TEST_CASE(a_parameter_resized_after_its_state_was_made_is_refused_without_changes) {
  // The old step read and wrote the 2-element moments as 3-element arrays (out of bounds).
  for (const auto& kind : kinds()) {
    ag::Tensor a = param({1.0, -2.0}), b = param({3.0, 4.0});
    auto opt = kind.make({a, b});
    set_grad(a, {0.5, -1.0}, F64);
    set_grad(b, {0.25, 0.5}, F64);
    opt->step();
    if (opt->state_dict().size() == 4) continue;  // plain SGD: no moments
    b.set_data(ag::zeros({3}, F64));
    set_grad(a, {0.5, -1.0}, F64);
    set_grad(b, {0.25, 0.5, 1.0}, F64);
    expect_failed_step(*opt, {kind.name + ".step", "parameter 1 is [3] Float64", "state is [2] Float64"});
  }
}

BOOST_AUTO_TEST_CASE(an_optimizer_given_named_parameters_names_them_in_messages) {
  nn::Linear layer(nn::LinearOptions{.in_features = 2, .out_features = 3, .dtype = F64});
  nn::Adam opt(layer.named_parameters(), {.lr = 0.1});
  BOOST_TEST(opt.param_names() == (std::vector<std::string>{"weight", "bias"}));
  layer.weight().set_grad(ag::ones({2, 3}, F64));
  set_mismatched_grad(layer.bias(), {1.0, 1.0, 1.0}, F32);
  expect_failed_step(opt, {"Adam.step: the gradient of parameter 1 ('bias') is [3] Float32"});
  // Unnamed optimizers say the index only.
  nn::Adam unnamed(layer.parameters());
  BOOST_TEST(unnamed.param_names() == (std::vector<std::string>{"", ""}));
  expect_failed_step(unnamed, {"Adam.step: the gradient of parameter 1 is [3] Float32"});
}

BOOST_AUTO_TEST_CASE(a_good_step_after_a_refused_one_equals_a_step_never_refused) {
  ag::Tensor a = param({1.0, -2.0}), b = param({3.0, 4.0});
  ag::Tensor a2 = param({1.0, -2.0}), b2 = param({3.0, 4.0});
  nn::Adam opt({a, b}, {.lr = 0.1}), ref({a2, b2}, {.lr = 0.1});
  set_grad(a, {0.5, -1.0}, F64);
  set_mismatched_grad(b, {0.25, 0.5}, F32);
  BOOST_CHECK_THROW(opt.step(), std::invalid_argument);
  for (const auto& p : {a, a2}) set_grad(p, {0.3, 0.3}, F64);
  for (const auto& p : {b, b2}) set_grad(p, {-0.7, -0.7}, F64);
  opt.step();
  ref.step();
  BOOST_CHECK(bytes_of(a) == bytes_of(a2));
  BOOST_CHECK(bytes_of(b) == bytes_of(b2));
  BOOST_CHECK(snapshot(opt) == snapshot(ref));
}

BOOST_AUTO_TEST_CASE(clip_grad_value_with_an_undefined_entry_changes_no_gradient) {
  ag::Tensor a = param({0.0, 0.0});
  set_grad(a, {-3.0, 2.0}, F64);
  const std::string message = test_support::error_of([&] { nn::clip_grad_value_({a, ag::Tensor()}, 1.0); });
  BOOST_TEST(message == "clip_grad_value_: parameter 1 of 2 is undefined; no gradient was changed");
  BOOST_TEST(a.grad().to_vector() == (std::vector<double>{-3.0, 2.0}));
}

BOOST_AUTO_TEST_CASE(clip_grad_norm_with_an_undefined_entry_changes_no_gradient) {
  ag::Tensor a = param({0.0, 0.0});
  set_grad(a, {-3.0, 4.0}, F64);
  const std::string message = test_support::error_of([&] { nn::clip_grad_norm_({a, ag::Tensor()}, 1.0); });
  BOOST_TEST(message == "clip_grad_norm_: parameter 1 of 2 is undefined; no gradient was changed");
  BOOST_TEST(a.grad().to_vector() == (std::vector<double>{-3.0, 4.0}));
}

// ---- loaded state is checked for values no run can reach ----

namespace {

// An Adam (amsgrad) over two parameters after two steps, and its state.
struct Trained {
  ag::Tensor a = param({1.0, -2.0}), b = param({3.0, 4.0, 5.0});
  nn::Adam opt{nn::NamedTensors{{"enc.w", a}, {"dec.w", b}}, {.lr = 0.1, .amsgrad = true}};
  Trained() {
    for (double g : {0.5, -0.25}) {
      set_grad(a, {g, -g}, F64);
      set_grad(b, {g, g, -g}, F64);
      opt.step();
    }
  }
};

// state with entry `name` holding `value` at element `at`.
nn::NamedTensors with_value(const nn::NamedTensors& state, const std::string& name, std::size_t at, double value) {
  nn::NamedTensors out;
  bool found = false;
  for (const auto& [n, t] : state) {
    ag::Tensor copy = t.detach().clone();
    if (n == name) {
      std::vector<double> v = copy.to_vector();
      v.at(at) = value;
      copy = ag::tensor(v, copy.shape(), copy.dtype());
      found = true;
    }
    out.emplace_back(n, copy);
  }
  BOOST_REQUIRE_MESSAGE(found, "no entry " << name);
  return out;
}

void expect_refused(nn::Optimizer& opt, const nn::NamedTensors& state, const std::vector<std::string>& fragments) {
  const auto before = snapshot(opt);
  const std::string checked = test_support::error_of([&] { opt.check_state_dict(state); }, "(no error)");
  const std::string loaded = test_support::error_of([&] { opt.load_state_dict(state); }, "(no error)");
  BOOST_TEST(checked == loaded);
  for (const auto& f : fragments) BOOST_CHECK_MESSAGE(contains(loaded, f), "'" << f << "' not in: " << loaded);
  BOOST_CHECK_MESSAGE(snapshot(opt) == before, "a refused load changed the optimizer: " << loaded);
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_negative_second_moment_is_refused_on_load) {
  Trained t;
  expect_refused(t.opt, with_value(t.opt.state_dict(), "state.1.exp_avg_sq", 2, -1.0),
                 {"Adam.load_state_dict: 'state.1.exp_avg_sq' holds -1 at element 2, but the exp_avg_sq of "
                  "parameter 1 ('dec.w') must be finite and >= 0"});
  expect_refused(t.opt, with_value(t.opt.state_dict(), "state.0.max_exp_avg_sq", 0, -0.5),
                 {"'state.0.max_exp_avg_sq'", "parameter 0 ('enc.w')", "holds -0.5 at element 0", ">= 0"});
}

BOOST_AUTO_TEST_CASE(nan_or_infinite_moments_are_refused_on_load) {
  Trained t;
  expect_refused(t.opt, with_value(t.opt.state_dict(), "state.0.exp_avg_sq", 1, kNaN),
                 {"'state.0.exp_avg_sq'", "holds nan at element 1"});
  expect_refused(t.opt, with_value(t.opt.state_dict(), "state.1.exp_avg", 0, kInf),
                 {"'state.1.exp_avg'", "holds inf at element 0", "must be finite"});
  expect_refused(t.opt, with_value(t.opt.state_dict(), "state.1.exp_avg", 1, -kInf), {"holds -inf at element 1"});
  // A negative first moment is an ordinary value.
  BOOST_CHECK_NO_THROW(t.opt.check_state_dict(with_value(t.opt.state_dict(), "state.1.exp_avg", 1, -3.0)));
}

BOOST_AUTO_TEST_CASE(a_nan_momentum_buffer_is_refused_on_load) {
  ag::Tensor p = param({1.0, 2.0}, F32);
  nn::SGD opt({p}, {.lr = 0.1, .momentum = 0.9});
  set_grad(p, {1.0, -1.0}, F32);
  opt.step();
  expect_refused(opt, with_value(opt.state_dict(), "state.0.momentum_buffer", 1, kNaN),
                 {"SGD.load_state_dict: 'state.0.momentum_buffer' holds nan at element 1, but the momentum_buffer of "
                  "parameter 0 must be finite"});
  // A negative momentum buffer is an ordinary value.
  BOOST_CHECK_NO_THROW(opt.check_state_dict(with_value(opt.state_dict(), "state.0.momentum_buffer", 1, -5.0)));
}

BOOST_AUTO_TEST_CASE(negative_or_nan_steps_and_rates_are_refused_on_load) {
  Trained t;
  const auto state = t.opt.state_dict();
  expect_refused(t.opt, with_value(state, "state.0.step", 0, -1.0), {"'state.0.step' must be a non-negative integer, got -1"});
  expect_refused(t.opt, with_value(state, "state.1.step", 0, kNaN), {"'state.1.step'", "got nan"});
  expect_refused(t.opt, with_value(state, "step_count", 0, -2.0), {"'step_count'", "got -2"});
  expect_refused(t.opt, with_value(state, "param_groups.0.lr", 0, kNaN), {"'param_groups.0.lr' must be finite"});
}

BOOST_AUTO_TEST_CASE(a_load_refused_late_in_the_list_changes_nothing) {
  // The bad value is in the last parameter's state: everything before it was valid.
  Trained t;
  ag::Tensor a = param({1.0, -2.0}), b = param({3.0, 4.0, 5.0});
  nn::Adam target({a, b}, {.lr = 0.7, .amsgrad = true});
  set_grad(a, {1.0, 1.0}, F64);
  set_grad(b, {1.0, 1.0, 1.0}, F64);
  target.step();
  expect_refused(target, with_value(t.opt.state_dict(), "state.1.max_exp_avg_sq", 2, -1.0), {"state.1.max_exp_avg_sq"});
  BOOST_TEST(target.lr() == 0.7);
  BOOST_TEST(target.step_count() == 1);
}

BOOST_AUTO_TEST_CASE(entry_names_with_control_bytes_are_printed_escaped) {
  Trained t;
  auto state = t.opt.state_dict();
  state.emplace_back(std::string("bo\0gus", 6), ag::scalar_tensor(1.0, F64));
  expect_refused(t.opt, state, {"unexpected entry 'bo\\x00gus'"});
}

BOOST_AUTO_TEST_CASE(load_checkpoint_refuses_a_negative_second_moment_and_changes_nothing) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("headgrad_optim_failures_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string good = (dir / "good.safetensors").string(), bad = (dir / "bad.safetensors").string();
  nn::Linear layer(nn::LinearOptions{.in_features = 2, .out_features = 2, .dtype = F64});
  nn::Adam opt(layer.parameters(), {.lr = 0.1});
  for (auto& p : layer.parameters()) p.set_grad(ag::ones_like(p));
  opt.step();
  nn::save_checkpoint(good, layer, opt);
  auto file = nn::load_safetensors(good);
  for (auto& [name, t] : file.tensors)
    if (name == "optimizer.state.1.exp_avg_sq") t = ag::full(t.shape(), -1.0, t.dtype());
  nn::save_safetensors(bad, file.tensors, file.metadata);

  nn::Linear other(nn::LinearOptions{.in_features = 2, .out_features = 2, .dtype = F64});
  nn::Adam other_opt(other.parameters(), {.lr = 0.1});
  const auto before = snapshot(other_opt);
  try {
    nn::load_checkpoint(bad, other, other_opt);
    BOOST_ERROR("a negative exp_avg_sq was loaded");
  } catch (const std::exception& e) {
    BOOST_CHECK_MESSAGE(contains(e.what(), "'state.1.exp_avg_sq'") && contains(e.what(), "holds -1"), e.what());
  }
  BOOST_CHECK(snapshot(other_opt) == before);
  fs::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(adam_refuses_an_eps_that_would_divide_zero_by_zero) {
  // With eps = 0 a parameter whose gradient has always been 0 gets 0 / (sqrt(0) + 0) = NaN.
  ag::Tensor p = ag::zeros({1}, ag::Dtype::Float64).requires_grad_();
  for (double eps : {0.0, -1e-8, std::nan(""), std::numeric_limits<double>::infinity()}) {
    const std::string adam = test_support::error_of([&] { nn::Adam({p}, {.eps = eps}); });
    BOOST_TEST(adam.find("Adam: eps must be positive and finite") != std::string::npos, adam);
    const std::string adamw = test_support::error_of([&] { nn::AdamW({p}, {.eps = eps}); });
    BOOST_TEST(adamw.find("AdamW: eps must be positive and finite") != std::string::npos, adamw);
  }
  BOOST_CHECK_NO_THROW(nn::Adam({p}, {.eps = 1e-12}));
}
