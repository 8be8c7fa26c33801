// A refusal names the op the caller called and the argument at fault: a result too large for a
// 64-bit count is refused by matmul, linear or the attention op (never by the allocation helper
// inside them), and where() names the value argument that has the wrong dtype.
#define BOOST_TEST_MODULE messages_name_the_call
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <string>

#include <autograd/autograd.hpp>

#include "test_support.hpp"

using namespace test_support::prelude;

namespace {

constexpr std::int64_t k2p12 = std::int64_t{1} << 12;
constexpr std::int64_t k2p20 = std::int64_t{1} << 20;
constexpr std::int64_t k2p31 = std::int64_t{1} << 31;
constexpr std::int64_t k2p32 = std::int64_t{1} << 32;
constexpr std::int64_t k2p40 = std::int64_t{1} << 40;

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

BOOST_AUTO_TEST_SUITE(messages_name_the_call)

BOOST_AUTO_TEST_CASE(matmul_refuses_a_product_too_large_to_count_naming_matmul) {
  // [2^32, 0] x [0, 2^32]: empty operands, a [2^32, 2^32] product.
  const std::string m = error_of([] { ag::matmul(ag::zeros({k2p32, 0}), ag::zeros({0, k2p32})); });
  BOOST_TEST(m ==
             "matmul: [4294967296, 0] x [0, 4294967296] gives shape [4294967296, 4294967296], more elements than a "
             "64-bit count can hold");
  // Batch dims that broadcast to more than a count can hold.
  const std::string b = error_of([] { ag::matmul(ag::zeros({k2p40, 1, 0, 0}), ag::zeros({1, k2p40, 0, 5})); });
  BOOST_TEST(starts_with(b, "matmul: [1099511627776, 1, 0, 0] x [1, 1099511627776, 0, 5] gives shape "
                            "[1099511627776, 1099511627776, 0, 5]"),
             b);
  // A product that fits is computed: [2^31, 0] x [0, 0] has no elements.
  BOOST_TEST(ag::shape_str(ag::matmul(ag::zeros({k2p31, 0}), ag::zeros({0, 0})).shape()) == "[2147483648, 0]");
}

BOOST_AUTO_TEST_CASE(linear_refuses_an_output_too_large_to_count_naming_linear) {
  const std::string m = error_of([] { ag::linear(ag::zeros({k2p32, 0}), ag::zeros({0, k2p32})); });
  BOOST_TEST(m ==
             "linear: input [4294967296, 0] and weight [0, 4294967296] give shape [4294967296, 4294967296], more "
             "elements than a 64-bit count can hold");
  const Tensor w[] = {ag::zeros({0, k2p31}), ag::zeros({0, k2p31})};
  const std::string c = error_of([&] { ag::linear_cat(ag::zeros({k2p32, 0}), w); });
  BOOST_TEST(starts_with(c, "linear_cat: input [4294967296, 0] and weights of 4294967296 columns give shape "
                            "[4294967296, 4294967296], more elements than a 64-bit count can hold"),
             c);
}

BOOST_AUTO_TEST_CASE(attention_refuses_weights_too_large_to_count_naming_the_attention_op) {
  // (B, H, T, S) = (2^20, 2^20, 2^12, 2^12) with empty heads: the weights would have 2^64 entries.
  const Tensor q = ag::zeros({k2p20, k2p20, k2p12, 0});
  const std::string want = "shape [1048576, 1048576, 4096, 4096] has more elements than a 64-bit count can hold";
  const std::string m = error_of([&] { (void)ag::scaled_dot_product_attention(q, q, q, {.need_weights = true}); });
  BOOST_TEST(m == "scaled_dot_product_attention: " + want);
  ag::Generator gen(1);
  const std::string d = error_of([&] {
    (void)ag::scaled_dot_product_attention(q, q, q, {.need_weights = true, .dropout_p = 0.5, .generator = &gen});
  });
  BOOST_TEST(d == "scaled_dot_product_attention: " + want);
  const Tensor ql = ag::zeros({k2p20, k2p12, 0});  // heads last: (B, T, H·d) with H = 2^20, d = 0
  const std::string h =
      error_of([&] { (void)ag::scaled_dot_product_attention_heads_last(ql, ql, ql, k2p20, {.need_weights = true}); });
  BOOST_TEST(h == "scaled_dot_product_attention_heads_last: " + want);
}

BOOST_AUTO_TEST_CASE(where_names_the_value_argument_with_the_wrong_dtype) {
  const Tensor mask = ag::tensor_int64({1, 0, 1}, {3});
  const Tensor ints = ag::tensor_int64({4, 5, 6}, {3});
  const Tensor floats = ag::ones({3});
  const std::string needs = "needs a Float32 or Float64 tensor, got Int64 (shape [3]); convert with .to(Dtype::Float32)";
  BOOST_TEST(error_of([&] { ag::where(mask, ints, ag::zeros({3}, Dtype::Int64)); }) == "where: second argument " + needs);
  BOOST_TEST(error_of([&] { ag::where(mask, floats, ints); }) == "where: third argument " + needs);
  BOOST_TEST(error_of([&] { ag::where(mask, floats, ag::ones({3}, Dtype::Float64)); }) ==
             "where: dtypes differ: second argument Float32 and third argument Float64");
  BOOST_TEST(error_of([&] { ag::where(Tensor(), floats, floats); }).find("where: condition is") == 0u);
  BOOST_TEST(error_of([&] { ag::where(mask, Tensor(), floats); }).find("where: second argument is") == 0u);
  BOOST_TEST(error_of([&] { ag::where(mask, floats, Tensor()); }).find("where: third argument is") == 0u);
  // A valid call selects.
  check_values(ag::where(mask, ag::tensor({1, 2, 3}, {3}), ag::tensor({7, 8, 9}, {3})), {3}, {1, 8, 3});
}

BOOST_AUTO_TEST_SUITE_END()
