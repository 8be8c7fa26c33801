// Module trees: tied (shared) weights are listed once, so clipping and optimizers see each tensor
// once; names that cannot be dotted paths are refused, and messages show every byte of a name.
#define BOOST_TEST_MODULE module
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include <nn/nn.hpp>

#include "test_support.hpp"

namespace ag = autograd;
using test_support::contains;

namespace {

constexpr auto F64 = ag::Dtype::Float64;

// One Linear held under two names (an encoder and a decoder sharing their weights), plus a
// parameter of its own.
struct Tied : nn::Module {
  std::shared_ptr<nn::Linear> shared;
  ag::Tensor scale;
  Tied() : Module("Tied") {
    shared = std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 2, .out_features = 2, .dtype = F64});
    register_module("encoder", shared);
    register_module("decoder", shared);
    scale = register_parameter("scale", ag::ones({2}, F64));
  }
  ag::Tensor forward(const ag::Tensor& x) const { return shared->forward(shared->forward(x) * scale); }
};

// One tensor registered under two names in the same module.
struct SameTensor : nn::Module {
  ag::Tensor w;
  SameTensor() : Module("SameTensor") {
    w = register_parameter("w", ag::tensor({0.0, 0.0}, {2}, F64));
    register_parameter("w_alias", w);
  }
};

std::vector<std::string> names_of(const nn::NamedTensors& named) {
  std::vector<std::string> out;
  for (const auto& [name, t] : named) out.push_back(name);
  return out;
}

}  // namespace

// ---- tied weights ----

BOOST_AUTO_TEST_CASE(a_child_registered_twice_lists_its_parameters_once_under_the_first_name) {
  Tied m;
  BOOST_TEST(names_of(m.named_parameters()) == (std::vector<std::string>{"scale", "encoder.weight", "encoder.bias"}));
  BOOST_TEST(m.parameters().size() == 3u);
  BOOST_TEST(m.num_parameters() == 2 + 4 + 2);
  // Every name, when asked for.
  BOOST_TEST(names_of(m.named_parameters(true, false)) ==
             (std::vector<std::string>{"scale", "encoder.weight", "encoder.bias", "decoder.weight", "decoder.bias"}));
  BOOST_CHECK(m.parameter("decoder.weight").is_same(m.parameter("encoder.weight")));
}

BOOST_AUTO_TEST_CASE(named_modules_lists_each_module_once_unless_asked_otherwise) {
  Tied m;
  std::vector<std::string> names;
  for (const auto& [name, module] : m.named_modules()) names.push_back(name);
  BOOST_TEST(names == (std::vector<std::string>{"", "encoder"}));
  names.clear();
  for (const auto& [name, module] : m.named_modules(false)) names.push_back(name);
  BOOST_TEST(names == (std::vector<std::string>{"", "encoder", "decoder"}));
  BOOST_CHECK(m.named_modules()[0].second == &m);
  BOOST_CHECK(m.named_modules()[1].second == m.shared.get());
}

BOOST_AUTO_TEST_CASE(a_tensor_registered_twice_in_one_module_is_listed_once) {
  SameTensor m;
  BOOST_TEST(names_of(m.named_parameters()) == (std::vector<std::string>{"w"}));
  BOOST_TEST(names_of(m.named_parameters(true, false)) == (std::vector<std::string>{"w", "w_alias"}));
  BOOST_TEST(m.num_parameters() == 2);
  BOOST_CHECK(m.parameter("w_alias").is_same(m.w));
}

BOOST_AUTO_TEST_CASE(clip_grad_norm_of_a_tied_model_counts_the_shared_gradient_once) {
  // The shared tensor's gradient is [3, 4]: norm 5 (counted twice it would read √50 = 7.07 and
  // be scaled twice).
  SameTensor m;
  m.w.set_grad(ag::tensor({3.0, 4.0}, {2}, F64));
  const double norm = nn::clip_grad_norm_(m.parameters(), 1.0);
  BOOST_CHECK_CLOSE(norm, 5.0, 1e-12);
  test_support::check_values(m.w.grad(), {2}, {3.0 / (5.0 + 1e-6), 4.0 / (5.0 + 1e-6)}, 1e-15);
}

