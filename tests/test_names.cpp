// Names with any bytes in them (a NUL, a quote, a backslash, a line break) reach messages, printed
// tensors and Graphviz output whole: printable() spells out the bytes that would not print as
// themselves, so no name is cut at a NUL and no DOT label is broken by a quote.
#define BOOST_TEST_MODULE names
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <string>
#include <string_view>

#include <autograd/autograd.hpp>

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
