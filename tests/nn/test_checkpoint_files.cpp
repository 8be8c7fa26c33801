// Checkpoints against hostile paths and impossible contents: paths that are not regular files
// (directories, devices, FIFOs, symbolic links), long file names, shapes whose sizes overflow,
// optimizer state no run can produce, and loads that fail at any point and change nothing.
#define BOOST_TEST_MODULE checkpoint_files
#include <boost/test/unit_test.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <nn/nn.hpp>

#include "checkpoint_support.hpp"

namespace ag = autograd;
namespace fs = std::filesystem;
using namespace checkpoint_support;

namespace {

// The CheckpointError message of a call ("no error" or the other exception's text otherwise).
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const nn::CheckpointError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not a CheckpointError: ") + e.what();
  }
  return "no error";
}

void check_message(const std::string& message, const std::vector<std::string>& fragments) {
  for (const auto& f : fragments)
    BOOST_CHECK_MESSAGE(message.find(f) != std::string::npos, "message: " << message << "\nexpected: " << f);
}

// Runs `fn` in a child process, so that a call that hangs or reads without end fails the test
// instead of stopping the suite: the child gets `seconds` and 1 GiB more address space than
// it has. Returns error_of(fn) as the child saw it, or "hung" / "died".
std::string error_in_child(const std::function<void()>& fn, int seconds) {
  int fds[2];
  BOOST_REQUIRE(::pipe(fds) == 0);
  const pid_t child = ::fork();
  BOOST_REQUIRE(child >= 0);
  if (child == 0) {
    ::close(fds[0]);
    long pages = 0;
    if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
      std::fclose(f);
    }
    const rlim_t limit = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) + (rlim_t{1} << 30);
    const rlimit lim{limit, limit};
    if (pages > 0) ::setrlimit(RLIMIT_AS, &lim);
    const std::string message = error_of(fn);
    if (::write(fds[1], message.data(), message.size()) < 0) ::_exit(2);
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string message;
  pollfd p{fds[0], POLLIN, 0};
  bool hung = false;
  while (true) {
    if (::poll(&p, 1, seconds * 1000) <= 0) {
      hung = true;
      break;
    }
    char buf[512];
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    message.append(buf, static_cast<std::size_t>(n));
  }
  if (hung) ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ::close(fds[0]);
  if (hung) return "hung";
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return "died";
  return message;
}

// Everything an optimizer restores, bit for bit, and its step count.
struct OptimizerState {
  std::vector<std::vector<double>> tensors;
  std::int64_t steps;
};

OptimizerState optimizer_state(const nn::Optimizer& opt) {
  OptimizerState s{{}, opt.step_count()};
  for (const auto& [name, t] : opt.state_dict()) s.tensors.push_back(t.to_vector());
  return s;
}

bool same_state(const OptimizerState& a, const OptimizerState& b) { return a.steps == b.steps && same_bits(a.tensors, b.tensors); }

// Gives every parameter the gradient `value` and steps.
void step_with(nn::Module& m, nn::Optimizer& opt, double value) {
  for (auto& p : m.parameters()) p.set_grad(ag::full(p.shape(), value, p.dtype()));
  opt.step();
}

// The tensors of a valid checkpoint of a Tiny after two Adam steps.
nn::SafetensorsData adam_checkpoint(const TempDir& dir, bool amsgrad = false) {
  Tiny a(1);
  nn::Adam opt(a.parameters(), {.lr = 0.01, .amsgrad = amsgrad});
  step_with(a, opt, 0.5);
  step_with(a, opt, -0.25);
  nn::save_checkpoint(dir.file("good.safetensors"), a, opt);
  return nn::load_safetensors(dir.file("good.safetensors"));
}

// The checkpoint with one element of one tensor replaced; returns the new file's path.
std::string with_value(const TempDir& dir, nn::SafetensorsData file, const std::string& name, double value) {
  bool found = false;
  for (auto& [n, t] : file.tensors) {
    if (n != name) continue;
    std::vector<double> v = t.to_vector();
    v.at(v.size() / 2) = value;
    t = ag::tensor(v, t.shape(), t.dtype());
    found = true;
  }
  BOOST_REQUIRE_MESSAGE(found, name << " not in the checkpoint");
  const std::string path = dir.file(fmt::format("edited_{}.safetensors", dir.entries()));
  nn::save_safetensors(path, file.tensors, file.metadata);
  return path;
}

