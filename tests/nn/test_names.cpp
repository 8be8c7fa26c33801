// Names with any bytes in them (a NUL, a quote, a backslash, a line break) reach messages, printed
// tensors and Graphviz output whole: printable() spells out the bytes that would not print as
// themselves, so no name is cut at a NUL and no DOT label is broken by a quote.
#define BOOST_TEST_MODULE names
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <string>
#include <string_view>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

#include "test_support.hpp"

namespace ag = autograd;
using ag::Tensor;
using ag::TensorList;
using test_support::error_of;
using namespace std::string_literals;

namespace {

// y = 2x recorded under `name`.
Tensor doubled(const Tensor& x, std::string_view name) {
  Tensor y = x.detach() * 2.0;
  return ag::record(name, {x}, y, [](const TensorList& g, const ag::Node&) { return TensorList{g[0] * 2.0}; });
}

bool has_nul(const std::string& s) { return s.find('\0') != std::string::npos; }

}  // namespace

BOOST_AUTO_TEST_CASE(printable_spells_out_control_bytes_and_backslashes) {
  BOOST_TEST(ag::printable("weight") == "weight");
  BOOST_TEST(ag::printable("a\0b"s) == "a\\x00b");
  BOOST_TEST(ag::printable("tab\there\nnl\x7f") == "tab\\x09here\\x0anl\\x7f");
  BOOST_TEST(ag::printable("back\\slash \"quoted\"") == "back\\\\slash \"quoted\"");
  BOOST_TEST(ag::printable("caf\xc3\xa9") == "caf\xc3\xa9");  // UTF-8 stays as it is
}

BOOST_AUTO_TEST_CASE(a_tensor_name_with_a_nul_byte_is_shown_whole_by_to_dot) {
  Tensor x = ag::ones({2}, ag::Dtype::Float64).requires_grad_();
  x.set_name("input\0hidden"s);
  Tensor y = ag::sum(x * 3.0);
  y.set_name("loss\0tail"s);
  const std::string dot = ag::to_dot(y);
  BOOST_TEST(!has_nul(dot));
  BOOST_TEST(dot.find("label=\"input\\\\x00hidden\\n[2]\"") != std::string::npos, dot);
  BOOST_TEST(dot.find("label=\"loss\\\\x00tail\\n[]\"") != std::string::npos, dot);
}

BOOST_AUTO_TEST_CASE(quotes_and_backslashes_in_names_do_not_break_dot_labels) {
  Tensor x = ag::ones({1}, ag::Dtype::Float64).requires_grad_();
  x.set_name("say \"hi\" \\");
  Tensor y = doubled(x, "my\"op\\");
  const std::string dot = ag::to_dot(y);
  // In DOT: \" is a quote and \\ a backslash; the label shows printable()'s text.
  BOOST_TEST(dot.find("label=\"say \\\"hi\\\" \\\\\\\\\\n[1]\"") != std::string::npos, dot);
  BOOST_TEST(dot.find("label=\"my\\\"op\\\\\\\\\\n[1]\"") != std::string::npos, dot);
}

BOOST_AUTO_TEST_CASE(an_op_name_with_a_nul_byte_is_shown_whole_in_messages_and_printing) {
  Tensor x = ag::ones({2}, ag::Dtype::Float64).requires_grad_();
  Tensor y = doubled(x, "custom\0op"s);
  const std::string message = error_of([&] { y.requires_grad_(false); });
  BOOST_TEST(std::strlen(message.c_str()) == message.size());  // what() is not cut short
  BOOST_TEST(message.find("made by 'custom\\x00op'") != std::string::npos, message);
  const std::string printed = ag::to_string(y);
  BOOST_TEST(!has_nul(printed));
  BOOST_TEST(printed.find("grad_fn=<custom\\x00op>") != std::string::npos, printed);
  const std::string dot = ag::to_dot(y);
  BOOST_TEST(!has_nul(dot));
  BOOST_TEST(dot.find("label=\"custom\\\\x00op\\n[2]\"") != std::string::npos, dot);
}

// ---- an undefined tensor says what it is ----

BOOST_AUTO_TEST_CASE(a_default_constructed_tensor_says_it_holds_no_value) {
  const Tensor none;
  BOOST_TEST(error_of([&] { none.to_vector(); }) == "to_vector: called on an undefined tensor (default-constructed: no value)");
  BOOST_TEST(error_of([&] { (void)none.shape(); }) == "shape: called on an undefined tensor (default-constructed: no value)");
  BOOST_TEST(error_of([&] { none.data<double>(); }) == "data: called on an undefined tensor (default-constructed: no value)");
  BOOST_TEST(ag::undefined_description(none) == "an undefined tensor (default-constructed: no value)");
  BOOST_TEST(error_of([&] { ag::sum(none); }) == "sum: the input is an undefined tensor (default-constructed: no value)");
}

