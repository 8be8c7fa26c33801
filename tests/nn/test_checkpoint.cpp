// Checkpoints: the safetensors format as Python writes it, round trips, atomic saving, and every
// kind of bad file rejected with a clear message and no parameter changed.
#define BOOST_TEST_MODULE checkpoint
#include <boost/test/unit_test.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <nn/nn.hpp>

#include "checkpoint_support.hpp"

namespace ag = autograd;
namespace fs = std::filesystem;
using namespace checkpoint_support;

namespace {

const std::string kData = HEADGRAD_TEST_DATA_DIR;

}  // namespace

// ---- the format, against Python's safetensors ----

BOOST_AUTO_TEST_CASE(reads_a_file_written_by_python_safetensors) {
  const auto file = nn::load_safetensors(kData + "/python_written.safetensors");
  BOOST_CHECK_EQUAL(file.metadata.at("format"), "pt");
  BOOST_REQUIRE_EQUAL(file.tensors.size(), 4u);
  std::map<std::string, ag::Tensor> t(file.tensors.begin(), file.tensors.end());
  BOOST_REQUIRE(t.count("layer.weight") && t.count("layer.bias") && t.count("scale") && t.count("empty"));
  BOOST_CHECK(t["layer.weight"].dtype() == F32);
  BOOST_CHECK(t["layer.weight"].shape() == (ag::Shape{2, 3}));
  const auto w = t["layer.weight"].to_vector();
  for (int i = 0; i < 6; ++i) BOOST_CHECK_EQUAL(w[static_cast<std::size_t>(i)], (i - 2.5) / 4);
  BOOST_CHECK(t["layer.bias"].dtype() == F64);
  const auto b = t["layer.bias"].to_vector();
  for (int i = 0; i < 3; ++i) BOOST_CHECK_EQUAL(b[static_cast<std::size_t>(i)], 1.0 / (i + 1));  // every bit
  BOOST_CHECK(t["scale"].shape().empty());
  BOOST_CHECK_EQUAL(t["scale"].item(), 3.5);
  BOOST_CHECK(t["empty"].shape() == (ag::Shape{0, 4}));
}

BOOST_AUTO_TEST_CASE(writes_the_same_bytes_as_python_safetensors) {
  // The same tensors and metadata as tests/data/make_safetensors.py, in a different order.
  std::vector<double> w;
  for (int i = 0; i < 6; ++i) w.push_back((i - 2.5) / 4);
  const nn::NamedTensors tensors = {
      {"scale", ag::scalar_tensor(3.5, F32)},
      {"layer.weight", ag::tensor(w, {2, 3}, F32)},
      {"empty", ag::zeros({0, 4}, F32)},
      {"layer.bias", ag::tensor({1.0, 1.0 / 2, 1.0 / 3}, {3}, F64)},
  };
  const std::string ours = nn::serialize_safetensors(tensors, {{"format", "pt"}});
  const std::string python = read_bytes(kData + "/python_written.safetensors");
  BOOST_CHECK_EQUAL(ours.size(), python.size());
  BOOST_CHECK_MESSAGE(ours == python, "header we wrote: " << ours.substr(8, 300));
}

BOOST_AUTO_TEST_CASE(refuses_a_python_float16_file_by_name) {
  try {
    nn::load_safetensors(kData + "/python_f16.safetensors");
    BOOST_ERROR("a float16 tensor was accepted");
  } catch (const nn::CheckpointError& e) {
    BOOST_CHECK_MESSAGE(std::string(e.what()).find("tensor 'half' has dtype F16; headgrad reads F32 and F64 only") !=
                            std::string::npos,
                        e.what());
  }
}

BOOST_AUTO_TEST_CASE(header_is_padded_to_eight_bytes_and_escapes_names) {
  const std::string bytes = nn::serialize_safetensors({{"a\"b\\c\nd", ag::zeros({1})}}, {{"k", "v\t"}});
  std::uint64_t n = 0;
  for (int b = 7; b >= 0; --b) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(b)]);
  BOOST_CHECK_EQUAL(n % 8, 0u);
  BOOST_CHECK(bytes.substr(8, n).find(R"("a\"b\\c\nd")") != std::string::npos);
  const auto back = nn::parse_safetensors(bytes);
  BOOST_CHECK_EQUAL(back.tensors.at(0).first, "a\"b\\c\nd");
  BOOST_CHECK_EQUAL(back.metadata.at("k"), "v\t");
}

