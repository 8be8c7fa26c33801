// Names end up as JSON strings in saved files (tensor names, metadata, the module config), and
// JSON text is UTF-8: a name that is not is refused when it is registered, and every function that
// writes names refuses one with its own error naming it (escaped), before anything is written.
#define BOOST_TEST_MODULE names_are_utf8
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

#include <nn/nn.hpp>

#include "checkpoint_support.hpp"

namespace ag = autograd;
namespace fs = std::filesystem;
using checkpoint_support::TempDir;
using namespace std::string_literals;

namespace {

constexpr auto F32 = ag::Dtype::Float32;

// A module of a user's type whose type name and extra_repr() are given.
struct Custom : nn::Module {
  std::string repr;
  Custom(std::string type, std::string r) : Module(std::move(type)), repr(std::move(r)) {
    register_module("fc", std::make_shared<nn::Linear>(nn::LinearOptions{2, 2, true, F32}));
  }
  std::string extra_repr() const override { return repr; }
  ag::Tensor forward(const ag::Tensor& x) const { return x; }
};

// f must throw E whose message starts with `op`, shows every fragment and holds only valid UTF-8
// (the name is escaped); and no file was made at `path` (when given).
template <class E, class F>
void expect_refused(F f, const std::string& op, std::initializer_list<std::string> fragments,
                    const std::string& path = "") {
  try {
    f();
    BOOST_ERROR("no error; expected one from " << op);
  } catch (const E& e) {
    const std::string what = e.what();
    BOOST_TEST_MESSAGE(what);
    BOOST_TEST(what.rfind(op + ":", 0) == 0, "message does not start with " << op << ": " << what);
    for (const auto& f : fragments) BOOST_TEST(what.find(f) != std::string::npos, "no " << f << " in: " << what);
    BOOST_TEST(what.find('\xff') == std::string::npos, "a raw 0xff byte in: " << what);
  } catch (const std::exception& e) {
    BOOST_ERROR("wrong exception: " << e.what());
  }
  if (!path.empty()) BOOST_TEST(!fs::exists(path), path << " was written");
}

const std::string kBad = "l\xff";         // 0xff never appears in UTF-8
const std::string kShown = "'l\\xff'";    // how messages show it
const std::string kTruncated = "caf\xc3";  // a multi-byte sequence cut short

}  // namespace

BOOST_AUTO_TEST_CASE(register_module_refuses_a_name_that_is_not_utf8) {
  nn::Module m;
  expect_refused<std::invalid_argument>([&] { m.register_module(kBad, std::make_shared<nn::ReLU>()); },
                                        "register_module", {kShown, "UTF-8"});
  BOOST_TEST(m.named_children().empty());
}

BOOST_AUTO_TEST_CASE(register_parameter_refuses_a_name_that_is_not_utf8) {
  nn::Module m;
  expect_refused<std::invalid_argument>([&] { m.register_parameter(kTruncated, ag::zeros({2}, F32)); },
                                        "register_parameter", {"'caf\\xc3'", "UTF-8"});
  BOOST_TEST(m.named_parameters().empty());
}

BOOST_AUTO_TEST_CASE(registration_accepts_names_in_utf8) {
  nn::Module m;
  m.register_parameter("caf\xc3\xa9", ag::zeros({2}, F32));
  m.register_module("\xe5\xb1\x82", std::make_shared<nn::Linear>(nn::LinearOptions{1, 1, true, F32}));
  BOOST_TEST(m.named_parameters().size() == 3u);
}

BOOST_AUTO_TEST_CASE(save_safetensors_refuses_a_tensor_name_that_is_not_utf8_naming_it) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  expect_refused<nn::CheckpointError>(
      [&] { nn::save_safetensors(path, {{"ok", ag::zeros({1}, F32)}, {kBad, ag::zeros({1}, F32)}}); },
      "save_safetensors", {"tensor name", kShown}, path);
}

BOOST_AUTO_TEST_CASE(save_safetensors_refuses_a_metadata_key_that_is_not_utf8_naming_it) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  expect_refused<nn::CheckpointError>(
      [&] { nn::save_safetensors(path, {{"ok", ag::zeros({1}, F32)}}, {{kBad, "v"}}); }, "save_safetensors",
      {"metadata key", kShown}, path);
}

