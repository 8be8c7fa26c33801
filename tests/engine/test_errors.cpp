// Bad input: what each misuse gets. One test per row of docs/bad_input.md; each checks the
// exception type and the part of the message the table quotes.
#define BOOST_TEST_MODULE errors
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

#include "test_support.hpp"

using namespace test_support::prelude;

namespace {

// A scratch directory for checkpoint files, removed at the end.
struct Scratch {
  std::filesystem::path dir;
  Scratch() {
    dir = std::filesystem::temp_directory_path() / ("headgrad_errors_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
  }
  ~Scratch() { std::filesystem::remove_all(dir); }
  std::string path(const std::string& name) const { return (dir / name).string(); }
  std::string write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }
};

}  // namespace

// ---- shapes ----

BOOST_AUTO_TEST_CASE(mismatched_shapes_in_a_binary_op) {
  check_throws<std::invalid_argument>([] { ag::add(ag::zeros({2, 3}), ag::zeros({4})); },
                                      {"add:", "[2, 3]", "[4]"});
}

BOOST_AUTO_TEST_CASE(mismatched_inner_dimensions_in_matmul) {
  check_throws<std::invalid_argument>([] { ag::matmul(ag::zeros({2, 3}), ag::zeros({4, 5})); },
                                      {"matmul:", "[2, 3]", "[4, 5]"});
}

BOOST_AUTO_TEST_CASE(linear_input_that_does_not_end_in_the_weights_in) {
  check_throws<std::invalid_argument>([] { ag::linear(ag::zeros({2, 3}), ag::zeros({2, 2})); },
                                      {"linear:", "[2, 3]", "in = 2", "[2, 2]"});
}

BOOST_AUTO_TEST_CASE(query_of_the_wrong_width_for_multihead_attention) {
  nn::MultiHeadAttention mha(8, 2);
  check_throws<std::invalid_argument>([&] { mha.forward(ag::zeros({2, 3, 6}), ag::zeros({2, 3, 8}), ag::zeros({2, 3, 8})); },
                                      {"[2, 3, 6]", "embed_dim = 8"});
}

BOOST_AUTO_TEST_CASE(dimension_out_of_range) {
  check_throws<std::invalid_argument>([] { ag::sum(ag::zeros({2, 3}), 2); }, {"sum:", "2"});
}

// ---- dtypes ----

BOOST_AUTO_TEST_CASE(mixed_dtypes_in_one_op) {
  check_throws<std::invalid_argument>([] { ag::add(ag::zeros({2}), ag::zeros({2}, Dtype::Float64)); },
                                      {"add:", "Float32", "Float64"});
  check_throws<std::invalid_argument>([] { ag::matmul(ag::zeros({2, 2}), ag::zeros({2, 2}, Dtype::Float64)); },
                                      {"matmul:", "Float32", "Float64"});
}

BOOST_AUTO_TEST_CASE(input_dtype_differs_from_the_module_parameters) {
  nn::MultiHeadAttention mha(4, 2);  // Float32 parameters
  const Tensor x = ag::zeros({1, 3, 4}, Dtype::Float64);
  check_throws<std::invalid_argument>([&] { mha.forward(x, x, x); }, {"Float64", "Float32", ".to()"});
}

// ---- masks ----

BOOST_AUTO_TEST_CASE(key_padding_mask_of_the_wrong_shape) {
  nn::MultiHeadAttention mha(4, 2);
  const Tensor x = ag::zeros({2, 3, 4});
  nn::AttentionOptions ao;
  ao.key_padding_mask = ag::zeros({2, 4});
  check_throws<std::invalid_argument>([&] { mha.forward(x, x, x, ao); }, {"key_padding_mask", "[2, 4]", "[2, 3]"});
}

BOOST_AUTO_TEST_CASE(attn_mask_of_the_wrong_shape) {
  nn::MultiHeadAttention mha(4, 2);
  const Tensor x = ag::zeros({2, 3, 4});
  nn::AttentionOptions ao;
  ao.attn_mask = ag::zeros({3, 5});
  check_throws<std::invalid_argument>([&] { mha.forward(x, x, x, ao); }, {"attn_mask", "[3, 5]"});
}

BOOST_AUTO_TEST_CASE(masked_fill_mask_that_does_not_broadcast) {
  check_throws<std::invalid_argument>([] { ag::masked_fill(ag::zeros({2, 3}), ag::zeros({2}), 0.0); },
                                      {"masked_fill:", "[2, 3]", "[2]"});
}

