// Every optimizer given the named_parameters() of a model that holds an Int64 parameter (a
// counter registered with requires_grad = false, inside a child module) refuses it at
// construction with a message naming the optimizer, the parameter's index, dotted name, dtype and
// shape, and what to do; given parameters() alone it names the index. A frozen floating
// parameter is accepted (and skipped by step, as in PyTorch).
#define BOOST_TEST_MODULE optim_int64_names
#include "test_support.hpp"

#include <memory>
#include <string>

#include <nn/nn.hpp>

using namespace test_support::prelude;

namespace {

struct Counter : nn::Module {
  Counter() : nn::Module("Counter") {
    steps = register_parameter("steps", ag::zeros({2}, Dtype::Int64), /*requires_grad=*/false);
  }
  Tensor steps;
};

struct Model : nn::Module {
  Model() : nn::Module("Model") {
    fc = register_module("fc", std::make_shared<nn::Linear>(3, 2));
    counter = register_module("counter", std::make_shared<Counter>());
  }
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<Counter> counter;
};

std::string tail() { return "; an optimizer takes Float32 or Float64 parameters only (leave Int64 ones out)"; }

}  // namespace

BOOST_AUTO_TEST_CASE(each_optimizer_names_itself_the_parameter_and_its_dtype) {
  const Model m;
  BOOST_TEST(error_of([&] { nn::SGD(m.named_parameters(), {.lr = 0.1}); }) ==
             "SGD: parameter 2 ('counter.steps') is Int64 [2]" + tail());
  BOOST_TEST(error_of([&] { nn::Adam(m.named_parameters()); }) ==
             "Adam: parameter 2 ('counter.steps') is Int64 [2]" + tail());
  BOOST_TEST(error_of([&] { nn::AdamW(m.named_parameters()); }) ==
             "AdamW: parameter 2 ('counter.steps') is Int64 [2]" + tail());
  // without names, the index
  BOOST_TEST(error_of([&] { nn::AdamW(m.parameters()); }) == "AdamW: parameter 2 is Int64 [2]" + tail());
}

BOOST_AUTO_TEST_CASE(the_floating_parameters_alone_are_accepted_frozen_ones_included) {
  Model m;
  nn::NamedTensors floating;
  for (const auto& [name, t] : m.named_parameters())
    if (ag::is_floating(t.dtype())) floating.emplace_back(name, t);
  m.fc->bias().requires_grad_(false);  // frozen: accepted, never updated
  nn::AdamW opt(floating, {.lr = 0.1});
  BOOST_TEST(opt.param_names() == std::vector<std::string>({"fc.weight", "fc.bias"}), boost::test_tools::per_element());
  const std::vector<double> bias = m.fc->bias().to_vector();
  ag::sum(m.fc->forward(ag::ones({1, 3}))).backward();
  opt.step();
  BOOST_TEST(m.fc->bias().to_vector() == bias, boost::test_tools::per_element());
}