// ---- round trips ----

BOOST_AUTO_TEST_CASE(parameters_round_trip_bit_for_bit) {
  TempDir dir;
  Tiny a(1), b(2);
  {
    // values that a text format would lose
    ag::NoGradGuard g;
    a.scale.copy_(ag::tensor({-0.0, std::numeric_limits<double>::denorm_min()}, {2}, F64));
  }
  nn::save_parameters(a, dir.file("m.safetensors"), {{"note", "hello"}});
  BOOST_CHECK(!same_bits(snapshot(a), snapshot(b)));
  const auto meta = nn::load_parameters(b, dir.file("m.safetensors"));
  BOOST_CHECK(same_bits(snapshot(a), snapshot(b)));
  BOOST_CHECK_EQUAL(meta.at("note"), "hello");
  BOOST_CHECK(std::signbit(b.scale.to_vector()[0]));
  BOOST_CHECK_EQUAL(dir.entries(), 1u);  // no temporary file left behind
}

BOOST_AUTO_TEST_CASE(loading_keeps_the_parameter_handles) {
  TempDir dir;
  Tiny a(1), b(2);
  const ag::Tensor handle = b.fc->weight();
  nn::save_parameters(a, dir.file("m.safetensors"));
  nn::load_parameters(b, dir.file("m.safetensors"));
  BOOST_CHECK(handle.is_same(b.fc->weight()));
  BOOST_CHECK(handle.to_vector() == a.fc->weight().to_vector());
}

BOOST_AUTO_TEST_CASE(non_strict_loading_skips_missing_and_extra_names) {
  TempDir dir;
  Tiny a(1), b(2);
  nn::save_safetensors(dir.file("part.safetensors"),
                       {{"scale", a.scale.detach()}, {"unrelated", ag::zeros({3})}});
  const auto fc_before = b.fc->weight().to_vector();
  BOOST_CHECK_THROW(nn::load_parameters(b, dir.file("part.safetensors")), nn::CheckpointError);
  nn::load_parameters(b, dir.file("part.safetensors"), {.strict = false});
  BOOST_CHECK(b.scale.to_vector() == a.scale.to_vector());
  BOOST_CHECK(b.fc->weight().to_vector() == fc_before);
}

BOOST_AUTO_TEST_CASE(dtype_conversion_happens_only_when_asked) {
  TempDir dir;
  Tiny a(1), b(2);
  a.to(F64);
  nn::save_parameters(a, dir.file("f64.safetensors"));
  BOOST_CHECK_THROW(nn::load_parameters(b, dir.file("f64.safetensors")), nn::CheckpointError);
  nn::load_parameters(b, dir.file("f64.safetensors"), {.convert_dtype = true});
  BOOST_CHECK(b.fc->weight().dtype() == F32);
  const auto got = b.fc->weight().to_vector(), want = a.fc->weight().to_vector();
  for (std::size_t i = 0; i < got.size(); ++i) BOOST_CHECK_EQUAL(got[i], static_cast<double>(static_cast<float>(want[i])));
}

BOOST_AUTO_TEST_CASE(checkpoint_restores_parameters_and_optimizer_state) {
  TempDir dir;
  Tiny a(1), b(2);
  nn::AdamW opt_a(a.parameters(), {.lr = 0.05});
  for (int i = 0; i < 3; ++i) {
    for (auto& p : a.parameters()) p.set_grad(ag::full(p.shape(), 0.1 * (i + 1), p.dtype()));
    opt_a.step();
  }
  nn::save_checkpoint(dir.file("ckpt.safetensors"), a, opt_a, {{"step", "3"}});
  nn::AdamW opt_b(b.parameters(), {.lr = 0.05});
  const auto meta = nn::load_checkpoint(dir.file("ckpt.safetensors"), b, opt_b);
  BOOST_CHECK_EQUAL(meta.at("step"), "3");
  BOOST_CHECK_EQUAL(meta.at("optimizer"), "AdamW");
  BOOST_CHECK(same_bits(snapshot(a), snapshot(b)));
  BOOST_CHECK_EQUAL(opt_b.step_count(), 3);
  for (auto* m : {&a, &b})
    for (auto& p : m->parameters()) p.set_grad(ag::full(p.shape(), -0.2, p.dtype()));
  opt_a.step();
  opt_b.step();
  BOOST_CHECK(same_bits(snapshot(a), snapshot(b)));
  // Python sees plain tensors: model.fc.weight, optimizer.state.0.exp_avg, ...
  const auto file = nn::load_safetensors(dir.file("ckpt.safetensors"));
  bool found = false;
  for (const auto& [name, t] : file.tensors) found |= name == "optimizer.state.0.exp_avg";
  BOOST_CHECK(found);
}