const std::string kShape62 = "4611686018427387904";  // 2^62

}  // namespace

// ---- paths that are not regular files ----

BOOST_AUTO_TEST_CASE(loading_a_directory_is_refused_naming_it) {
  TempDir dir;
  Tiny t(1);
  const auto before = snapshot(t);
  check_message(error_of([&] { nn::load_parameters(t, dir.path.string()); }),
                {dir.path.string() + ": is a directory, not a regular file"});
  BOOST_CHECK(same_bits(snapshot(t), before));
}

BOOST_AUTO_TEST_CASE(loading_dev_zero_is_refused_before_reading_it) {
  Tiny t(1);
  const std::string message = error_in_child([&] { nn::load_parameters(t, "/dev/zero"); }, 3);
  check_message(message, {"/dev/zero: is a character device, not a regular file"});
}

BOOST_AUTO_TEST_CASE(loading_a_fifo_is_refused_without_waiting_for_a_writer) {
  TempDir dir;
  const std::string path = dir.file("pipe.safetensors");
  BOOST_REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
  Tiny t(1);
  check_message(error_in_child([&] { nn::load_parameters(t, path); }, 3), {path + ": is a FIFO, not a regular file"});
  nn::Adam opt(t.parameters());
  check_message(error_in_child([&] { nn::load_checkpoint(path, t, opt); }, 3), {path + ": is a FIFO"});
}

BOOST_AUTO_TEST_CASE(saving_over_a_fifo_or_a_directory_is_refused_and_leaves_it) {
  TempDir dir;
  const std::string fifo = dir.file("pipe.safetensors");
  BOOST_REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::string sub = dir.file("sub");
  fs::create_directory(sub);
  Tiny t(1);
  check_message(error_of([&] { nn::save_parameters(t, fifo); }), {fifo + ": is a FIFO, not a regular file"});
  check_message(error_of([&] { nn::save_parameters(t, sub); }), {sub + ": is a directory, not a regular file"});
  BOOST_CHECK(fs::is_fifo(fifo));
  BOOST_CHECK(fs::is_directory(sub));
  BOOST_CHECK_EQUAL(dir.entries(), 2u);  // no temporary file left
}

BOOST_AUTO_TEST_CASE(saving_through_a_symlink_replaces_its_target_and_keeps_the_link) {
  TempDir dir;
  fs::create_directory(dir.path / "links");
  fs::create_directory(dir.path / "data");
  const std::string target = dir.file("data/model.safetensors");
  const std::string link = dir.file("links/model.safetensors");
  Tiny a(1), b(2), c(3);
  nn::save_parameters(a, target);
  ::chmod(target.c_str(), 0600);
  fs::create_symlink("../data/model.safetensors", link);  // relative to the link's directory
  nn::save_parameters(b, link);
  BOOST_CHECK(fs::is_symlink(link));
  BOOST_CHECK_EQUAL(fs::read_symlink(link).string(), "../data/model.safetensors");
  nn::load_parameters(c, target);
  BOOST_CHECK(same_bits(snapshot(c), snapshot(b)));
  // The target was replaced in its own directory, keeping its permissions; nothing was left behind.
  BOOST_CHECK((fs::status(target).permissions() & fs::perms::all) == (fs::perms::owner_read | fs::perms::owner_write));
  BOOST_CHECK_EQUAL(std::distance(fs::directory_iterator(dir.path / "links"), fs::directory_iterator()), 1);
  BOOST_CHECK_EQUAL(std::distance(fs::directory_iterator(dir.path / "data"), fs::directory_iterator()), 1);
}