BOOST_AUTO_TEST_CASE(a_grad_before_backward_names_its_tensor_and_says_why) {
  Tensor w = ag::ones({4, 4}, ag::Dtype::Float64).requires_grad_();
  w.set_name("attn.W_Q");
  const Tensor g = w.grad();
  BOOST_TEST(!g.defined());
  BOOST_TEST(error_of([&] { g.to_vector(); }) ==
             "to_vector: the .grad() of 'attn.W_Q' [4, 4] is undefined: no backward has reached it yet "
             "(call backward() on a loss that depends on it)");
  BOOST_TEST(error_of([&] { g.data<double>(); }).starts_with("data: the .grad() of 'attn.W_Q' [4, 4] is undefined"));
  BOOST_TEST(error_of([&] { ag::sum(g); }) ==
             "sum: the input is the .grad() of 'attn.W_Q' [4, 4], which is undefined: no backward has reached it yet "
             "(call backward() on a loss that depends on it)");
  // An unnamed tensor is named by its shape.
  const Tensor x = ag::ones({2, 3}, ag::Dtype::Float64).requires_grad_();
  BOOST_TEST(error_of([&] { x.grad().item(); }) ==
             "item: the .grad() of a tensor of shape [2, 3] is undefined: no backward has reached it yet "
             "(call backward() on a loss that depends on it)");
  // Once a backward reaches the tensor, its .grad() is there.
  ag::sum(w * 2.0).backward();
  BOOST_TEST(w.grad().to_vector() == std::vector<double>(16, 2.0), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_grad_that_will_never_come_says_why) {
  const Tensor c = ag::ones({2}, ag::Dtype::Float64);  // requires no grad
  BOOST_TEST(error_of([&] { c.grad().to_vector(); }) ==
             "to_vector: the .grad() of a tensor of shape [2] is undefined: the tensor does not require grad "
             "(call requires_grad_() on it before the forward pass)");
  const Tensor x = ag::ones({2}, ag::Dtype::Float64).requires_grad_();
  Tensor h = x * 3.0;
  h.set_name("hidden");
  ag::sum(h).backward();
  BOOST_TEST(error_of([&] { h.grad().to_vector(); }) ==
             "to_vector: the .grad() of 'hidden' [2] is undefined: it is not a leaf (made by 'mul'), and a non-leaf "
             "keeps no .grad() unless retain_grad() is called on it before backward()");
  Tensor orphan;
  {
    const Tensor gone = ag::ones({3}, ag::Dtype::Float64).requires_grad_();
    orphan = gone.grad();
  }
  BOOST_TEST(error_of([&] { orphan.to_vector(); }) ==
             "to_vector: the .grad() of a tensor that no longer exists is undefined: no backward had reached it");
}

BOOST_AUTO_TEST_CASE(an_undefined_tensor_can_carry_its_reason) {
  const Tensor weights = Tensor::undefined("the attention weights: need_weights is false");
  BOOST_TEST(!weights.defined());
  BOOST_TEST(error_of([&] { weights.to_vector(); }) ==
             "to_vector: called on an undefined tensor (the attention weights: need_weights is false)");
  BOOST_TEST(error_of([&] { ag::sum(weights); }) ==
             "sum: the input is an undefined tensor (the attention weights: need_weights is false)");
}

BOOST_AUTO_TEST_CASE(in_place_and_graph_functions_describe_an_undefined_argument) {
  Tensor x = ag::ones({2}, ag::Dtype::Float64).requires_grad_();
  x.set_name("x");
  Tensor y = ag::zeros({2}, ag::Dtype::Float64);
  BOOST_TEST(error_of([&] { y.copy_(x.grad()); }) ==
             "copy_: the source is the .grad() of 'x' [2], which is undefined: no backward has reached it yet "
             "(call backward() on a loss that depends on it)");
  BOOST_TEST(error_of([&] { y.add_(Tensor()); }) ==
             "add_: the other tensor is an undefined tensor (default-constructed: no value)");
  BOOST_TEST(error_of([&] { y.set_data(Tensor()); }) ==
             "set_data: the source is an undefined tensor (default-constructed: no value)");
  BOOST_TEST(error_of([&] { ag::to_dot(x.grad()); }).starts_with("to_dot: the tensor is the .grad() of 'x' [2], which is undefined"));
}

BOOST_AUTO_TEST_CASE(an_undefined_grad_costs_a_tensor_nothing_and_is_not_stored) {
  static_assert(sizeof(Tensor) == sizeof(std::shared_ptr<ag::TensorImpl>));
  Tensor x = ag::ones({2}, ag::Dtype::Float64).requires_grad_();
  Tensor other = ag::ones({2}, ag::Dtype::Float64).requires_grad_();
  x.set_grad(ag::ones({2}, ag::Dtype::Float64));
  x.set_grad(other.grad());  // clears: an undefined gradient, whatever note it carries
  BOOST_TEST(!x.grad().defined());
  BOOST_TEST(x.impl()->grad.use_count() == 0);  // no note kept alive in the tensor
  BOOST_TEST(Tensor().is_same(x.grad()));  // two undefined tensors are the same "no tensor"
}

// ---- to_dot: parameters by their dotted names, and marked tensors ----

namespace {

// Three Linear layers, each with a parameter called "weight".
std::shared_ptr<nn::Sequential> three_layers() {
  auto mlp = std::make_shared<nn::Sequential>();
  for (const char* name : {"fc_1", "fc_2", "fc_3"})
    mlp->push_back(name, std::make_shared<nn::Linear>(
                             nn::LinearOptions{.in_features = 2, .out_features = 2, .dtype = ag::Dtype::Float64}));
  return mlp;
}

std::size_t count(const std::string& text, const std::string& part) {
  std::size_t n = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

}  // namespace

BOOST_AUTO_TEST_CASE(to_dot_labels_parameters_with_their_dotted_names) {
  auto mlp = three_layers();
  nn::Sequential model;
  model.push_back("mlp", mlp);
  const Tensor y = ag::sum(model.forward(ag::ones({1, 2}, ag::Dtype::Float64)));
  const std::string dot = ag::to_dot(y);
  for (const char* name : {"mlp.fc_1.weight", "mlp.fc_2.weight", "mlp.fc_3.weight", "mlp.fc_1.bias"})
    BOOST_TEST(dot.find(fmt::format("label=\"{}\\n[2", name)) != std::string::npos, name << " in\n" << dot);
  BOOST_TEST(count(dot, "label=\"weight\\n") == 0u, dot);  // no leaf is a bare "weight"
}

BOOST_AUTO_TEST_CASE(to_dot_marks_the_nodes_that_made_the_given_tensors) {
  Tensor x = ag::tensor({1.0, -2.0}, {2}, ag::Dtype::Float64).requires_grad_();
  x.set_name("x");
  const Tensor h = ag::tanh(x);
  const Tensor e = ag::exp(h);
  const Tensor y = ag::sum(e * h);
  const Tensor elsewhere = ag::exp(x);  // not in y's graph
  ag::DotOptions options;
  options.marked = {{"block.hidden", h}, {"block.pattern", e}, {"the input", x}, {"other", elsewhere}};
  const std::string dot = ag::to_dot(y, options);
  BOOST_TEST(dot.find("label=\"tanh\\n[2]\\nblock.hidden\"") != std::string::npos, dot);
  BOOST_TEST(dot.find("label=\"exp\\n[2]\\nblock.pattern\"") != std::string::npos, dot);
  BOOST_TEST(dot.find("fillcolor=gold, penwidth=2, label=\"x\\n[2]\\nthe input\"") != std::string::npos, dot);
  BOOST_TEST(count(dot, "fillcolor=gold") == 3u, dot);  // tanh, exp and the leaf; not mul or sum
  BOOST_TEST(dot.find("not_in_graph [shape=note, label=\"marked, not in this graph:\\nother [2]\"]") !=
                 std::string::npos,
             dot);
  // Without marks the text is what to_dot(t) gives.
  BOOST_TEST(ag::to_dot(y, {}) == ag::to_dot(y));
  BOOST_TEST(count(ag::to_dot(y), "gold") == 0u);
}

BOOST_AUTO_TEST_CASE(to_dot_marks_one_output_of_a_node_with_several) {
  Tensor x = ag::tensor({1.0, 2.0, 3.0, 4.0}, {4}, ag::Dtype::Float64).requires_grad_();
  const TensorList parts = ag::split(x, 2, 0);
  const Tensor y = ag::sum(parts[0] * parts[1]);
  ag::DotOptions options;
  options.marked = {{"second half", parts[1]}};
  const std::string dot = ag::to_dot(y, options);
  BOOST_TEST(dot.find("\\nsecond half (output 1)\"") != std::string::npos, dot);
}
