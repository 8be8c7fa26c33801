// Sizes computed from a caller's numbers never wrap: a shape, a length or a list of sizes whose
// element count, byte count or offset does not fit in 64 bits is a std::invalid_argument naming
// the op and the shape, never a small buffer, a wrong element count, a crash or a loop. Sizes
// near the limit that do fit keep working (empty tensors of a huge shape, huge steps and chunk
// counts).
#define BOOST_TEST_MODULE overflow
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>
#include <autograd/detail/sanitizer.hpp>

#include "test_support.hpp"

#ifdef HEADGRAD_ASAN
// An allocation larger than AddressSanitizer supports returns null (which the engine turns into
// std::bad_alloc, as without the sanitizer) instead of stopping the program.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
#endif

using namespace test_support::prelude;

namespace {

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t k2p62 = std::int64_t{1} << 62;
constexpr std::int64_t k2p61 = std::int64_t{1} << 61;
constexpr std::int64_t k2p32 = std::int64_t{1} << 32;

}  // namespace

// ---- the checked arithmetic itself ----

BOOST_AUTO_TEST_CASE(checked_arithmetic_throws_instead_of_wrapping) {
  BOOST_TEST(ag::checked_mul("op", k2p61, 2) == k2p62);
  BOOST_TEST(error_of([] { ag::checked_mul("op", k2p62, 2); }) ==
             "op: size overflow: 4611686018427387904 * 2 does not fit in 64 bits");
  BOOST_TEST(ag::checked_add("op", kMax - 1, 1) == kMax);
  BOOST_TEST(error_of([] { ag::checked_add("op", kMax, 1); }) ==
             "op: size overflow: 9223372036854775807 + 1 does not fit in 64 bits");
  BOOST_TEST(ag::checked_numel("op", Shape{k2p32, k2p32 / 4}) == k2p62);
  BOOST_TEST(error_of([] { ag::checked_numel("op", Shape{k2p32, k2p32}); }) ==
             "op: shape [4294967296, 4294967296] has more elements than a 64-bit count can hold");
  BOOST_TEST(error_of([] { ag::checked_numel("op", Shape{2, -3}); }) == "op: shape [2, -3] has a negative size");
  // A zero size makes the count 0, but the other sizes must still multiply within 64 bits:
  // kernels compute partial products of a shape (strides, outer and inner counts).
  BOOST_TEST(ag::checked_numel("op", Shape{k2p62, 0}) == 0);
  BOOST_TEST(ag::checked_numel("op", Shape{0, k2p62, 1}) == 0);
  BOOST_TEST(error_of([] { ag::checked_numel("op", Shape{k2p62, 4, 0}); }) ==
             "op: shape [4611686018427387904, 4, 0] has no elements, but its other sizes multiply past what a "
             "64-bit count can hold");
  std::int64_t n = -1;
  BOOST_TEST(!ag::numel_fits(Shape{k2p62, 0, 4}, n));
  BOOST_TEST(n == -1);
  BOOST_TEST(ag::numel_fits(Shape{3, 0, k2p61}, n));
  BOOST_TEST(n == 0);
}

// ---- factories ----

