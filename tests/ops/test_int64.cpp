// Int64 tensors: construction, access, conversions (truncation toward zero, errors on values with
// no integer), printing as integers, the comparisons, the reductions that keep Int64, and every
// floating-point op rejecting Int64 with a message naming itself.
#define BOOST_TEST_MODULE int64
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "int64_support.hpp"
#include "test_support.hpp"

using namespace test_support::prelude;
using test_support::I64;
using test_support::int_values;
using test_support::ints;

namespace {

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();

}  // namespace

// ---------------------------------------------------------------- construction and access

BOOST_AUTO_TEST_CASE(int64_tensors_hold_their_values_exactly) {
  const I64 v = {kMin, -1, 0, (std::int64_t{1} << 53) + 1, kMax, 7};
  const Tensor t = ints(v, {2, 3});
  BOOST_TEST((t.dtype() == Dtype::Int64));
  BOOST_TEST(ag::dtype_name(t.dtype()) == "Int64");
  BOOST_TEST(ag::dtype_size(Dtype::Int64) == 8u);
  BOOST_TEST(ag::shape_str(t.shape()) == "[2, 3]");
  BOOST_TEST(int_values(t) == v, boost::test_tools::per_element());
  BOOST_TEST(ints({kMax}, {}).item<std::int64_t>() == kMax);  // exact, where item() (a double) rounds
  BOOST_TEST(ints({5}, {1}).item() == 5.0);
  BOOST_TEST(contains(error_of([] { (void)ints({1, 2}, {2}).item<std::int64_t>(); }), "item: needs a tensor with one element"));
  BOOST_TEST(contains(error_of([&] { (void)t.data<float>(); }), "data: tensor holds Int64 but Float32 was asked for"));
  BOOST_TEST(contains(error_of([] { (void)ints({1, 2, 3}, {2}); }), "tensor: 3 values given for shape [2] (2 elements)"));
  // a braced list of numbers still makes a Float32 tensor
  BOOST_TEST((ag::tensor({1, 2}, {2}).dtype() == Dtype::Float32));
}

BOOST_AUTO_TEST_CASE(factories_make_int64_tensors) {
  BOOST_TEST(int_values(ag::zeros({3}, Dtype::Int64)) == I64({0, 0, 0}), boost::test_tools::per_element());
  BOOST_TEST(int_values(ag::ones({2}, Dtype::Int64)) == I64({1, 1}), boost::test_tools::per_element());
  BOOST_TEST(int_values(ag::full({2}, -4.0, Dtype::Int64)) == I64({-4, -4}), boost::test_tools::per_element());
  BOOST_TEST(int_values(ag::arange(5, Dtype::Int64)) == I64({0, 1, 2, 3, 4}), boost::test_tools::per_element());
  BOOST_TEST(int_values(ag::arange(6, 0, -2, Dtype::Int64)) == I64({6, 4, 2}), boost::test_tools::per_element());
  BOOST_TEST(int_values(ag::scalar_tensor(9, Dtype::Int64)) == I64({9}), boost::test_tools::per_element());
  BOOST_TEST(int_values(ag::zeros_like(ints({1, 2}, {2}))) == I64({0, 0}), boost::test_tools::per_element());
  // from doubles: truncated toward zero, as torch.tensor([2.7, -2.7], dtype=torch.long)
  BOOST_TEST(int_values(ag::tensor({2.7, -2.7, 3}, {3}, Dtype::Int64)) == I64({2, -2, 3}),
             boost::test_tools::per_element());
  check_throws<std::invalid_argument>([] { ag::tensor({1, NAN}, {2}, Dtype::Int64); },
                                      {"tensor: value nan at position 1 cannot be converted to Int64"});
  check_throws<std::invalid_argument>([] { ag::full({2}, 1e19, Dtype::Int64); },
                                      {"full: value 1e+19 cannot be converted to Int64"});
  check_throws<std::invalid_argument>([] { ag::randn({2}, Dtype::Int64); },
                                      {"randn: draws floating-point values: dtype must be Float32 or Float64, got Int64"});
  check_throws<std::invalid_argument>([] { ag::rand({2}, Dtype::Int64); }, {"rand: ", "got Int64"});
  ag::Generator gen(1);
  check_throws<std::invalid_argument>([&] { ag::uniform({2}, 0, 1, Dtype::Int64, gen); }, {"uniform: ", "got Int64"});
}

