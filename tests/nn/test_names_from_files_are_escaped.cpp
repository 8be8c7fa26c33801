// A name read from a file is any string JSON can hold: a NUL byte, a terminal escape sequence
// (ESC [ ...). Every message that shows such a name shows it escaped (\x00, \x1b), so that no
// message is cut at a NUL and none sends control bytes to the terminal that prints it.
#define BOOST_TEST_MODULE names_from_files_are_escaped
#include <boost/test/unit_test.hpp>

#include <functional>
#include <string>

#include <nn/nn.hpp>

#include "checkpoint_support.hpp"

namespace ag = autograd;
using namespace checkpoint_support;
using namespace std::string_literals;

namespace {

const std::string kNul = "x\0y"s;            // cut at the NUL, a message would end in 'x
const std::string kNulShown = "'x\\x00y'";
const std::string kEsc = "\x1b[2Jz";          // clears the terminal that prints it raw
const std::string kEscShown = "\\x1b[2Jz";

// f throws CheckpointError naming the file, showing every fragment, with no control byte in it.
void expect_escaped(const std::function<void()>& f, const std::string& path,
                    std::initializer_list<std::string> fragments) {
  try {
    f();
    BOOST_ERROR("no error");
  } catch (const nn::CheckpointError& e) {
    const std::string what = e.what();
    BOOST_TEST_MESSAGE(ag::printable(what));
    for (const auto& f : fragments)
      BOOST_TEST(what.find(f) != std::string::npos, "no " << f << " in: " << ag::printable(what));
    BOOST_TEST(what.find(path) != std::string::npos, "the file is not named: " << ag::printable(what));
    for (const char c : what)
      BOOST_TEST((static_cast<unsigned char>(c) >= 0x20 && c != 0x7f), "a raw control byte in: " << ag::printable(what));
  }
}

// Tiny's parameters plus one more tensor named `extra`, in a file.
std::string tiny_with_extra(const TempDir& dir, const std::string& extra, const nn::Metadata& metadata = {}) {
  const std::string path = dir.file("extra.safetensors");
  Tiny source(3);
  nn::NamedTensors tensors = source.named_parameters();
  tensors.emplace_back(extra, ag::zeros({1}, F32));
  nn::save_safetensors(path, tensors, metadata);
  return path;
}

std::string file_with_header(const TempDir& dir, const std::string& header, const std::string& data) {
  const std::string path = dir.file("header.safetensors");
  write_bytes(path, make_file(header, data));
  return path;
}

}  // namespace

BOOST_AUTO_TEST_CASE(load_parameters_shows_an_unexpected_name_with_a_nul_byte_whole) {
  TempDir dir;
  const std::string path = tiny_with_extra(dir, kNul);
  Tiny model(1);
  expect_escaped([&] { nn::load_parameters(model, path); }, path, {"unexpected tensors " + kNulShown});
}

BOOST_AUTO_TEST_CASE(load_parameters_escapes_a_terminal_escape_in_a_name_from_the_file) {
  TempDir dir;
  const std::string path = tiny_with_extra(dir, kEsc);
  Tiny model(1);
  expect_escaped([&] { nn::load_parameters(model, path); }, path, {kEscShown});
}

BOOST_AUTO_TEST_CASE(load_parameters_escapes_a_parameter_name_with_a_control_byte) {
  TempDir dir;
  const std::string path = dir.file("other.safetensors");
  nn::save_safetensors(path, {{"w", ag::zeros({1}, F32)}});
  nn::Module m;
  m.register_parameter("w\x1b[1m", ag::zeros({1}, F32));
  expect_escaped([&] { nn::load_parameters(m, path); }, path, {"missing tensors 'w\\x1b[1m'"});
}

BOOST_AUTO_TEST_CASE(load_checkpoint_shows_a_stray_name_with_a_nul_byte_whole) {
  TempDir dir;
  Tiny model(1);
  nn::SGD sgd(model.parameters(), nn::SGDOptions{.lr = 0.1});
  const std::string path = dir.file("c.safetensors");
  nn::save_checkpoint(path, model, sgd);
  nn::SafetensorsData data = nn::load_safetensors(path);
  data.tensors.emplace_back(kNul, ag::zeros({1}, F32));
  nn::save_safetensors(path, data.tensors, data.metadata);
  expect_escaped([&] { nn::load_checkpoint(path, model, sgd); }, path, {"unexpected tensors " + kNulShown});
}