BOOST_AUTO_TEST_CASE(saving_through_chains_dangling_links_and_loops_of_links) {
  TempDir dir;
  Tiny a(1), b(2);
  // link2 -> link1 -> real: the file at the end of the chain is replaced.
  nn::save_parameters(a, dir.file("real.safetensors"));
  fs::create_symlink("real.safetensors", dir.file("link1"));
  fs::create_symlink(dir.file("link1"), dir.file("link2"));  // absolute
  nn::save_parameters(b, dir.file("link2"));
  BOOST_CHECK(fs::is_symlink(dir.file("link1")) && fs::is_symlink(dir.file("link2")));
  Tiny check(3);
  nn::load_parameters(check, dir.file("real.safetensors"));
  BOOST_CHECK(same_bits(snapshot(check), snapshot(b)));
  // A dangling link: the file it names is created.
  fs::create_symlink("new.safetensors", dir.file("dangling"));
  nn::save_parameters(a, dir.file("dangling"));
  BOOST_CHECK(fs::is_regular_file(dir.file("new.safetensors")) && fs::is_symlink(dir.file("dangling")));
  // A loop is refused.
  fs::create_symlink("loop_b", dir.file("loop_a"));
  fs::create_symlink("loop_a", dir.file("loop_b"));
  check_message(error_of([&] { nn::save_parameters(a, dir.file("loop_a")); }),
                {dir.file("loop_a") + ": more than 40 symbolic links in a row"});
  BOOST_CHECK(fs::is_symlink(dir.file("loop_a")) && fs::is_symlink(dir.file("loop_b")));
  BOOST_CHECK_EQUAL(dir.entries(), 7u);  // no temporary file left
}

BOOST_AUTO_TEST_CASE(loading_through_a_symlink_reads_its_target) {
  TempDir dir;
  Tiny a(1), b(2);
  nn::save_parameters(a, dir.file("real.safetensors"));
  fs::create_symlink("real.safetensors", dir.file("link"));
  nn::load_parameters(b, dir.file("link"));
  BOOST_CHECK(same_bits(snapshot(a), snapshot(b)));
}

// ---- file names ----

BOOST_AUTO_TEST_CASE(the_longest_file_names_can_be_saved) {
  TempDir dir;
  for (const std::size_t length : {250, 255}) {
    const std::string name = std::string(length - 12, 'n') + ".safetensors";
    BOOST_REQUIRE_EQUAL(name.size(), length);
    Tiny a(1), b(2);
    const std::string message = error_of([&] { nn::save_parameters(a, dir.file(name)); });
    BOOST_CHECK_MESSAGE(message == "no error", "a " << length << "-byte name: " << message);
    if (message != "no error") continue;
    nn::load_parameters(b, dir.file(name));
    BOOST_CHECK(same_bits(snapshot(a), snapshot(b)));
  }
  BOOST_CHECK_EQUAL(dir.entries(), 2u);
}

// ---- sizes that overflow ----

BOOST_AUTO_TEST_CASE(shapes_whose_sizes_overflow_are_refused_naming_the_tensor_and_shape) {
  auto file = [](const std::string& dtype, const std::string& shape) {
    return make_file("{\"big\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[0,0]}}", "");
  };
  // No elements, but the strides of the trailing dims do not fit in 64 bits.
  const std::string zero_first = "[0," + kShape62 + "," + kShape62 + "]";
  check_message(error_of([&] { nn::parse_safetensors(file("F32", zero_first), "f.safetensors"); }),
                {"f.safetensors: corrupt header: tensor 'big'", "shape [0, " + kShape62 + ", " + kShape62 + "] is too large"});
  // Elements that fit, bytes that do not: 2^62 float64s.
  check_message(error_of([&] { nn::parse_safetensors(file("F64", "[" + kShape62 + "]"), "f.safetensors"); }),
                {"tensor 'big'", "shape [" + kShape62 + "] is too large"});
  check_message(error_of([&] { nn::parse_safetensors(file("F32", "[" + kShape62 + ",4,0]"), "f.safetensors"); }),
                {"tensor 'big'", "is too large"});
  check_message(error_of([&] { nn::parse_safetensors(file("F32", "[18446744073709551615]"), "f.safetensors"); }),
                {"tensor 'big'", "shape [18446744073709551615] is too large"});
  // No elements and strides that fit: a valid empty tensor.
  check_message(error_of([&] { nn::parse_safetensors(file("F32", "[0,1000000,1000000]"), "f.safetensors"); }),
                {"no error"});
}