BOOST_AUTO_TEST_CASE(checkpoint_for_another_optimizer_is_refused_without_changes) {
  TempDir dir;
  Tiny a(1), b(2);
  nn::Adam opt_a(a.parameters());
  nn::save_checkpoint(dir.file("ckpt.safetensors"), a, opt_a);
  nn::SGD opt_b(b.parameters(), {.lr = 0.1, .momentum = 0.9});
  const auto before = snapshot(b);
  try {
    nn::load_checkpoint(dir.file("ckpt.safetensors"), b, opt_b);
    BOOST_ERROR("loaded Adam state into SGD");
  } catch (const nn::CheckpointError& e) {
    BOOST_CHECK_MESSAGE(std::string(e.what()).find("holds Adam state but the optimizer is SGD") != std::string::npos,
                        e.what());
  }
  BOOST_CHECK(same_bits(snapshot(b), before));
  // a plain parameter file is not a checkpoint
  nn::save_parameters(a, dir.file("plain.safetensors"));
  BOOST_CHECK_THROW(nn::load_checkpoint(dir.file("plain.safetensors"), b, opt_b), nn::CheckpointError);
}

BOOST_AUTO_TEST_CASE(bad_optimizer_state_in_a_checkpoint_changes_no_parameter) {
  TempDir dir;
  Tiny a(1), b(2);
  nn::Adam opt_a(a.parameters());
  for (auto& p : a.parameters()) p.set_grad(ag::ones_like(p));
  opt_a.step();
  nn::save_checkpoint(dir.file("ckpt.safetensors"), a, opt_a);
  // Rewrite the file with one optimizer tensor mis-shaped (the model part is valid).
  auto file = nn::load_safetensors(dir.file("ckpt.safetensors"));
  for (auto& [name, t] : file.tensors)
    if (name == "optimizer.state.0.exp_avg") t = ag::zeros({7}, t.dtype());
  nn::save_safetensors(dir.file("bad.safetensors"), file.tensors, file.metadata);
  nn::Adam opt_b(b.parameters());
  const auto before = snapshot(b);
  try {
    nn::load_checkpoint(dir.file("bad.safetensors"), b, opt_b);
    BOOST_ERROR("a mis-shaped optimizer state was accepted");
  } catch (const nn::CheckpointError& e) {
    BOOST_CHECK_MESSAGE(std::string(e.what()).find("'state.0.exp_avg' has shape [7]") != std::string::npos, e.what());
  }
  BOOST_CHECK(same_bits(snapshot(b), before));
  BOOST_CHECK_EQUAL(opt_b.step_count(), 0);
}

// ---- atomic saving ----

BOOST_AUTO_TEST_CASE(a_failed_save_leaves_the_previous_file_intact) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  nn::save_safetensors(path, {{"x", ag::ones({4})}});
  const std::string old_bytes = read_bytes(path);
  // ~1 MB of data: several chunks; the write fails after the first.
  nn::detail::set_save_hook([](std::size_t written) {
    if (written > 0) throw std::runtime_error("disk full (simulated)");
  });
  BOOST_CHECK_THROW(nn::save_safetensors(path, {{"x", ag::zeros({1 << 18})}}), std::runtime_error);
  nn::detail::set_save_hook({});
  BOOST_CHECK(read_bytes(path) == old_bytes);
  BOOST_CHECK_EQUAL(dir.entries(), 1u);  // the temporary file was removed
}

BOOST_AUTO_TEST_CASE(a_crash_mid_save_leaves_the_previous_file_intact) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  Tiny a(1);
  nn::save_parameters(a, path);
  const std::string old_bytes = read_bytes(path);
  const pid_t child = ::fork();
  BOOST_REQUIRE(child >= 0);
  if (child == 0) {
    // The child dies (no clean-up, no destructors) half-way through writing a new version.
    nn::detail::set_save_hook([](std::size_t written) {
      if (written > 0) ::_exit(7);
    });
    nn::save_safetensors(path, {{"x", ag::zeros({1 << 18})}});
    ::_exit(0);  // not reached
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  BOOST_REQUIRE(WIFEXITED(status));
  BOOST_CHECK_EQUAL(WEXITSTATUS(status), 7);
  BOOST_CHECK(read_bytes(path) == old_bytes);
  Tiny b(2);
  nn::load_parameters(b, path);
  BOOST_CHECK(same_bits(snapshot(a), snapshot(b)));
}