BOOST_AUTO_TEST_CASE(clip_grad_norm_counts_a_tensor_listed_twice_once) {
  ag::Tensor p = ag::tensor({0.0, 0.0}, {2}, F64).requires_grad_(true);
  ag::Tensor q = ag::tensor({0.0}, {1}, F64).requires_grad_(true);
  p.set_grad(ag::tensor({3.0, 4.0}, {2}, F64));
  q.set_grad(ag::tensor({12.0}, {1}, F64));
  BOOST_CHECK_CLOSE(nn::clip_grad_norm_({p, q, p}, 1.0), 13.0, 1e-12);
  test_support::check_values(p.grad(), {2}, {3.0 / (13.0 + 1e-6), 4.0 / (13.0 + 1e-6)}, 1e-15);
  test_support::check_values(q.grad(), {1}, {12.0 / (13.0 + 1e-6)}, 1e-15);
}

BOOST_AUTO_TEST_CASE(an_optimizer_over_a_tied_model_steps_each_tensor_once) {
  Tied m;
  nn::SGD opt(m.parameters(), {.lr = 0.5});
  const ag::Tensor x = ag::tensor({1.0, -2.0, 0.5, 3.0}, {2, 2}, F64);
  const std::vector<double> w0 = m.shared->weight().to_vector();
  opt.zero_grad();
  ag::sum(m.forward(x)).backward();  // the shared weight is used twice: its gradient sums both uses
  const std::vector<double> g = m.shared->weight().grad().to_vector();
  opt.step();
  const std::vector<double> w1 = m.shared->weight().to_vector();
  for (std::size_t i = 0; i < w0.size(); ++i) BOOST_TEST(w1[i] == w0[i] - 0.5 * g[i]);
}

BOOST_AUTO_TEST_CASE(an_optimizer_over_named_tied_parameters_names_each_once) {
  Tied m;
  nn::Adam opt(m.named_parameters());
  BOOST_TEST(opt.param_names() == (std::vector<std::string>{"scale", "encoder.weight", "encoder.bias"}));
}