// ---- optimizer state no run can produce ----

BOOST_AUTO_TEST_CASE(impossible_optimizer_values_are_refused_and_change_nothing) {
  TempDir dir;
  const nn::SafetensorsData good = adam_checkpoint(dir);
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  struct Case {
    std::string tensor;
    double value;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {"optimizer.state.0.exp_avg_sq", nan, "'state.0.exp_avg_sq' holds nan at element 1"},
      {"optimizer.state.1.exp_avg_sq", -1.0, "'state.1.exp_avg_sq' holds -1 at element 3, but the exp_avg_sq of "
                                             "parameter 1 must be finite and >= 0"},
      {"optimizer.state.2.exp_avg", inf, "'state.2.exp_avg' holds inf at element 1"},
      {"optimizer.state.0.exp_avg", -inf, "holds -inf"},
      {"optimizer.state.0.step", -1.0, "'state.0.step' must be a non-negative integer, got -1"},
      {"optimizer.state.1.step", nan, "'state.1.step' must be a non-negative integer"},
      {"optimizer.step_count", 2.5, "'step_count' must be a non-negative integer"},
      {"optimizer.param_groups.0.lr", nan, "'param_groups.0.lr' must be finite"},
  };
  for (const auto& c : cases) {
    const std::string path = with_value(dir, good, c.tensor, c.value);
    Tiny b(2);
    nn::Adam opt(b.parameters(), {.lr = 0.01});
    step_with(b, opt, 1.0);
    const auto params = snapshot(b);
    const auto state = optimizer_state(opt);
    check_message(error_of([&] { nn::load_checkpoint(path, b, opt); }), {"load_checkpoint: " + path, c.fragment});
    BOOST_CHECK_MESSAGE(same_bits(snapshot(b), params), c.tensor << ": a parameter changed");
    BOOST_CHECK_MESSAGE(same_state(optimizer_state(opt), state), c.tensor << ": the optimizer changed");
  }
}

BOOST_AUTO_TEST_CASE(impossible_amsgrad_and_momentum_values_are_refused) {
  TempDir dir;
  const nn::SafetensorsData ams = adam_checkpoint(dir, true);
  const std::string path = with_value(dir, ams, "optimizer.state.0.max_exp_avg_sq", -2.0);
  Tiny b(2);
  nn::Adam adam(b.parameters(), {.amsgrad = true});
  check_message(error_of([&] { nn::load_checkpoint(path, b, adam); }),
                {"'state.0.max_exp_avg_sq'", "holds -2", "must be finite and >= 0"});
  BOOST_CHECK_EQUAL(adam.step_count(), 0);

  Tiny a(1);
  nn::SGD sgd(a.parameters(), {.lr = 0.1, .momentum = 0.9});
  step_with(a, sgd, 1.0);
  nn::save_checkpoint(dir.file("sgd.safetensors"), a, sgd);
  const std::string bad = with_value(dir, nn::load_safetensors(dir.file("sgd.safetensors")),
                                     "optimizer.state.2.momentum_buffer", std::numeric_limits<double>::quiet_NaN());
  nn::SGD sgd_b(b.parameters(), {.lr = 0.1, .momentum = 0.9});
  const auto before = snapshot(b);
  check_message(error_of([&] { nn::load_checkpoint(bad, b, sgd_b); }), {"'state.2.momentum_buffer'", "nan"});
  BOOST_CHECK(same_bits(snapshot(b), before));
  // A negative momentum is possible and loads.
  const std::string fine = with_value(dir, nn::load_safetensors(dir.file("sgd.safetensors")),
                                      "optimizer.state.2.momentum_buffer", -3.0);
  BOOST_CHECK_NO_THROW(nn::load_checkpoint(fine, b, sgd_b));
}