BOOST_AUTO_TEST_CASE(load_checkpoint_escapes_the_optimizer_name_from_the_file) {
  TempDir dir;
  Tiny model(1);
  nn::SGD sgd(model.parameters(), nn::SGDOptions{.lr = 0.1});
  const std::string path = dir.file("c.safetensors");
  nn::save_checkpoint(path, model, sgd);
  nn::SafetensorsData data = nn::load_safetensors(path);
  data.metadata["optimizer"] = kEsc;
  nn::save_safetensors(path, data.tensors, data.metadata);
  expect_escaped([&] { nn::load_checkpoint(path, model, sgd); }, path, {kEscShown, "SGD"});
}

BOOST_AUTO_TEST_CASE(load_torch_state_dict_shows_an_unexpected_name_with_a_nul_byte_whole) {
  TempDir dir;
  nn::Linear fc(nn::LinearOptions{2, 3, true, F32});
  const std::string path = dir.file("t.safetensors");
  nn::NamedTensors tensors = nn::torch_state_dict(fc);
  tensors.emplace_back(kNul, ag::zeros({1}, F32));
  nn::save_safetensors(path, tensors);
  expect_escaped([&] { nn::load_torch_state_dict(fc, path); }, path, {"unexpected tensors " + kNulShown});
}

BOOST_AUTO_TEST_CASE(the_header_parser_shows_a_tensor_name_with_a_nul_byte_whole) {
  TempDir dir;
  const std::string path =
      file_with_header(dir, R"({"x\u0000y":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", std::string(4, '\0'));
  Tiny model(1);
  expect_escaped([&] { nn::load_parameters(model, path); }, path, {"tensor " + kNulShown, "needs 8 bytes"});
}

BOOST_AUTO_TEST_CASE(the_header_parser_shows_a_repeated_name_with_a_nul_byte_whole) {
  TempDir dir;
  const std::string entry = R"("x\u0000y":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  const std::string path = file_with_header(dir, "{" + entry + "," + entry + "}", std::string(4, '\0'));
  Tiny model(1);
  expect_escaped([&] { nn::load_parameters(model, path); }, path, {"key \"x\\x00y\" appears twice"});
}

BOOST_AUTO_TEST_CASE(the_header_parser_escapes_an_unknown_dtype) {
  TempDir dir;
  const std::string path =
      file_with_header(dir, R"({"w":{"dtype":"\u001b[2Jz","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'));
  Tiny model(1);
  expect_escaped([&] { nn::load_parameters(model, path); }, path, {"unknown dtype \"" + kEscShown + "\""});
}

BOOST_AUTO_TEST_CASE(the_header_parser_escapes_a_metadata_key) {
  TempDir dir;
  const std::string path = file_with_header(dir, R"({"__metadata__":{"\u001b[2Jz":1}})", "");
  Tiny model(1);
  expect_escaped([&] { nn::load_parameters(model, path); }, path, {"metadata", kEscShown, "not a string"});
}

BOOST_AUTO_TEST_CASE(the_header_parser_escapes_an_unknown_field) {
  TempDir dir;
  const std::string path = file_with_header(
      dir, R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"\u001b[2Jz":0}})", std::string(4, '\0'));
  Tiny model(1);
  expect_escaped([&] { nn::load_parameters(model, path); }, path, {"unknown field", kEscShown});
}

BOOST_AUTO_TEST_CASE(the_layout_check_shows_a_name_with_a_nul_byte_whole) {
  TempDir dir;
  const std::string path = file_with_header(
      dir, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"x\u0000y":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
      std::string(4, '\0'));
  Tiny model(1);
  expect_escaped([&] { nn::load_parameters(model, path); }, path, {"tensor " + kNulShown, "overlaps"});
}

BOOST_AUTO_TEST_CASE(load_module_escapes_a_type_name_from_the_config) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  nn::save_safetensors(path, {{"weight", ag::zeros({1}, F32)}},
                       {{"headgrad.config", R"({"type":"\u001b[2Jz"})"}, {"headgrad.naming", "headgrad"}});
  expect_escaped([&] { nn::load_module(path); }, path, {"type '" + kEscShown + "'"});
}

BOOST_AUTO_TEST_CASE(read_module_config_escapes_a_child_name_and_a_dtype_from_the_config) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  nn::save_safetensors(path, {{"weight", ag::zeros({1}, F32)}},
                       {{"headgrad.config", R"({"type":"Sequential","children":{"\u001b[2Jz":{}}})"}});
  expect_escaped([&] { nn::read_module_config(path); }, path, {"module '" + kEscShown + "'", "no \"type\""});
  nn::save_safetensors(path, {{"weight", ag::zeros({1}, F32)}},
                       {{"headgrad.config", R"({"type":"Linear","dtype":"\u001b[2Jz"})"}});
  expect_escaped([&] { nn::read_module_config(path); }, path, {kEscShown, "float32 or float64"});
}
