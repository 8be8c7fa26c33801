// The tiled attention core's gradients on their own: gradcheck (float64, central differences)
// at small tiles, so that every tile boundary is crossed; a negative control the same checker
// must reject; second derivatives (gradgradcheck, the create_graph backward); and results with
// the same bits at 1, 2 and 3 threads.
#define BOOST_TEST_MODULE attention_flash_grad
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <vector>

#include <autograd/autograd.hpp>

#include "test_attention_flash_support.hpp"
#include "test_support.hpp"

using namespace test_support::prelude;
using namespace flash_test;

namespace {

// The op's output on `in`, flattened, on the tiled core.
ag::GradcheckFn tiled_fn(const Case& c) {
  return [c](const std::vector<Tensor>& in) {
    const ag::SdpaResult r = call(c, in, false);
    BOOST_REQUIRE(!r.weights.defined());
    return ag::reshape(r.output, {-1});
  };
}

// A mask of random finite values (gradcheck perturbs it; -inf entries would not move).
Tensor finite_mask(const ag::Shape& shape, std::uint64_t seed) {
  ag::Generator gen(seed);
  return ag::randn(shape, F64, gen);
}

// A (B, 1, 1, S) key padding mask: -inf on the last `pad` keys of batch 0.
Tensor padding(std::int64_t B, std::int64_t S, std::int64_t pad) {
  std::vector<double> m(static_cast<std::size_t>(B * S), 0.0);
  for (std::int64_t j = S - pad; j < S; ++j) m[static_cast<std::size_t>(j)] = -kInf;
  return ag::tensor(m, {B, 1, 1, S}, F64);
}

void check_grad(const Case& c, std::uint64_t seed) {
  const std::int64_t before = ag::sdpa::tiled_calls();
  const ag::GradcheckResult r = ag::gradcheck(tiled_fn(c), make_inputs(c, seed));
  BOOST_TEST(ag::sdpa::tiled_calls() > before);
  BOOST_TEST(r.ok, fmt::format("{}", r));
}

void check_gradgrad(const Case& c, std::uint64_t seed) {
  const ag::GradcheckResult r = ag::gradgradcheck(tiled_fn(c), make_inputs(c, seed));
  BOOST_TEST(r.ok, fmt::format("{}", r));
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(tiled_gradients, SmallTiles)

BOOST_AUTO_TEST_CASE(gradcheck_masks_and_layouts) {
  check_grad(Case{Layout::HeadsFirst, 2, 2, 5, 7, 3, 2}, 1);
  check_grad(Case{Layout::HeadsFirst, 1, 2, 7, 9, 3, 2, finite_mask({7, 9}, 2), false, true}, 3);
  check_grad(Case{Layout::HeadsFirst, 2, 2, 5, 6, 2, 2, finite_mask({2, 2, 5, 6}, 4), false, true}, 5);
  check_grad(Case{Layout::HeadsLast, 2, 2, 5, 7, 3, 3, finite_mask({2, 1, 1, 7}, 6), false, true}, 7);
  check_grad(Case{Layout::HeadsLast, 2, 2, 5, 7, 3, 3, padding(2, 7, 3), false, false}, 8);
  check_grad(Case{Layout::Packed, 1, 2, 8, 8, 2, 2, Tensor(), true}, 9);
  check_grad(Case{Layout::Packed, 1, 2, 7, 7, 3, 3, finite_mask({2, 7, 7}, 10), true, true}, 11);  // (H, T, S)
  check_grad(Case{Layout::HeadsFirst, 1, 2, 1, 5, 3, 2}, 12);   // T = 1
  check_grad(Case{Layout::HeadsLast, 1, 1, 6, 1, 2, 2}, 13);    // S = 1
}

BOOST_AUTO_TEST_CASE(gradcheck_rejects_a_wrong_gradient) {
  // k read through detach(): the backward sends k no gradient (zero), while perturbing k still
  // moves the output. The checker must see that.
  const Case c{Layout::HeadsFirst, 1, 2, 5, 7, 3, 2};
  const ag::GradcheckFn wrong = [c](const std::vector<Tensor>& in) {
    const ag::SdpaResult r = call(c, {in[0], in[1].detach(), in[2]}, false);
    return ag::reshape(r.output, {-1});
  };
  const ag::GradcheckResult r = ag::gradcheck(wrong, make_inputs(c, 14));
  BOOST_TEST(!r.ok);
  BOOST_TEST(r.worst_input == 1);
}

BOOST_AUTO_TEST_CASE(second_derivatives) {
  check_gradgrad(Case{Layout::HeadsFirst, 1, 2, 5, 7, 2, 2, finite_mask({5, 7}, 15), false, true}, 16);
  check_gradgrad(Case{Layout::HeadsLast, 2, 1, 5, 5, 2, 3, finite_mask({2, 1, 1, 5}, 17), true, true}, 18);
  check_gradgrad(Case{Layout::Packed, 1, 2, 6, 6, 2, 2, Tensor(), true}, 19);
  check_gradgrad(Case{Layout::HeadsLast, 2, 2, 4, 6, 2, 2, padding(2, 6, 2), false, false}, 20);
  // Row 1 sees no key: zero output, zero first and second derivatives.
  const Tensor blocked =
      ag::tensor({0, 0, 0, 0, 0, -kInf, -kInf, -kInf, -kInf, -kInf, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {4, 5}, F64);
  check_gradgrad(Case{Layout::HeadsFirst, 1, 2, 4, 5, 2, 2, blocked, false, false}, 26);
  check_grad(Case{Layout::HeadsFirst, 1, 2, 4, 5, 2, 2, blocked, false, false}, 27);
}

BOOST_AUTO_TEST_CASE(same_bits_at_any_thread_count) {
  ag::sdpa::flash_tiles().block_q = 8;
  ag::sdpa::flash_tiles().block_k = 16;
  std::vector<Tensor> masks{Tensor(), padding(2, 40, 5), finite_mask({40, 40}, 21), finite_mask({2, 3, 40, 40}, 22),
                            finite_mask({1, 2, 1, 1}, 30)};
  masks[1] = masks[1] + finite_mask({2, 1, 1, 40}, 23);
  for (std::size_t m = 0; m < masks.size(); ++m) {
    for (Layout l : {Layout::HeadsFirst, Layout::HeadsLast, Layout::Packed}) {
      BOOST_TEST_CONTEXT("mask " << m << " layout " << static_cast<int>(l)) {
        // 2 x 3 slices take the one-pass backward unless the mask's gradient is broadcast over
        // b or h; 1 x 2 slices the one pass at 1 and 2 threads, the two passes at 3 (a mask
        // constant over each slice: always the two passes).
        const std::int64_t B = m == 2 || m == 4 ? 1 : 2, H = m == 2 || m == 4 ? 2 : 3;
        const Tensor mask = m == 3 ? finite_mask({B, H, 40, 40}, 22) : masks[m];
        const std::int64_t dh = B == 1 ? 16 : 8;  // enough work for the threads either way
        const Case c{l, B, H, 40, 40, dh, dh, mask, m % 2 == 0, mask.defined()};
        const std::vector<Tensor> in = make_inputs(c, 24);
        const Tensor r = readout(c, 25);
        std::vector<std::vector<std::uint64_t>> first;
        for (int threads : {1, 2, 3}) {
          test_support::ThreadCount tc(threads);
          const Run run_n = run(c, in, r, false);
          std::vector<std::vector<std::uint64_t>> now{bits(run_n.output)};
          for (const Tensor& g : run_n.grads) now.push_back(bits(g));
          if (first.empty()) {
            first = now;
          } else {
            for (std::size_t i = 0; i < now.size(); ++i)
              BOOST_TEST((now[i] == first[i]), "result " << i << " differs at " << threads << " threads");
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(one_pass_and_two_passes_give_the_same_bits) {
  // At two threads four heads at once take the one-pass backward; each head alone the two passes.
  test_support::ThreadCount two(2);
  const Case all{Layout::HeadsFirst, 1, 4, 13, 11, 3, 2};
  const std::vector<Tensor> in = make_inputs(all, 28);
  const Tensor r = readout(all, 29);
  const Run joint = run(all, in, r, false);
  const Case one{Layout::HeadsFirst, 1, 1, 13, 11, 3, 2};
  for (std::int64_t h = 0; h < 4; ++h) {
    std::vector<Tensor> in_h;
    for (const Tensor& t : in) in_h.push_back(ag::narrow(t.detach(), 1, h, 1).clone().requires_grad_(true));
    const Run alone = run(one, in_h, ag::narrow(r, 1, h, 1).clone(), false);
    BOOST_TEST((bits(alone.output) == bits(ag::narrow(joint.output, 1, h, 1).clone())), "output, head " << h);
    for (std::size_t i = 0; i < 3; ++i)
      BOOST_TEST((bits(alone.grads[i]) == bits(ag::narrow(joint.grads[i], 1, h, 1).clone())),
                 "input " << i << ", head " << h);
  }
}

BOOST_AUTO_TEST_SUITE_END()
