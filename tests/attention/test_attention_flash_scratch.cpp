// The tiled core's per-thread copies of a slice's operands are kept from call to call (a warm
// step allocates nothing), but only up to kKeptScratchBytes: after a call on slices larger than
// that, each thread frees them, so one long call does not pin gigabytes for the process's life.
#define BOOST_TEST_MODULE attention_flash_scratch
#include <boost/test/unit_test.hpp>

#include <cstdint>

#include <autograd/autograd.hpp>

#include "../autograd/src/kernels/attention_flash.hpp"  // the per-thread operand copies, inspected

namespace ag = autograd;

namespace {

// Bytes of the calling thread's float32 operand copies.
std::size_t held_bytes() {
  const auto& o = ag::sdpa::thread_operands<float>();
  return (o.q.capacity() + o.k.capacity() + o.kt.capacity() + o.v.capacity() + o.vt.capacity() +
          o.dout.capacity()) *
         sizeof(float);
}

// One tiled forward and backward of T queries over S keys, d = 64, on the calling thread alone.
void step(std::int64_t T, std::int64_t S) {
  ag::Generator g(1);
  ag::Tensor q = ag::randn({1, 1, T, 64}, ag::Dtype::Float32, g).requires_grad_();
  const ag::Tensor k = ag::randn({1, 1, S, 64}, ag::Dtype::Float32, g);
  const ag::Tensor out = ag::scaled_dot_product_attention(q, k, k, {.need_weights = false}).output;
  ag::sum(out).backward();
}

}  // namespace

BOOST_AUTO_TEST_CASE(small_slices_are_kept_and_large_ones_freed_after_the_call) {
  ag::set_num_threads(1);
  step(1024, 1024);  // 4 MiB of copies: kept for the next call
  BOOST_TEST(held_bytes() > 0u);
  BOOST_TEST(held_bytes() <= ag::sdpa::kKeptScratchBytes);
  step(64, std::int64_t{1} << 17);  // k, kᵀ, v and vᵀ of 2^17 keys: 128 MiB, freed after the call
  BOOST_TEST(held_bytes() == 0u);
  step(1024, 1024);  // and the next small call keeps its copies again
  BOOST_TEST(held_bytes() > 0u);
}