// ---------------------------------------------------------------- conversions

BOOST_AUTO_TEST_CASE(to_int64_truncates_toward_zero_like_torch) {
  const std::vector<double> v = {-2.9, -2.5, -0.5, 0.0, 0.5, 2.5, 2.9, 1e15 + 0.5, -9.0e18};
  for (Dtype d : {Dtype::Float32, Dtype::Float64}) {
    const Tensor x = ag::tensor(v, {static_cast<std::int64_t>(v.size())}, d);
    const I64 got = int_values(x.to(Dtype::Int64));
    const std::vector<double> xs = x.to_vector();  // the values as stored (float32 rounds some)
    for (std::size_t i = 0; i < v.size(); ++i) BOOST_TEST(got[i] == static_cast<std::int64_t>(std::trunc(xs[i])));
  }
  // back to floats: exact where the float holds the integer
  const Tensor i = ints({-3, 0, (std::int64_t{1} << 53), 12345}, {4});
  check_values(i.to(Dtype::Float64), {4}, {-3, 0, 9007199254740992.0, 12345}, 0.0);
  check_values(i.to(Dtype::Float32), {4}, {-3, 0, 9007199254740992.0, 12345}, 0.0);
  BOOST_TEST(i.to(Dtype::Int64).is_same(i));
}

BOOST_AUTO_TEST_CASE(to_int64_refuses_values_with_no_integer) {
  const double inf = std::numeric_limits<double>::infinity();
  check_throws<std::invalid_argument>([] { f64({1, NAN}, {2}).to(Dtype::Int64); },
                                      {"to: value nan at position 1 cannot be converted to Int64"});
  check_throws<std::invalid_argument>([&] { f64({-inf}, {1}).to(Dtype::Int64); }, {"to: value -inf at position 0"});
  check_throws<std::invalid_argument>([] { f64({9.3e18}, {1}).to(Dtype::Int64); }, {"to: value 9.3e+18 at position 0"});
  check_throws<std::invalid_argument>([] { ag::tensor({3e19}, {1}).to(Dtype::Int64); },
                                      {"to: value 3.000000104103097e+19 at position 0 cannot be converted to Int64"});
  // -2^63 itself converts; the double just above 2^63 - 1 (2^63) does not
  BOOST_TEST(int_values(f64({-0x1p63}, {1}).to(Dtype::Int64))[0] == kMin);
  check_throws<std::invalid_argument>([] { f64({0x1p63}, {1}).to(Dtype::Int64); }, {"to: value 9.223372036854776e+18"});
}