BOOST_AUTO_TEST_CASE(save_to_a_missing_directory_throws) {
  Tiny a(1);
  BOOST_CHECK_THROW(nn::save_parameters(a, "/nonexistent-dir-headgrad/m.safetensors"), nn::CheckpointError);
}

// ---- bad files: each is refused with a message, and nothing changes ----

BOOST_AUTO_TEST_CASE(refuses_missing_extra_and_misshaped_tensors) {
  const GoodFile g = good_file();
  Tiny t(5);
  const auto w = t.fc->weight().detach(), b = t.fc->bias().detach(), s = t.scale.detach();
  expect_rejected(nn::serialize_safetensors({{"fc.weight", w}, {"fc.bias", b}}), "missing tensors 'scale'");
  expect_rejected(nn::serialize_safetensors({{"fc.weight", w}, {"fc.bias", b}, {"scale", s}, {"fc.extra", b}}),
                  "unexpected tensors 'fc.extra'");
  expect_rejected(nn::serialize_safetensors({{"fc.weight", ag::zeros({3, 2})}, {"fc.bias", b}, {"scale", s}}),
                  "'fc.weight' has shape [3, 2] in the file but the parameter is [2, 3]");
  expect_rejected(nn::serialize_safetensors({{"fc.weight", w}, {"fc.bias", b}, {"scale", s.to(F32)}}),
                  "'scale' is F32 in the file but the parameter is F64");
  // the valid tensors before the bad one are not copied either (expect_rejected checks all)
  expect_rejected(nn::serialize_safetensors({{"fc.weight", w}, {"fc.bias", ag::zeros({4})}, {"scale", s}}),
                  "no parameter was changed");
  (void)g;
}

BOOST_AUTO_TEST_CASE(refuses_truncated_files) {
  const GoodFile g = good_file();
  const std::string whole = make_file(g.header, g.data);
  expect_rejected("", "file is 0 bytes, too short");
  expect_rejected(whole.substr(0, 5), "file is 5 bytes, too short for the 8-byte header length");
  expect_rejected(whole.substr(0, 8 + g.header.size() / 2), "is more than the");
  expect_rejected(whole.substr(0, whole.size() - 1), "the file is truncated");
  expect_rejected(whole.substr(0, 8 + g.header.size()), "the file is truncated");
}

BOOST_AUTO_TEST_CASE(refuses_corrupt_headers) {
  const GoodFile g = good_file();
  const std::string& h = g.header;
  const std::string& d = g.data;
  expect_rejected(make_file("[1, 2]", d), "does not start with '{'");
  expect_rejected(make_file(replace(h, "}}", "},}"), d), "corrupt header");
  expect_rejected(make_file(replace(h, "\"dtype\"", "\"dtype"), d), "corrupt header");
  expect_rejected(make_file(h + "xyz", d), "unexpected characters after the header object");
  expect_rejected(make_file(replace(h, "\"F32\"", "\"F33\""), d), "unknown dtype \"F33\"");
  expect_rejected(make_file(replace(h, "\"F64\"", "\"I32\""), d), "has dtype I32; headgrad reads F32 and F64 only");
  expect_rejected(make_file(replace(h, "\"shape\":[2]", "\"shape\":[-2]"), d), "not a non-negative integer");
  expect_rejected(make_file(replace(h, "\"shape\":[2]", "\"shape\":[2.0]"), d), "not a non-negative integer");
  expect_rejected(make_file(replace(h, "\"shape\":[2]", "\"shape\":[3]"), d), "needs 24 bytes but data_offsets");
  expect_rejected(make_file(replace(h, "\"data_offsets\"", "\"offsets\""), d), "unknown field \"offsets\"");
  expect_rejected(make_file(replace(h, "{", "{\"__metadata__\":{\"a\":1},"), d), "metadata \"a\" is a number, not a string");
  expect_rejected(make_file(replace(h, "{", "{\"scale\":{},"), d), "key \"scale\" appears twice");
  expect_rejected(make_file(replace(h, "\"shape\":[2]", "\"shape\":[99999999999,99999999999,99999999999]"), d),
                  "too large");
  std::string deep(100, '[');
  expect_rejected(make_file("{\"x\":" + deep, d), "deeper than 64");
  expect_rejected(make_file(replace(h, "\"fc.bias\"", "\"fc.\xff\""), d), "not valid UTF-8");
}

