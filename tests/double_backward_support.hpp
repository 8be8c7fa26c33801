#pragma once
// Helpers of the double-backward tests: gradgradcheck of an op both as the op nearest the seed and
// inside a chain, with the worst errors kept per op family and printed at the end of the run.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <autograd/autograd.hpp>

namespace double_backward {

namespace ag = autograd;

struct Worst {
  double abs = 0.0, rel = 0.0;
  int checks = 0;
};

inline std::map<std::string, Worst>& worst_by_family() {
  static std::map<std::string, Worst> worst;
  return worst;
}

// gradgradcheck of fn at the inputs (default, tight tolerances); the report on failure.
inline void second_order_ok(const std::string& family, const std::string& what, const ag::GradcheckFn& fn,
                            const std::vector<ag::Tensor>& inputs) {
  const ag::GradcheckResult r = ag::gradgradcheck(fn, inputs);
  BOOST_TEST(r.ok, fmt::format("{}: {}", what, r));
  BOOST_TEST(r.elements_checked > 0, what);
  Worst& w = worst_by_family()[family];
  w.abs = std::max(w.abs, r.max_abs_error);
  w.rel = std::max(w.rel, r.max_rel_error);
  ++w.checks;
  BOOST_TEST_MESSAGE(fmt::format("{}: worst abs error {:.3g}, rel {:.3g}", what, r.max_abs_error, r.max_rel_error));
}

// The inputs that require grad, passed through x·1.25 first: the op then sees tensors made by
// another op (not leaves), as inside a network.
inline std::vector<ag::Tensor> scaled(const std::vector<ag::Tensor>& in) {
  std::vector<ag::Tensor> out;
  for (const auto& t : in) out.push_back(t.defined() && t.requires_grad() ? t * 1.25 : t);
  return out;
}

// op nearest the seed: gradgradcheck(op(x)), whose random grad_outputs seed op's backward directly;
// and in a chain: tanh(y)·y of y = op(1.25·x), so op's backward gets gradients that carry a graph.
// (Inputs are scaled by 1.25, so keep them in the op's domain for that too.)
inline void check_op(const std::string& family, const std::string& what, const ag::GradcheckFn& op,
                     const std::vector<ag::Tensor>& inputs) {
  second_order_ok(family, what + " (op at the seed)", op, inputs);
  second_order_ok(family, what + " (in a chain)",
                  [op](const std::vector<ag::Tensor>& in) {
                    const ag::Tensor y = op(scaled(in));
                    return ag::tanh(y) * y;
                  },
                  inputs);
}

// Prints the worst errors seen per family (run as the last test case of a program).
inline void print_worst(const char* program) {
  for (const auto& [family, w] : worst_by_family())
    std::printf("%s: %-22s %3d gradgradchecks, worst abs error %.3g, worst rel error %.3g\n", program, family.c_str(),
                w.checks, w.abs, w.rel);
}

// Float64 leaf requiring grad: uniform in [lo, hi).
inline ag::Tensor uniform_input(const ag::Shape& shape, double lo, double hi, std::uint64_t seed) {
  ag::Generator gen(seed);
  return ag::uniform(shape, lo, hi, ag::Dtype::Float64, gen).requires_grad_();
}

}  // namespace double_backward