BOOST_AUTO_TEST_CASE(a_tied_model_round_trips_through_a_checkpoint) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("headgrad_module_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "tied.safetensors").string();
  Tied a, b;
  {
    ag::NoGradGuard no_grad;
    ag::Tensor w = a.shared->weight();
    w.copy_(ag::tensor({1.0, 2.0, 3.0, 4.0}, {2, 2}, F64));
  }
  nn::Adam opt_a(a.parameters(), {.lr = 0.1});
  for (const auto& p : a.parameters()) p.set_grad(ag::ones_like(p));
  opt_a.step();
  nn::save_checkpoint(path, a, opt_a);
  nn::Adam opt_b(b.parameters(), {.lr = 0.1});
  nn::load_checkpoint(path, b, opt_b);
  BOOST_TEST(b.shared->weight().to_vector() == a.shared->weight().to_vector());
  BOOST_CHECK(b.parameter("decoder.weight").is_same(b.shared->weight()));  // still tied
  BOOST_TEST(opt_b.step_count() == 1);
  fs::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(a_module_cannot_contain_itself) {
  auto outer = std::make_shared<nn::Module>("Outer");
  auto inner = std::make_shared<nn::Module>("Inner");
  outer->register_module("inner", inner);
  test_support::check_message([&] { outer->register_module("self", outer); },
                              "register_module: module 'self' (Outer) is this Outer or contains it");
  test_support::check_message([&] { inner->register_module("parent", outer); }, "a module cannot contain itself");
  BOOST_TEST(outer->named_modules().size() == 2u);
}

// ---- names ----

BOOST_AUTO_TEST_CASE(names_with_a_nul_byte_a_dot_or_nothing_are_refused) {
  nn::Module m("M");
  const std::string nul("a\0b", 3);
  const std::string message = test_support::error_of([&] { m.register_parameter(nul, ag::zeros({1})); });
  // The whole message arrives (the name is escaped, so the NUL does not cut it).
  BOOST_TEST(message ==
             "register_parameter: parameter name 'a\\x00b' must be non-empty and contain no '.' and no NUL byte");
  BOOST_TEST(test_support::error_of([&] { m.register_parameter("a.b", ag::zeros({1})); }) ==
             "register_parameter: parameter name 'a.b' must be non-empty and contain no '.' and no NUL byte");
  BOOST_CHECK_THROW(m.register_parameter("", ag::zeros({1})), std::invalid_argument);
  auto child = std::make_shared<nn::Module>("Child");
  BOOST_TEST(test_support::error_of([&] { m.register_module(nul, child); }) ==
             "register_module: module name 'a\\x00b' must be non-empty and contain no '.' and no NUL byte");
  BOOST_CHECK_THROW(m.register_module("x.y", child), std::invalid_argument);
  BOOST_CHECK_THROW(m.register_module("", child), std::invalid_argument);
  BOOST_TEST(m.named_parameters().empty());
  BOOST_TEST(m.named_children().empty());
}

BOOST_AUTO_TEST_CASE(quote_name_shows_every_byte) {
  BOOST_TEST(nn::quote_name("W_Q") == "'W_Q'");
  BOOST_TEST(nn::quote_name(std::string("a\0b\n\x7f", 5)) == "'a\\x00b\\x0a\\x7f'");
  BOOST_TEST(nn::quote_name("it's a\\b") == "'it\\'s a\\\\b'");
  BOOST_TEST(nn::quote_name("größe") == "'größe'");  // UTF-8 passes through
}

BOOST_AUTO_TEST_CASE(looking_up_a_name_with_a_nul_byte_reports_it_in_full) {
  SameTensor m;
  BOOST_TEST(test_support::error_of([&] { m.parameter(std::string("w\0x", 3)); }) ==
             "parameter: no parameter named 'w\\x00x' in SameTensor");
}

// ---- parameters carry their dotted names as tensor names ----

namespace {

// A model holding a TransformerBlock under "block": its parameters' names are three deep.
struct Model : nn::Module {
  std::shared_ptr<nn::TransformerBlock> block;
  Model() : Module("Model") {
    block = register_module("block", std::make_shared<nn::TransformerBlock>(
                                         nn::TransformerBlockOptions{.d_model = 4, .num_heads = 2, .dtype = F64}));
  }
};

// Every tensor's name is the name named_parameters() lists it under.
void check_tensor_names_match(const nn::Module& m) {
  const auto named = m.named_parameters();
  BOOST_TEST(!named.empty());
  for (const auto& [name, p] : named) BOOST_TEST(p.name() == name);
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_parameter_is_named_by_its_local_name_when_registered) {
  nn::Linear lin(nn::LinearOptions{.in_features = 2, .out_features = 3, .dtype = F64});
  BOOST_TEST(lin.weight().name() == "weight");
  BOOST_TEST(lin.bias().name() == "bias");
  nn::MultiHeadAttention mha(4, 2);
  BOOST_TEST(mha.parameter("W_Q").name() == "W_Q");
  check_tensor_names_match(mha);
}

BOOST_AUTO_TEST_CASE(registering_a_child_prefixes_its_parameters_names_at_every_level) {
  nn::TransformerBlock block(nn::TransformerBlockOptions{.d_model = 4, .num_heads = 2, .dtype = F64});
  BOOST_TEST(block.parameter("attn.W_Q").name() == "attn.W_Q");
  BOOST_TEST(block.parameter("fc_1.weight").name() == "fc_1.weight");
  check_tensor_names_match(block);
  Model model;
  BOOST_TEST(model.parameter("block.attn.W_Q").name() == "block.attn.W_Q");
  BOOST_TEST(model.parameter("block.fc_2.bias").name() == "block.fc_2.bias");
  check_tensor_names_match(model);
  // The block's own handles see the same names: the names live on the shared tensors.
  BOOST_TEST(model.block->parameter("ln_1.weight").name() == "block.ln_1.weight");
}

BOOST_AUTO_TEST_CASE(a_tied_tensor_is_named_by_its_first_name_in_named_parameters) {
  Tied m;  // one Linear under "encoder" and "decoder"
  BOOST_TEST(m.shared->weight().name() == "encoder.weight");
  check_tensor_names_match(m);
  SameTensor s;  // one tensor as "w" and "w_alias"
  BOOST_TEST(s.w.name() == "w");
  // A tensor first met as a child's parameter, then registered in the parent itself: the
  // parent's own parameters come first in the walk, so its own name wins.
  nn::Module parent("Parent");
  auto child = std::make_shared<nn::Linear>(nn::LinearOptions{.in_features = 2, .out_features = 2, .dtype = F64});
  parent.register_module("child", child);
  BOOST_TEST(child->weight().name() == "child.weight");
  parent.register_parameter("tied", child->weight());
  // "child.weight" is the same tensor as "tied", listed once.
  BOOST_TEST(names_of(parent.named_parameters()) == (std::vector<std::string>{"tied", "child.bias"}));
  BOOST_TEST(child->weight().name() == "tied");
  check_tensor_names_match(parent);
}

BOOST_AUTO_TEST_CASE(a_name_given_before_registering_is_kept) {
  auto inner = std::make_shared<nn::Module>("Inner");
  ag::Tensor t = ag::zeros({2}, F64);
  t.set_name("my scale");
  inner->register_parameter("scale", t);
  nn::Module outer("Outer");
  outer.register_module("inner", inner);
  BOOST_TEST(outer.parameter("inner.scale").name() == "my scale");
}

BOOST_AUTO_TEST_CASE(converting_a_module_keeps_its_parameters_names) {
  Model model;
  model.to(ag::Dtype::Float32);
  BOOST_CHECK(model.parameter("block.attn.W_O").dtype() == ag::Dtype::Float32);
  check_tensor_names_match(model);
  model.to(F64);
  check_tensor_names_match(model);
}

namespace {

// y = x², with a backward 1% too large: a wrong gradient for gradcheck to find.
struct SquareWrong : ag::Function<SquareWrong> {
  static constexpr const char* name = "square_wrong";
  static ag::Tensor forward(ag::FunctionCtx& ctx, const ag::Tensor& x) {
    ctx.save_for_backward({x});
    return x * x;
  }
  static ag::TensorList backward(ag::FunctionCtx& ctx, const ag::TensorList& g) {
    return {g[0] * 2.02 * ctx.saved_tensors()[0]};
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(gradcheck_names_a_failing_parameter_by_its_dotted_name) {
  // Negative control: the output projection's weight gets a wrong gradient, so the check fails
  // there and says which parameter it is; the other input's gradient is right.
  Model model;
  const std::vector<ag::Tensor> inputs{model.parameter("block.fc_1.bias"), model.parameter("block.attn.W_O")};
  auto f = [](const std::vector<ag::Tensor>& in) { return ag::sum(in[0] * in[0]) + ag::sum(SquareWrong::apply(in[1])); };
  const auto r = ag::gradcheck(f, inputs);
  BOOST_CHECK(!r.ok);
  BOOST_CHECK_EQUAL(r.worst_input, 1);
  BOOST_CHECK_EQUAL(r.worst_input_name, "block.attn.W_O");
  BOOST_TEST(r.message.find("input 1 'block.attn.W_O' element ") == 0u, r.message);
}