BOOST_AUTO_TEST_CASE(causal_attention_with_different_query_and_key_lengths) {
  nn::MultiHeadAttention mha(4, 2);
  nn::AttentionOptions ao;
  ao.is_causal = true;
  check_throws<std::invalid_argument>([&] { mha.forward(ag::zeros({1, 2, 4}), ag::zeros({1, 3, 4}), ag::zeros({1, 3, 4}), ao); },
                                      {"is_causal", "T = 2", "S = 3"});
}

// ---- backward ----

BOOST_AUTO_TEST_CASE(backward_on_a_non_scalar_without_a_gradient) {
  Tensor x = f64({1, 2, 3, 4, 5, 6}, {2, 3}).requires_grad_(true);
  Tensor y = x * 2.0;
  check_throws<std::runtime_error>([&] { y.backward(); }, {"backward:", "one-element", "[2, 3]", "t.backward(grad)"});
}

BOOST_AUTO_TEST_CASE(backward_with_a_gradient_of_the_wrong_shape) {
  Tensor x = f64({1, 2, 3}, {3}).requires_grad_(true);
  Tensor y = x * 2.0;
  check_throws<std::invalid_argument>([&] { y.backward(f64({1, 1}, {2})); }, {"backward:", "[2]", "[3]"});
}

BOOST_AUTO_TEST_CASE(backward_twice_over_a_freed_graph) {
  Tensor x = f64({1, 2}, {2}).requires_grad_(true);
  Tensor loss = ag::sum(ag::exp(x));
  loss.backward();
  check_throws<std::runtime_error>([&] { loss.backward(); }, {"already freed", "retain_graph = true"});
}

BOOST_AUTO_TEST_CASE(backward_on_a_tensor_that_needs_no_gradient) {
  Tensor y = ag::sum(f64({1, 2}, {2}));
  check_throws<std::runtime_error>([&] { y.backward(); }, {"does not require grad"});
}

BOOST_AUTO_TEST_CASE(in_place_change_of_a_tensor_that_requires_grad) {
  Tensor x = f64({1, 2}, {2}).requires_grad_(true);
  check_throws<std::invalid_argument>([&] { x.fill_(0.0); }, {"fill_:", "requires grad", "NoGradGuard"});
}

BOOST_AUTO_TEST_CASE(in_place_change_of_a_tensor_saved_for_backward) {
  Tensor x = f64({1, 2}, {2}).requires_grad_(true);
  Tensor loss = ag::sum(ag::log(x));
  {
    ag::NoGradGuard no_grad;
    x.fill_(3.0);
  }
  check_throws<std::runtime_error>([&] { loss.backward(); }, {"log:", "changed in place after it was saved"});
}

// ---- values and sizes ----

BOOST_AUTO_TEST_CASE(factory_values_that_do_not_fill_the_shape) {
  check_throws<std::invalid_argument>([] { ag::tensor({1, 2, 3}, {2, 2}); }, {"tensor:", "[2, 2]"});
}

BOOST_AUTO_TEST_CASE(undefined_tensor_as_an_argument) {
  check_throws<std::invalid_argument>([] { ag::exp(Tensor()); },
                                      {"exp: argument is an undefined tensor (default-constructed: no value)"});
  check_throws<std::invalid_argument>([] { Tensor().to_vector(); },
                                      {"to_vector: called on an undefined tensor (default-constructed: no value)"});
}

BOOST_AUTO_TEST_CASE(reading_a_grad_before_backward) {
  Tensor w = ag::ones({4, 4}, Dtype::Float64).requires_grad_(true);
  w.set_name("attn.W_Q");
  check_throws<std::invalid_argument>([&] { w.grad().to_vector(); },
                                      {"to_vector: the .grad() of 'attn.W_Q' [4, 4] is undefined: no backward has "
                                       "reached it yet (call backward() on a loss that depends on it)"});
  check_throws<std::invalid_argument>([&] { ag::exp(w.grad()); },
                                      {"exp: argument is the .grad() of 'attn.W_Q' [4, 4], which is undefined"});
}