BOOST_AUTO_TEST_CASE(save_safetensors_refuses_a_metadata_value_that_is_not_utf8_naming_its_key) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  expect_refused<nn::CheckpointError>(
      [&] { nn::save_safetensors(path, {{"ok", ag::zeros({1}, F32)}}, {{"step", kBad}}); }, "save_safetensors",
      {"metadata 'step'", kShown}, path);
}

BOOST_AUTO_TEST_CASE(serialize_safetensors_refuses_a_tensor_name_that_is_not_utf8_naming_it) {
  expect_refused<nn::CheckpointError>([&] { nn::serialize_safetensors({{kBad, ag::zeros({1}, F32)}}); },
                                      "serialize_safetensors", {"tensor name", kShown});
}

BOOST_AUTO_TEST_CASE(save_parameters_refuses_metadata_that_is_not_utf8) {
  TempDir dir;
  const std::string path = dir.file("p.safetensors");
  nn::Linear fc(nn::LinearOptions{2, 2, true, F32});
  expect_refused<nn::CheckpointError>([&] { nn::save_parameters(fc, path, {{"note", kBad}}); }, "save_parameters",
                                      {"metadata 'note'", kShown}, path);
}

BOOST_AUTO_TEST_CASE(save_parameters_refuses_a_module_type_name_that_is_not_utf8) {
  TempDir dir;
  const std::string path = dir.file("p.safetensors");
  Custom m("My" + kBad, "");
  expect_refused<nn::CheckpointError>([&] { nn::save_parameters(m, path); }, "save_parameters",
                                      {"type name 'Myl\\xff'", "the root module"}, path);
}

BOOST_AUTO_TEST_CASE(save_torch_state_dict_refuses_an_extra_repr_that_is_not_utf8) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  nn::Sequential s;
  s.push_back("inner", std::make_shared<Custom>("Custom", "size=" + kBad));
  expect_refused<nn::CheckpointError>([&] { nn::save_torch_state_dict(s, path); }, "save_torch_state_dict",
                                      {"module 'inner'", "extra_repr", "'size=l\\xff'"}, path);
}

BOOST_AUTO_TEST_CASE(save_checkpoint_refuses_metadata_that_is_not_utf8) {
  TempDir dir;
  const std::string path = dir.file("c.safetensors");
  nn::Linear fc(nn::LinearOptions{2, 2, true, F32});
  nn::SGD sgd(fc.parameters(), nn::SGDOptions{.lr = 0.1});
  expect_refused<nn::CheckpointError>([&] { nn::save_checkpoint(path, fc, sgd, {{kBad, "1"}}); }, "save_checkpoint",
                                      {"metadata key", kShown}, path);
}

BOOST_AUTO_TEST_CASE(module_config_json_refuses_a_type_name_that_is_not_utf8) {
  Custom m("My" + kBad, "");
  expect_refused<nn::CheckpointError>([&] { nn::module_config_json(m); }, "module_config_json",
                                      {"type name 'Myl\\xff'"});
}

BOOST_AUTO_TEST_CASE(quote_name_escapes_bytes_that_are_not_utf8_and_keeps_utf8) {
  BOOST_TEST(nn::quote_name(kBad) == kShown);
  BOOST_TEST(nn::quote_name("caf\xc3\xa9") == "'caf\xc3\xa9'");
  BOOST_TEST(nn::quote_name(kTruncated) == "'caf\\xc3'");
  BOOST_TEST(nn::quote_name("\xed\xa0\x80") == "'\\xed\\xa0\\x80'");  // a UTF-16 surrogate is not UTF-8
  BOOST_TEST(nn::quote_name("\xc0\xaf") == "'\\xc0\\xaf'");           // nor an overlong '/'
  BOOST_TEST(nn::quote_name("a\xc2\x9b" "31m") == "'a\\xc2\\x9b31m'");  // C1 control CSI, as in \x1b[
  BOOST_TEST(nn::quote_name("a\0b"s) == "'a\\x00b'");
}