BOOST_AUTO_TEST_CASE(refuses_offsets_that_do_not_tile_the_data) {
  // Hand-written headers over 8 bytes of data: two float32 scalars would be [0,4] and [4,8].
  const std::string data = f32_bytes({1.0f, 2.0f});
  auto header = [](const std::string& a, const std::string& b) {
    return "{\"p\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":" + a + "},\"q\":{\"dtype\":\"F32\",\"shape\":[],"
           "\"data_offsets\":" + b + "}}";
  };
  // valid as a file (parse succeeds), then the broken variants
  BOOST_CHECK_NO_THROW(nn::parse_safetensors(make_file(header("[0,4]", "[4,8]"), data)));
  expect_rejected(make_file(header("[0,4]", "[0,4]"), data), "overlaps the tensor before it");
  expect_rejected(make_file(header("[0,4]", "[8,12]"), data + data), "belong to no tensor");
  expect_rejected(make_file(header("[0,4]", "[4,8]"), data + "junk"), "4 bytes of data after the last tensor");
  expect_rejected(make_file(header("[4,0]", "[4,8]"), data), "end before they begin");
  expect_rejected(make_file(header("[0,4]", "[4]"), data), "data_offsets must be [begin, end]");
  expect_rejected(make_file(header("[0,4]", "[4,18446744073709551616]"), data), "does not fit in 64 bits");
}

BOOST_AUTO_TEST_CASE(refuses_a_header_length_beyond_the_file) {
  std::string bytes(8, '\0');
  bytes[7] = '\x7f';  // an enormous length
  bytes += "{}";
  expect_rejected(bytes, "the file is truncated or corrupt");
}

BOOST_AUTO_TEST_CASE(a_missing_file_is_reported_by_name) {
  Tiny t(1);
  try {
    nn::load_parameters(t, "/nonexistent-dir-headgrad/none.safetensors");
    BOOST_ERROR("no error");
  } catch (const nn::CheckpointError& e) {
    BOOST_CHECK(std::string(e.what()).find("/nonexistent-dir-headgrad/none.safetensors: cannot open") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(writer_refuses_bad_names) {
  BOOST_CHECK_THROW(nn::serialize_safetensors({{"a", ag::ones({1})}, {"a", ag::ones({1})}}), nn::CheckpointError);
  BOOST_CHECK_THROW(nn::serialize_safetensors({{"__metadata__", ag::ones({1})}}), nn::CheckpointError);
  BOOST_CHECK_THROW(nn::serialize_safetensors({{"a", ag::Tensor()}}), nn::CheckpointError);
}

BOOST_AUTO_TEST_CASE(any_single_byte_corruption_is_parsed_or_refused_cleanly) {
  // Every byte of a small file replaced by several values, and every truncation: the parser
  // either accepts the result or throws CheckpointError — never another exception, never a crash.
  const GoodFile g = good_file();
  const std::string whole = make_file(g.header, g.data);
  int refused = 0, accepted = 0;
  auto attempt = [&](const std::string& bytes) {
    try {
      nn::parse_safetensors(bytes);
      ++accepted;
    } catch (const nn::CheckpointError&) {
      ++refused;
    } catch (const std::exception& e) {
      BOOST_ERROR("unexpected exception type: " << e.what());
    }
  };
  for (std::size_t i = 0; i < whole.size(); ++i) {
    for (const char c : {'\0', ' ', '{', '}', '"', ',', '9', '-', 'e', '\\', '\xff', '\x7f'}) {
      std::string bytes = whole;
      bytes[i] = c;
      attempt(bytes);
    }
    attempt(whole.substr(0, i));
  }
  BOOST_TEST_MESSAGE(refused << " refused, " << accepted << " accepted");
  BOOST_CHECK_GT(refused, 0);
  BOOST_CHECK_GT(accepted, 0);  // e.g. changed data bytes are still a valid file
}