BOOST_AUTO_TEST_CASE(a_factory_whose_byte_count_overflows_throws) {
  // 2^62 Float32 elements are 2^64 bytes: once wrapped to a 64-byte buffer.
  BOOST_TEST(error_of([] { ag::zeros({k2p62}); }) ==
             "zeros: shape [4611686018427387904] of Float32 needs more bytes than a 64-bit count can hold");
  BOOST_TEST(error_of([] { ag::ones({kMax}); }) ==
             "ones: shape [9223372036854775807] of Float32 needs more bytes than a 64-bit count can hold");
  BOOST_TEST(error_of([] { ag::full({k2p61}, 2.0, Dtype::Float64); }) ==
             "full: shape [2305843009213693952] of Float64 needs more bytes than a 64-bit count can hold");
  BOOST_TEST(error_of([] { Tensor::empty({k2p61}, Dtype::Float64); }).find("empty: shape [2305843009213693952]") == 0);
  BOOST_TEST(error_of([] { ag::rand({k2p62}); }).find("shape [4611686018427387904] of Float32 needs more bytes") !=
             std::string::npos);
  BOOST_TEST(error_of([] { ag::randn({k2p62, 1}); }).find("needs more bytes than a 64-bit count can hold") !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_factory_whose_element_count_overflows_throws) {
  // 2^32 * 2^32 wraps to 0 elements: the empty value list once "filled" it.
  BOOST_TEST(error_of([] { ag::tensor({}, {k2p32, k2p32}); }) ==
             "tensor: shape [4294967296, 4294967296] has more elements than a 64-bit count can hold");
  BOOST_TEST(error_of([] { ag::zeros({k2p32, k2p32, 2}); }) ==
             "zeros: shape [4294967296, 4294967296, 2] has more elements than a 64-bit count can hold");
  BOOST_TEST(error_of([] { ag::ones({k2p62, 4, 0}); }).find("ones: shape [4611686018427387904, 4, 0] has no elements") == 0);
  BOOST_TEST(error_of([] { ag::zeros({3, -2}); }) == "zeros: shape [3, -2] has a negative size");
  // (2^62 + 1) * 4 wraps to exactly 4: four values once matched it.
  BOOST_TEST(error_of([] { ag::tensor({1, 2, 3, 4}, {k2p62 + 1, 4}); }).find("tensor: shape [4611686018427387905, 4]") ==
             0);
}

BOOST_AUTO_TEST_CASE(a_huge_shape_that_fits_is_an_allocation_failure_or_an_empty_tensor) {
  // 2^60 Float32 elements: 2^62 bytes is a valid count the system cannot give.
  BOOST_CHECK_THROW(ag::zeros({std::int64_t{1} << 60}), std::bad_alloc);
  Tensor e = ag::zeros({k2p61, 0, 3});
  BOOST_TEST(e.numel() == 0);
  BOOST_TEST(ag::shape_str(e.shape()) == "[2305843009213693952, 0, 3]");
}

BOOST_AUTO_TEST_CASE(arange_with_more_values_than_a_count_can_hold_throws) {
  BOOST_TEST(error_of([] { ag::arange(1e30); }) ==
             "arange: [0, 1e+30) in steps of 1 holds 1e+30 values, more than a 64-bit count can hold");
  BOOST_TEST(error_of([] { ag::arange(-1e308, 1e308, 1e-300); }).find("arange: [-1e+308, 1e+308) in steps of 1e-300") ==
             0);
  BOOST_TEST(error_of([] { ag::arange(0, 9.3e18, 1); }).find("more than a 64-bit count can hold") != std::string::npos);
  // 2^62 Float32 values fit in a count but not in a byte count.
  BOOST_TEST(error_of([] { ag::arange(0, static_cast<double>(k2p62)); }) ==
             "arange: shape [4611686018427387904] of Float32 needs more bytes than a 64-bit count can hold");
  check_values(ag::arange(2, 11, 3, Dtype::Float64), {3}, {2, 5, 8});
}

// ---- shape ops ----

BOOST_AUTO_TEST_CASE(reshape_to_a_shape_whose_count_wraps_throws) {
  Tensor x = ag::zeros({4});
  BOOST_TEST(error_of([&] { ag::reshape(x, {k2p62 + 1, 4}); }) ==
             "reshape: cannot reshape [4] into [4611686018427387905, 4]: its sizes multiply past what a 64-bit "
             "count can hold");
  BOOST_TEST(error_of([&] { ag::reshape(x, {-1, k2p62 + 1, 4}); }) ==
             "reshape: cannot reshape [4] into [-1, 4611686018427387905, 4]: its sizes multiply past what a 64-bit "
             "count can hold");
  Tensor e = ag::zeros({0});
  BOOST_TEST(error_of([&] { ag::reshape(e, {k2p62, 4, 0}); }).find("reshape: cannot reshape [0] into") == 0);
  BOOST_TEST(ag::shape_str(ag::reshape(e, {k2p62, 0}).shape()) == "[4611686018427387904, 0]");
}

BOOST_AUTO_TEST_CASE(expand_to_a_shape_whose_count_wraps_throws) {
  Tensor x = ag::ones({1});
  BOOST_TEST(error_of([&] { ag::expand(x, {k2p62 + 1, 4}); }) ==
             "expand: shape [4611686018427387905, 4] has more elements than a 64-bit count can hold");
  BOOST_TEST(error_of([&] { ag::expand(x, {k2p61, -1}); }) ==
             "expand: shape [2305843009213693952, 1] of Float32 needs more bytes than a 64-bit count can hold");
  BOOST_TEST(ag::shape_str(ag::expand(ag::zeros({0}), {k2p62, 0}).shape()) == "[4611686018427387904, 0]");
}

BOOST_AUTO_TEST_CASE(narrow_with_a_huge_length_throws) {
  Tensor x = iota({3, 4});
  // start + length wrapped to a negative number and passed the range check.
  BOOST_TEST(error_of([&] { ag::narrow(x, 1, 1, kMax); }) ==
             "narrow: start 1 + length 9223372036854775807 exceeds dim 1 of size 4 (shape [3, 4])");
  BOOST_TEST(error_of([&] { ag::narrow(x, 0, -1, kMax); }) ==
             "narrow: start 2 + length 9223372036854775807 exceeds dim 0 of size 3 (shape [3, 4])");
  check_values(ag::narrow(x, 1, 3, 1), {3, 1}, {3, 7, 11});
}

BOOST_AUTO_TEST_CASE(slice_with_a_huge_step_or_bounds_takes_what_is_there) {
  Tensor x = iota({5}, Dtype::Float64);
  check_values(ag::slice(x, 0, 0, 5, kMax), {1}, {0});
  check_values(ag::slice(x, 0, 1, kMax, kMax - 1), {1}, {1});
  check_values(ag::slice(x, 0, -kMax, kMax, 2), {3}, {0, 2, 4});
  check_values(ag::slice(x, 0, std::numeric_limits<std::int64_t>::min(), 2), {2}, {0, 1});
}

BOOST_AUTO_TEST_CASE(split_sizes_whose_sum_wraps_throw) {
  Tensor x = iota({2, 5});
  // kMax + kMax + 7 wraps to 5, the size of dim 1.
  BOOST_TEST(error_of([&] { ag::split(x, std::vector<std::int64_t>{kMax, kMax, 7}, 1); }) ==
             "split: sizes [9223372036854775807, 9223372036854775807, 7] add up to more than dim 1 of [2, 5] "
             "(size 5)");
  BOOST_TEST(error_of([&] { ag::split(x, std::vector<std::int64_t>{6, 1}, 1); }) ==
             "split: sizes [6, 1] add up to more than dim 1 of [2, 5] (size 5)");
  BOOST_TEST(error_of([&] { ag::split(x, std::vector<std::int64_t>{2, 2}, 1); }) ==
             "split: sizes [2, 2] add up to 4, but dim 1 of [2, 5] has size 5");
  const TensorList big = ag::split(x, kMax, 1);
  BOOST_TEST(big.size() == 1u);
  check_values(big[0], {2, 5}, x.to_vector());
  const TensorList two = ag::split(x, kMax - 1, 0);
  BOOST_TEST(two.size() == 1u);
}

BOOST_AUTO_TEST_CASE(chunk_into_a_huge_number_of_chunks_gives_one_element_pieces) {
  Tensor x = iota({2, 5});
  // (size + chunks - 1) wrapped negative and the piece loop never ended.
  const TensorList pieces = ag::chunk(x, kMax, 1);
  BOOST_TEST(pieces.size() == 5u);
  for (std::size_t i = 0; i < pieces.size(); ++i)
    check_values(pieces[i], {2, 1}, {static_cast<double>(i), static_cast<double>(5 + i)});
  BOOST_TEST(ag::chunk(x, kMax - 1, 0).size() == 2u);
  BOOST_TEST(ag::chunk(ag::zeros({0, 3}), kMax, 0).size() == 1u);
}

BOOST_AUTO_TEST_CASE(cat_whose_sizes_add_up_past_64_bits_throws) {
  const Tensor piece = ag::zeros({k2p62, 0});
  // Four pieces of 2^62 rows added up to 0 rows; three to a negative count.
  BOOST_TEST(error_of([&] { ag::cat({piece, piece, piece, piece}, 0); }) ==
             "cat: sizes along dim 0 of shapes [4611686018427387904, 0], [4611686018427387904, 0], "
             "[4611686018427387904, 0], [4611686018427387904, 0] add up to more than a 64-bit count can hold");
  BOOST_TEST(error_of([&] { ag::cat({piece, piece, piece}, 0); }).find("cat: sizes along dim 0 of shapes") == 0);
  BOOST_TEST(ag::shape_str(ag::cat({piece, ag::zeros({3, 0})}, 0).shape()) == "[4611686018427387907, 0]");
}

BOOST_AUTO_TEST_CASE(stack_whose_result_shape_overflows_throws) {
  const Tensor piece = ag::zeros({k2p62, 0});
  BOOST_TEST(error_of([&] { ag::stack({piece, piece, piece, piece}, 1); }) ==
             "stack: shape [4611686018427387904, 4, 0] has no elements, but its other sizes multiply past what a "
             "64-bit count can hold");
  const Tensor half = ag::zeros({k2p61, 0});
  BOOST_TEST(ag::shape_str(ag::stack({half, half}, 2).shape()) == "[2305843009213693952, 0, 2]");
}

BOOST_AUTO_TEST_CASE(index_ops_whose_result_shape_overflows_throw) {
  const Tensor x = ag::zeros({k2p61, 0, 1});
  BOOST_TEST(error_of([&] { ag::index_select(x, 2, std::vector<std::int64_t>{0, 0, 0, 0, 0}); }) ==
             "index_select: shape [2305843009213693952, 0, 5] has no elements, but its other sizes multiply past "
             "what a 64-bit count can hold");
  const Tensor weight = ag::zeros({3, 8});
  const Tensor indices = ag::zeros({k2p62, 0});
  BOOST_TEST(error_of([&] { ag::embedding(weight, indices); }) ==
             "embedding: shape [4611686018427387904, 0, 8] has no elements, but its other sizes multiply past what "
             "a 64-bit count can hold");
  BOOST_TEST(ag::shape_str(ag::embedding(weight, ag::zeros({k2p32, 0})).shape()) == "[4294967296, 0, 8]");
}

BOOST_AUTO_TEST_CASE(broadcasting_to_a_shape_whose_count_overflows_throws) {
  const Tensor a = ag::zeros({k2p62, 1, 0});
  const Tensor b = ag::zeros({1, 8, 0});
  BOOST_TEST(error_of([&] { ag::add(a, b); }) ==
             "add: shapes [4611686018427387904, 1, 0] and [1, 8, 0] broadcast to [4611686018427387904, 8, 0], "
             "whose sizes multiply past what a 64-bit count can hold");
  BOOST_TEST(ag::shape_str(ag::mul(a, ag::zeros({1, 1, 0})).shape()) == "[4611686018427387904, 1, 0]");
}
