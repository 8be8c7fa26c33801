// nn::Linear (the seed's y = x · W + b, W stored in x out) and nn::init.
#define BOOST_TEST_MODULE linear
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <string>

#include <nn/nn.hpp>

namespace ag = autograd;

namespace {

void set(const ag::Tensor& param, const std::vector<double>& values) {
  ag::NoGradGuard no_grad;
  ag::Tensor p = param;
  p.copy_(ag::tensor(values, param.shape(), param.dtype()));
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) BOOST_TEST(std::abs(got[i] - want[i]) <= tol, "element " << i << ": " << got[i] << " vs " << want[i]);
}

}  // namespace

BOOST_AUTO_TEST_CASE(weight_is_stored_in_by_out_and_named_weight_bias) {
  nn::Linear lin(3, 2);
  auto named = lin.named_parameters();
  BOOST_REQUIRE_EQUAL(named.size(), 2u);
  BOOST_TEST(named[0].first == "weight");
  BOOST_TEST(named[1].first == "bias");
  BOOST_TEST((named[0].second.shape() == ag::Shape{3, 2}));
  BOOST_TEST((named[1].second.shape() == ag::Shape{2}));
  BOOST_TEST(lin.num_parameters() == 8);
  BOOST_TEST(named[0].second.requires_grad());
}

BOOST_AUTO_TEST_CASE(without_bias_there_is_only_the_weight) {
  nn::Linear lin(3, 2, /*bias=*/false);
  BOOST_TEST(lin.named_parameters().size() == 1u);
  BOOST_TEST(!lin.bias().defined());
  BOOST_TEST(lin.num_parameters() == 6);
}

BOOST_AUTO_TEST_CASE(forward_is_x_times_W_plus_b) {
  nn::Linear lin(nn::LinearOptions{3, 2, true, ag::Dtype::Float64});
  set(lin.weight(), {1, 2,    // W (3 x 2): row i is what input i adds to each output
                     3, 4,
                     5, 6});
  set(lin.bias(), {0.5, -1});
  ag::Tensor x = ag::tensor({1, 0, 2, -1, 1, 1}, {2, 3}, ag::Dtype::Float64);
  ag::Tensor y = lin(x);
  BOOST_TEST((y.shape() == ag::Shape{2, 2}));
  // [1,0,2]·W = [1+10, 2+12] = [11, 14];  [-1,1,1]·W = [-1+3+5, -2+4+6] = [7, 8]
  check_close(y.to_vector(), {11.5, 13, 7.5, 7}, 1e-15);
}

BOOST_AUTO_TEST_CASE(leading_dims_are_kept_and_1d_input_works) {
  nn::Linear lin(nn::LinearOptions{4, 3, true, ag::Dtype::Float64});
  ag::Generator gen(7);
  ag::Tensor x = ag::randn({2, 5, 4}, ag::Dtype::Float64, gen);
  ag::Tensor y = lin(x);
  BOOST_TEST((y.shape() == ag::Shape{2, 5, 3}));
  // Row (1, 2) of y equals the 1-D forward of row (1, 2) of x.
  ag::Tensor row = ag::reshape(ag::narrow(ag::narrow(x, 0, 1, 1), 1, 2, 1), {4});
  ag::Tensor y_row = lin(row);
  BOOST_TEST((y_row.shape() == ag::Shape{3}));
  auto all = y.to_vector();
  std::vector<double> want(all.begin() + (5 + 2) * 3, all.begin() + (5 + 2) * 3 + 3);
  check_close(y_row.to_vector(), want, 1e-14);
}