BOOST_AUTO_TEST_CASE(copy_and_fill_convert_as_to_does) {
  Tensor dst = ag::zeros({3}, Dtype::Int64);
  dst.copy_(f64({1.9, -1.9, 4}, {3}));
  BOOST_TEST(int_values(dst) == I64({1, -1, 4}), boost::test_tools::per_element());
  check_throws<std::invalid_argument>([&] { dst.copy_(f64({1, 2, NAN}, {3})); }, {"copy_: value nan at position 2"});
  Tensor f = ag::zeros({2}, Dtype::Float64);
  f.copy_(ints({kMin, 3}, {2}));
  check_values(f, {2}, {-0x1p63, 3}, 0.0);
  dst.fill_(-7.5);
  BOOST_TEST(int_values(dst) == I64({-7, -7, -7}), boost::test_tools::per_element());
  check_throws<std::invalid_argument>([&] { dst.fill_(NAN); }, {"fill_: value nan cannot be converted to Int64"});
  const Tensor c = ints({4, 5}, {2}).clone();
  BOOST_TEST(int_values(c) == I64({4, 5}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(int64_tensors_cannot_require_grad) {
  Tensor t = ints({1, 2}, {2});
  check_throws<std::invalid_argument>([&] { t.requires_grad_(); },
                                      {"requires_grad_: only Float32 and Float64 tensors can require grad, got an "
                                       "Int64 tensor [2]"});
  t.requires_grad_(false);  // turning it off is harmless
  BOOST_TEST(!t.requires_grad());
  // a float leaf that requires grad, converted to Int64, leaves the graph (as PyTorch's .long())
  const Tensor x = f64({1.5, 2.5}, {2}).requires_grad_();
  const Tensor i = x.to(Dtype::Int64);
  BOOST_TEST(!i.requires_grad());
  BOOST_TEST(!i.grad_fn());
  Tensor w = f64({1, 2}, {2}).requires_grad_();
  check_throws<std::invalid_argument>([&] { w.set_data(ints({1, 2}, {2})); },
                                      {"set_data: this tensor requires grad, so its data cannot become Int64"});
}

// ---------------------------------------------------------------- printing

BOOST_AUTO_TEST_CASE(int64_tensors_print_as_aligned_integers) {
  // PyTorch: print(torch.tensor([[3, -1], [10, 250]])) gives these columns
  BOOST_TEST(ag::to_string(ints({3, -1, 10, 250}, {2, 2})) ==
             "tensor([[  3,  -1],\n        [ 10, 250]], dtype=Int64, shape=[2, 2])");
  BOOST_TEST(ag::to_string(ints({7}, {})) == "tensor(7, dtype=Int64, shape=[])");
  BOOST_TEST(ag::to_string(ints({}, {0})) == "tensor([], dtype=Int64, shape=[0])");
  // exact beyond 2^53, never scientific however wide the range
  BOOST_TEST(ag::to_string(ints({(std::int64_t{1} << 53) + 1, 1}, {2})) ==
             "tensor([9007199254740993,                1], dtype=Int64, shape=[2])");
  BOOST_TEST(ag::to_string(ints({kMin}, {1})) == "tensor([-9223372036854775808], dtype=Int64, shape=[1])");
  // summarised like torch.arange(2000)
  BOOST_TEST(ag::to_string(ag::arange(2000, Dtype::Int64)) ==
             "tensor([   0,    1,    2,  ..., 1997, 1998, 1999], dtype=Int64, shape=[2000])");
  // the same values as floats keep their decimals
  BOOST_TEST(contains(ag::to_string(ints({3, -1}, {2}).to(Dtype::Float32)), "3.0000"));
  BOOST_TEST(fmt::format("{}", Dtype::Int64) == "Int64");
}

// ---------------------------------------------------------------- comparisons

namespace {

// Checks op(a, b) against the comparison done value by value on the broadcast (by expand) inputs.
void check_comparison(const std::string& name, Tensor (*op)(const Tensor&, const Tensor&),
                      const std::function<bool(double, double)>& ref, const Tensor& a, const Tensor& b) {
  const Tensor r = op(a, b);
  BOOST_TEST((r.dtype() == Dtype::Int64), name);
  const Shape shape = ag::broadcast_shapes(name, a.shape(), b.shape());
  BOOST_TEST(ag::shape_str(r.shape()) == ag::shape_str(shape), name);
  const std::vector<double> x = ag::expand(a, shape).to_vector(), z = ag::expand(b, shape).to_vector();
  const I64 got = int_values(r);
  for (std::size_t i = 0; i < got.size(); ++i)
    BOOST_TEST(got[i] == (ref(x[i], z[i]) ? 1 : 0), name << " element " << i << ": " << x[i] << " vs " << z[i]);
}

struct NamedCmp {
  std::string name;
  Tensor (*op)(const Tensor&, const Tensor&);
  std::function<bool(double, double)> ref;
};

std::vector<NamedCmp> comparisons() {
  return {{"eq", ag::eq, [](double p, double q) { return p == q; }},
          {"ne", ag::ne, [](double p, double q) { return p != q; }},
          {"lt", ag::lt, [](double p, double q) { return p < q; }},
          {"le", ag::le, [](double p, double q) { return p <= q; }},
          {"gt", ag::gt, [](double p, double q) { return p > q; }},
          {"ge", ag::ge, [](double p, double q) { return p >= q; }}};
}

}  // namespace

BOOST_AUTO_TEST_CASE(comparisons_broadcast_and_give_int64_zeros_and_ones) {
  const Tensor a = f64({1, 2, 3, NAN, 5, 2}, {2, 3});
  const Tensor row = f64({2, 2, 5}, {3});
  const Tensor ia = ints({1, 2, 3, -4, 5, 2}, {2, 3});
  const Tensor irow = ints({2, -4, 5}, {3});
  for (const auto& c : comparisons()) {
    check_comparison(c.name, c.op, c.ref, a, row);                            // float64, broadcast
    check_comparison(c.name, c.op, c.ref, a.to(Dtype::Float32), row.to(Dtype::Float32));
    check_comparison(c.name, c.op, c.ref, ia, irow);                          // Int64
    check_comparison(c.name, c.op, c.ref, ia, row);                           // mixed: in Float64
    check_comparison(c.name, c.op, c.ref, ag::reshape(irow, {3, 1, 1}), ia.to(Dtype::Float32));
  }
  // beyond 2^53 Int64 compares exactly
  const std::int64_t big = std::int64_t{1} << 60;
  BOOST_TEST(int_values(ag::eq(ints({big}, {1}), ints({big + 1}, {1})))[0] == 0);
  BOOST_TEST(int_values(ag::lt(ints({big}, {1}), ints({big + 1}, {1})))[0] == 1);
  check_throws<std::invalid_argument>([] { ag::eq(ag::zeros({2}), ag::zeros({3})); }, {"eq: ", "[2]", "[3]"});
  check_throws<std::invalid_argument>([] { ag::lt(Tensor(), ag::zeros({3})); }, {"lt: first argument is"});
}

BOOST_AUTO_TEST_CASE(comparisons_with_a_number) {
  const Tensor i = ints({1, 2, 3}, {3});
  BOOST_TEST(int_values(ag::gt(i, 2.0)) == I64({0, 0, 1}), boost::test_tools::per_element());
  BOOST_TEST(int_values(ag::lt(i, 2.5)) == I64({1, 1, 0}), boost::test_tools::per_element());  // not truncated to 2
  BOOST_TEST(int_values(ag::eq(i, 2.5)) == I64({0, 0, 0}), boost::test_tools::per_element());
  BOOST_TEST(int_values(ag::le(i, INFINITY)) == I64({1, 1, 1}), boost::test_tools::per_element());
  BOOST_TEST(int_values(ag::ne(i, NAN)) == I64({1, 1, 1}), boost::test_tools::per_element());
  BOOST_TEST(int_values(ag::ge(f64({0.5, 1.5}, {2}), 1.0)) == I64({0, 1}), boost::test_tools::per_element());
  // a Float32 tensor compares with the number rounded to float32, as PyTorch
  BOOST_TEST(int_values(ag::eq(ag::tensor({0.1}, {1}), 0.1)) == I64({1}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(comparison_results_are_masks_and_counts) {
  const Tensor x = f64({1, -2, 3, -4}, {2, 2}).requires_grad_();
  const Tensor negative = ag::lt(x, 0.0);
  BOOST_TEST(!negative.requires_grad());
  const Tensor y = ag::masked_fill(x, negative, 0.0);
  check_values(y, {2, 2}, {1, 0, 3, 0}, 0.0);
  ag::sum(y * y).backward();
  check_values(x.grad(), {2, 2}, {2, 0, 6, 0}, 0.0);  // d(x²)/dx where kept, 0 where filled
  check_values(ag::where(ag::ge(x, 0.0), x, -x), {2, 2}, {1, 2, 3, 4}, 0.0);
  // accuracy the PyTorch way: (argmax == target).sum()
  const Tensor logits = f64({0.1, 0.9, 0.8, 0.2, 0.3, 0.7}, {3, 2});
  const Tensor hits = ag::sum(ag::eq(ag::argmax(logits, 1), ints({1, 1, 1}, {3})));
  BOOST_TEST((hits.dtype() == Dtype::Int64));
  BOOST_TEST(hits.item<std::int64_t>() == 2);
}

// ---------------------------------------------------------------- reductions and shape ops

BOOST_AUTO_TEST_CASE(argmax_sum_and_max_of_int64) {
  const Tensor x = f64({1, 5, 5, 7, 2, 9}, {2, 3});
  const Tensor am = ag::argmax(x, 1);
  BOOST_TEST((am.dtype() == Dtype::Int64));
  BOOST_TEST(int_values(am) == I64({1, 2}), boost::test_tools::per_element());
  const Tensor i = ints({kMax - 10, 4, -3, 8, 0, 5}, {2, 3});
  BOOST_TEST(int_values(ag::sum(ints({1, 2, 3, 4}, {2, 2}), 0)) == I64({4, 6}), boost::test_tools::per_element());
  BOOST_TEST(int_values(ag::sum(ints({kMax - 10, 4}, {2})))[0] == kMax - 6);  // exact: no trip through double
  BOOST_TEST(int_values(ag::max(i))[0] == kMax - 10);
  BOOST_TEST(int_values(ag::max(i, 0)) == I64({kMax - 10, 4, 5}), boost::test_tools::per_element());
  BOOST_TEST(int_values(ag::argmax(i, 1)) == I64({0, 0}), boost::test_tools::per_element());
  check_throws<std::invalid_argument>([&] { ag::mean(i); }, {"mean: needs a Float32 or Float64 tensor, got Int64 (shape [2, 3])"});
}

BOOST_AUTO_TEST_CASE(shape_ops_move_int64_values) {
  const Tensor i = ints({0, 1, 2, 3, 4, 5}, {2, 3});
  const Tensor f = i.to(Dtype::Float64);
  // each shape op gives the same values on the Int64 tensor and on its float copy
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> ops = {
      {"reshape", [](const Tensor& t) { return ag::reshape(t, {3, 2}); }},
      {"transpose", [](const Tensor& t) { return ag::transpose(t, 0, 1); }},
      {"permute", [](const Tensor& t) { return ag::permute(t, {1, 0}); }},
      {"expand", [](const Tensor& t) { return ag::expand(ag::unsqueeze(t, 0), {2, 2, 3}); }},
      {"slice", [](const Tensor& t) { return ag::slice(t, 1, 0, 3, 2); }},
      {"narrow", [](const Tensor& t) { return ag::narrow(t, 1, 1, 2); }},
      {"cat", [](const Tensor& t) { return ag::cat({t, t}, 1); }},
      {"stack", [](const Tensor& t) { return ag::stack({t, t}, 0); }},
      {"split", [](const Tensor& t) { return ag::split(t, 1, 1)[2]; }},
      {"squeeze", [](const Tensor& t) { return ag::squeeze(ag::unsqueeze(t, 1)); }},
      {"flatten", [](const Tensor& t) { return ag::flatten(t); }},
      {"index_select", [](const Tensor& t) { return ag::index_select(t, 1, I64{2, 0}); }},
      {"gather", [](const Tensor& t) { return ag::gather(t, 1, ints({2, 2, 0, 1}, {2, 2})); }},
  };
  for (const auto& [name, op] : ops) {
    const Tensor a = op(i), b = op(f);
    BOOST_TEST((a.dtype() == Dtype::Int64), name);
    BOOST_TEST(ag::shape_str(a.shape()) == ag::shape_str(b.shape()), name);
    BOOST_TEST(a.to_vector() == b.to_vector(), name);
  }
  check_throws<std::invalid_argument>([&] { ag::cat({i, f}, 0); }, {"cat: "});
}

// ---------------------------------------------------------------- the ops that need floats

BOOST_AUTO_TEST_CASE(floating_point_ops_reject_int64_naming_themselves) {
  const Tensor i = ints({1, 2, 3, 4}, {2, 2});
  const Tensor f = ag::ones({2, 2});
  const std::string needs =
      "needs a Float32 or Float64 tensor, got Int64 (shape [2, 2]); convert with .to(Dtype::Float32)";
  ag::Generator gen(3);
  const std::vector<std::pair<std::string, std::function<void()>>> cases = {
      {"add: first argument " + needs, [&] { ag::add(i, i); }},
      {"sub: second argument " + needs, [&] { ag::sub(f, i); }},
      {"mul: first argument " + needs, [&] { ag::mul(i, f); }},
      {"div: first argument " + needs, [&] { (void)(i / i); }},
      {"pow: first argument " + needs, [&] { ag::pow(i, i); }},
      {"maximum: first argument " + needs, [&] { ag::maximum(i, i); }},
      {"minimum: first argument " + needs, [&] { ag::minimum(i, i); }},
      {"add: argument " + needs, [&] { (void)(i + 1.0); }},
      {"sub: argument " + needs, [&] { (void)(i - 1.0); }},
      {"rsub: argument " + needs, [&] { (void)(1.0 - i); }},
      {"mul: argument " + needs, [&] { (void)(i * 2.0); }},
      {"div: argument " + needs, [&] { (void)(i / 2.0); }},
      {"rdiv: argument " + needs, [&] { (void)(2.0 / i); }},
      {"pow: argument " + needs, [&] { ag::pow(i, 2.0); }},
      {"where: second argument " + needs, [&] { ag::where(f, i, i); }},
      {"where: third argument " + needs, [&] { ag::where(f, f, i); }},
      {"mean: " + needs, [&] { ag::mean(i, 0); }},
      {"matmul: the first argument " + needs, [&] { ag::matmul(i, f); }},
      {"matmul: the second argument " + needs, [&] { ag::matmul(f, i); }},
      {"linear: input " + needs, [&] { ag::linear(i, f); }},
      {"linear: weight " + needs, [&] { ag::linear(f, i); }},
      {"linear_cat: input " + needs, [&] { const Tensor w[] = {f}; ag::linear_cat(i, w); }},
      {"dropout: " + needs, [&] { ag::dropout(i, 0.5, true, gen); }},
      {"dropout: " + needs, [&] { ag::dropout(i, 0.5, false, gen); }},
      {"embedding: the weight " + needs, [&] { ag::embedding(i, ints({0}, {1})); }},
      {"cross_entropy: logits " + needs, [&] { ag::cross_entropy(i, ints({0, 1}, {2})); }},
      {"cross_entropy: logits " + needs, [&] { ag::cross_entropy(i, I64{0, 1}); }},
      {"add_: " + needs, [&] { ag::zeros({2, 2}, Dtype::Int64).add_(i); }},
      {"mul_: " + needs, [&] { ag::zeros({2, 2}, Dtype::Int64).mul_(2.0); }},
  };
  for (const auto& [expected, f_] : cases) {
    const std::string msg = error_of(f_, "(no error)");
    BOOST_TEST(msg == expected);
  }
}

BOOST_AUTO_TEST_CASE(ops_in_other_files_reject_int64_through_dispatch) {
  // these ops check no dtype of their own yet: the dispatch refuses to run a float kernel on
  // integers, so they throw rather than read integers as floats
  const Tensor i = ints({1, 2, 3, 4}, {2, 2});
  const std::vector<std::function<void()>> cases = {
      [&] { ag::exp(i); },         [&] { ag::neg(i); },         [&] { ag::relu(i); },
      [&] { ag::softmax(i, 1); },  [&] { ag::log_softmax(i, 1); },
      [&] { ag::layer_norm(i, {2}); },
  };
  for (const auto& f : cases) BOOST_TEST(contains(error_of(f, "(no error)"), "Int64"));
  BOOST_TEST(error_of([] { ag::dispatch(Dtype::Int64, [](auto) { return 0; }); }) ==
             "dispatch: a floating-point kernel was asked to run on Int64 data (convert with .to(Dtype::Float32))");
}