// ---- a failed load changes nothing, wherever it fails ----

BOOST_AUTO_TEST_CASE(a_load_that_fails_anywhere_changes_neither_module_nor_optimizer) {
  TempDir dir;
  Tiny a(1);
  nn::Adam opt_a(a.parameters(), {.lr = 0.01});
  step_with(a, opt_a, 0.5);
  const std::string good = dir.file("good.safetensors");
  nn::save_checkpoint(good, a, opt_a);
  const std::string bytes = read_bytes(good);
  const nn::SafetensorsData file = nn::load_safetensors(good);
  auto write = [&](const std::string& name, const std::string& content) {
    write_bytes(dir.file(name), content);
    return dir.file(name);
  };
  auto rewrite = [&](const std::string& name, const std::function<void(nn::NamedTensors&)>& edit) {
    nn::NamedTensors t = file.tensors;
    edit(t);
    nn::save_safetensors(dir.file(name), t, file.metadata);
    return dir.file(name);
  };
  auto set = [](nn::NamedTensors& ts, const std::string& name, const ag::Tensor& value) {
    for (auto& [n, t] : ts)
      if (n == name) t = value;
  };
  // Each file and what its error names.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {write("truncated.safetensors", bytes.substr(0, bytes.size() - 3)), "truncated"},
      {write("header.safetensors", bytes.substr(0, 20) + "@" + bytes.substr(21)), "corrupt header"},
      {rewrite("model_shape.safetensors", [&](auto& t) { set(t, "model.scale", ag::zeros({3}, F64)); }),
       "'model.scale' has shape [3]"},
      {rewrite("model_missing.safetensors", [&](auto& t) { t.erase(t.begin()); }), "missing tensors"},
      {rewrite("stray.safetensors", [&](auto& t) { t.emplace_back("other", ag::zeros({1})); }), "unexpected tensors 'other'"},
      {rewrite("opt_shape.safetensors", [&](auto& t) { set(t, "optimizer.state.1.exp_avg", ag::zeros({4})); }),
       "'state.1.exp_avg' has shape [4]"},
      {rewrite("opt_nan.safetensors", [&](auto& t) { set(t, "optimizer.state.0.exp_avg_sq", ag::full({2}, NAN, F64)); }),
       "holds nan"},
      {rewrite("opt_neg.safetensors", [&](auto& t) { set(t, "optimizer.state.0.exp_avg_sq", ag::full({2}, -1.0, F64)); }),
       "must be finite and >= 0"},
      {dir.path.string(), "is a directory"},
  };
  Tiny b(2);
  nn::Adam opt_b(b.parameters(), {.lr = 0.01});
  step_with(b, opt_b, -1.0);
  Tiny twin(2);  // b's twin: the same steps, never given a bad file
  nn::Adam opt_twin(twin.parameters(), {.lr = 0.01});
  step_with(twin, opt_twin, -1.0);
  for (const auto& entry : bad) {
    const auto& path = entry.first;  // (named, not bound: clang 14 cannot capture a structured binding)
    const auto& fragment = entry.second;
    check_message(error_of([&] { nn::load_checkpoint(path, b, opt_b); }), {path, fragment});
    BOOST_CHECK_MESSAGE(same_bits(snapshot(b), snapshot(twin)), path << ": a parameter changed");
    BOOST_CHECK_MESSAGE(same_state(optimizer_state(opt_b), optimizer_state(opt_twin)), path << ": the optimizer changed");
    BOOST_CHECK_THROW(nn::load_parameters(b, path), nn::CheckpointError);
  }
  // b goes on exactly like its twin.
  step_with(b, opt_b, 0.3);
  step_with(twin, opt_twin, 0.3);
  BOOST_CHECK(same_bits(snapshot(b), snapshot(twin)));
  // And the good file still loads in full.
  nn::load_checkpoint(good, b, opt_b);
  BOOST_CHECK(same_bits(snapshot(b), snapshot(a)));
  BOOST_CHECK(same_state(optimizer_state(opt_b), optimizer_state(opt_a)));
}