BOOST_AUTO_TEST_CASE(wrong_input_width_throws_naming_the_shape) {
  nn::Linear lin(3, 2);
  ag::Tensor x = ag::zeros({2, 4});
  BOOST_CHECK_EXCEPTION(lin(x), std::invalid_argument, [](const std::invalid_argument& e) {
    std::string m = e.what();
    return m.find("Linear") != std::string::npos && m.find("[2, 4]") != std::string::npos;
  });
  BOOST_CHECK_THROW(lin(ag::zeros({2, 3}, ag::Dtype::Float64)), std::invalid_argument);  // dtype differs
  BOOST_CHECK_THROW(nn::Linear(0, 2), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(a_weight_too_large_to_count_throws_naming_its_shape) {
  // 2^31 x 2^31 float32 weights are 2^64 bytes: the byte count would wrap to 0.
  const std::int64_t n = std::int64_t{1} << 31;
  BOOST_CHECK_EXCEPTION(nn::Linear(n, n), std::invalid_argument, [](const std::invalid_argument& e) {
    const std::string m = e.what();
    return m.find("Linear") != std::string::npos && m.find("[2147483648, 2147483648]") != std::string::npos;
  });
}

BOOST_AUTO_TEST_CASE(gradcheck_through_input_weight_and_bias) {
  ag::Generator gen(3);
  nn::Linear lin(nn::LinearOptions{4, 3, true, ag::Dtype::Float64}, gen);
  ag::Tensor x = ag::randn({2, 2, 4}, ag::Dtype::Float64, gen).requires_grad_();
  auto r = ag::gradcheck([&](const std::vector<ag::Tensor>& in) { return lin(in[0]); },
                         {x, lin.weight(), lin.bias()});
  BOOST_TEST(r.ok, fmt::format("{}", r));
  BOOST_TEST(r.elements_checked == 12 * (16 + 12 + 3));  // every Jacobian entry: 12 outputs x 31 inputs
}

BOOST_AUTO_TEST_CASE(init_is_uniform_within_one_over_sqrt_fan_in) {
  ag::Generator gen(11);
  nn::Linear lin(nn::LinearOptions{16, 8, true, ag::Dtype::Float64}, gen);
  const double bound = 1.0 / std::sqrt(16.0);
  double max_abs = 0;
  for (double v : lin.weight().to_vector()) max_abs = std::max(max_abs, std::abs(v));
  for (double v : lin.bias().to_vector()) max_abs = std::max(max_abs, std::abs(v));
  BOOST_TEST(max_abs <= bound);
  BOOST_TEST(max_abs > 0.8 * bound);  // 136 draws from U(-b, b) reach past 0.8·b
}

BOOST_AUTO_TEST_CASE(same_seed_same_parameters_other_seed_other_parameters) {
  ag::Generator g1(42), g2(42), g3(43);
  nn::Linear a(nn::LinearOptions{5, 4}, g1), b(nn::LinearOptions{5, 4}, g2), c(nn::LinearOptions{5, 4}, g3);
  BOOST_TEST(a.weight().to_vector() == b.weight().to_vector());
  BOOST_TEST(a.bias().to_vector() == b.bias().to_vector());
  BOOST_TEST(a.weight().to_vector() != c.weight().to_vector());
}

BOOST_AUTO_TEST_CASE(module_prints_as_a_tree_with_shapes) {
  nn::Linear lin(3, 2);
  const std::string s = fmt::format("{}", lin);
  BOOST_TEST(s.find("Linear(in_features=3, out_features=2, bias=true)") != std::string::npos, s);
  BOOST_TEST(s.find("[8 parameters]") != std::string::npos, s);
  BOOST_TEST(s.find("weight [3, 2]") != std::string::npos, s);
}

BOOST_AUTO_TEST_CASE(fans_follow_the_in_by_out_layout) {
  BOOST_TEST(nn::init::fans({3, 5}).first == 3);
  BOOST_TEST(nn::init::fans({3, 5}).second == 5);
  BOOST_TEST(nn::init::fans({7}).first == 7);
  BOOST_TEST(nn::init::fans({2, 3, 4}).first == 8);
  BOOST_TEST(nn::init::fans({2, 3, 4}).second == 12);
  BOOST_CHECK_THROW(nn::init::fans({}), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(xavier_uniform_bound_and_xavier_normal_spread) {
  ag::Generator gen(5);
  ag::Tensor w = ag::zeros({60, 40}, ag::Dtype::Float64);
  nn::init::xavier_uniform_(w, gen);
  const double a = std::sqrt(6.0 / 100.0);
  double max_abs = 0, sum_sq = 0;
  for (double v : w.to_vector()) max_abs = std::max(max_abs, std::abs(v));
  BOOST_TEST(max_abs <= a);
  BOOST_TEST(max_abs > 0.99 * a);
  nn::init::xavier_normal_(w, gen, 2.0);
  for (double v : w.to_vector()) sum_sq += v * v;
  const double std_want = 2.0 * std::sqrt(2.0 / 100.0);
  const double std_got = std::sqrt(sum_sq / 2400.0);
  BOOST_TEST(std::abs(std_got / std_want - 1.0) < 0.05);  // 2400 draws: about 1.4% standard error
}

BOOST_AUTO_TEST_CASE(kaiming_uniform_uses_the_gain_of_the_nonlinearity) {
  ag::Generator gen(9);
  ag::Tensor w = ag::zeros({50, 30}, ag::Dtype::Float64);
  nn::init::kaiming_uniform_(w, gen, 0.0, nn::init::FanMode::FanIn, nn::init::Nonlinearity::Relu);
  const double bound = std::sqrt(2.0) * std::sqrt(3.0 / 50.0);
  double max_abs = 0;
  for (double v : w.to_vector()) max_abs = std::max(max_abs, std::abs(v));
  BOOST_TEST(max_abs <= bound);
  BOOST_TEST(max_abs > 0.99 * bound);
  BOOST_TEST(nn::init::calculate_gain(nn::init::Nonlinearity::Tanh) == 5.0 / 3.0);
  BOOST_TEST(std::abs(nn::init::calculate_gain(nn::init::Nonlinearity::LeakyRelu, std::sqrt(5.0)) -
                      std::sqrt(1.0 / 3.0)) < 1e-15);
}

BOOST_AUTO_TEST_CASE(init_fills_in_place_keeping_the_handle) {
  nn::Linear lin(4, 4);
  ag::Tensor handle = lin.parameters()[0];
  ag::Generator gen(1);
  nn::init::constant_(lin.weight(), 0.25);
  for (double v : handle.to_vector()) BOOST_TEST(v == 0.25);
  nn::init::normal_(lin.weight(), 0.0, 1.0, gen);
  BOOST_TEST(handle.is_leaf());
  BOOST_TEST(handle.requires_grad());
  BOOST_CHECK_THROW(nn::init::uniform_(lin.weight(), 1.0, 0.0, gen), std::invalid_argument);
}