BOOST_AUTO_TEST_CASE(empty_tensors_flow_through_ops_and_backward) {
  Tensor x = ag::zeros({0, 3}, Dtype::Float64).requires_grad_(true);
  Tensor w = f64({1, 2, 3, 4, 5, 6}, {3, 2}).requires_grad_(true);
  Tensor y = ag::matmul(ag::tanh(x), w);  // (0, 2)
  BOOST_TEST(y.shape() == ag::Shape({0, 2}));
  Tensor loss = ag::sum(y);
  BOOST_TEST(loss.item() == 0.0);  // the empty sum
  loss.backward();
  BOOST_TEST(x.grad().shape() == ag::Shape({0, 3}));
  BOOST_TEST(w.grad().to_vector() == std::vector<double>(6, 0.0), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(max_of_an_empty_tensor) {
  check_throws<std::invalid_argument>([] { ag::max(ag::zeros({0})); }, {"max:", "empty"});
}

BOOST_AUTO_TEST_CASE(nan_inputs_without_anomaly_detection_propagate) {
  Tensor x = f64({1.0, kNaN}, {2}).requires_grad_(true);
  Tensor loss = ag::sum(x * x);
  BOOST_TEST(std::isnan(loss.item()));
  loss.backward();  // no error: NaN is a value, as in PyTorch
  BOOST_TEST(std::isnan(x.grad().to_vector()[1]));
  BOOST_TEST(x.grad().to_vector()[0] == 2.0);
}

BOOST_AUTO_TEST_CASE(nan_inputs_under_anomaly_detection_throw_at_the_first_op) {
  ag::DetectAnomalyGuard anomaly;
  Tensor x = f64({1.0, kNaN}, {2}).requires_grad_(true);
  check_throws<ag::AnomalyError>([&] { ag::sum(x * x); }, {"anomaly detection:", "'mul' produced NaN", "element 1"});
}

BOOST_AUTO_TEST_CASE(log_of_a_negative_number_under_anomaly_detection) {
  ag::DetectAnomalyGuard anomaly;
  Tensor x = f64({-1.0}, {1}).requires_grad_(true);
  check_throws<ag::AnomalyError>([&] { ag::log(x); }, {"'log' produced NaN"});
}

// ---- modules and options ----

BOOST_AUTO_TEST_CASE(embed_dim_not_divisible_by_num_heads) {
  check_throws<std::invalid_argument>([] { nn::MultiHeadAttention mha(10, 3); }, {"embed_dim 10", "num_heads 3"});
}

BOOST_AUTO_TEST_CASE(embedding_index_out_of_range) {
  check_throws<std::invalid_argument>([] { ag::embedding(ag::zeros({4, 2}), ag::tensor({1, 4}, {2})); },
                                      {"embedding:", "4"});
}

BOOST_AUTO_TEST_CASE(gradcheck_on_float32) {
  Tensor x = ag::zeros({2}).requires_grad_(true);
  check_throws<std::invalid_argument>([&] { ag::gradcheck([](const std::vector<Tensor>& in) { return in[0] * 2.0; }, {x}); },
                                      {"gradcheck:", "Float64"});
}

// ---- checkpoint files ----

BOOST_AUTO_TEST_CASE(checkpoint_file_that_does_not_exist) {
  nn::Linear layer(2, 2);
  check_throws<nn::CheckpointError>([&] { nn::load_parameters(layer, "/nonexistent/dir/model.safetensors"); },
                                    {"/nonexistent/dir/model.safetensors", "cannot open"});
}

BOOST_AUTO_TEST_CASE(truncated_checkpoint_file_changes_nothing) {
  Scratch scratch;
  nn::Linear layer(3, 2);
  const auto file = scratch.path("model.safetensors");
  nn::save_parameters(layer, file);
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto before = layer.weight().to_vector();
  nn::Linear other(3, 2);
  const auto other_before = other.weight().to_vector();
  const auto cut = scratch.write("cut.safetensors", bytes.substr(0, bytes.size() - 5));
  check_throws<nn::CheckpointError>([&] { nn::load_parameters(other, cut); }, {"cut.safetensors", "truncated"});
  BOOST_TEST(other.weight().to_vector() == other_before, boost::test_tools::per_element());
  const auto tiny = scratch.write("tiny.safetensors", "abc");
  check_throws<nn::CheckpointError>([&] { nn::load_parameters(other, tiny); }, {"tiny.safetensors", "too short"});
  (void)before;
}

BOOST_AUTO_TEST_CASE(corrupt_checkpoint_header) {
  Scratch scratch;
  nn::Linear layer(2, 2);
  std::string header = "{\"weight\": [1, 2";
  std::string bytes(8, '\0');
  bytes[0] = static_cast<char>(header.size());
  const auto file = scratch.write("bad.safetensors", bytes + header);
  check_throws<nn::CheckpointError>([&] { nn::load_parameters(layer, file); }, {"bad.safetensors", "corrupt header"});
}

BOOST_AUTO_TEST_CASE(checkpoint_of_a_different_model) {
  Scratch scratch;
  nn::Linear small(2, 3), big(4, 3);
  const auto file = scratch.path("small.safetensors");
  nn::save_parameters(small, file);
  const auto before = big.weight().to_vector();
  check_throws<nn::CheckpointError>([&] { nn::load_parameters(big, file); },
                                    {"'weight' has shape [2, 3] in the file but the parameter is [4, 3]", "no parameter was changed"});
  BOOST_TEST(big.weight().to_vector() == before, boost::test_tools::per_element());
}
