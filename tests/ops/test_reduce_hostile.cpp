// Float32 sums over outer dims with the last dim kept (the column sums of the elementwise
// kernels), rank 3 and 4, reduced groups in several places, size-one and zero-size dims, NaN,
// infinities and denormals: each result is the float sum of its terms added in row-major order,
// bit for bit, under every instruction-set variant and at 1, 2 and 3 threads.
#define BOOST_TEST_MODULE reduce_hostile
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "isa_support.hpp"

namespace ag = autograd;

namespace {

using test_support::available_isas;

struct Case {
  ag::Shape shape;
  std::vector<std::int64_t> dims;
};
const Case kCases[] = {{{37, 53}, {0}},          {{5, 37, 53}, {1}},        {{5, 37, 53}, {0, 1}},
                       {{4, 3, 7, 33}, {0, 2}},  {{4, 3, 7, 33}, {1}},      {{4, 1, 7, 17}, {0, 1, 2}},
                       {{0, 5}, {0}},            {{3, 0, 5}, {1}},          {{2000, 129}, {0}},
                       {{3, 700, 700}, {1}},     {{1, 1, 1, 16}, {0, 1, 2}}, {{700, 2, 3}, {0}}};

}  // namespace

BOOST_AUTO_TEST_CASE(outer_sums_give_the_bits_of_the_terms_added_in_order) {
  for (const std::string& isa : available_isas()) {
    ag::set_kernel_isa(isa);
    for (int threads : {1, 2, 3}) {
      ag::set_num_threads(threads);
      for (const Case& c : kCases) {
        const std::int64_t n = ag::shape_numel(c.shape);
        ag::Generator gen(static_cast<std::uint64_t>(n) + 1);
        std::vector<double> vd = ag::randn({n}, ag::Dtype::Float64, gen).to_vector();
        const double odd[] = {std::nan(""), INFINITY, -INFINITY, 1e-40, -2e-39, -0.0};
        for (std::size_t k = 0; k < 6 && k < vd.size(); ++k) vd[(k * 101 + 7) % vd.size()] = odd[k];
        std::vector<float> v(vd.begin(), vd.end());
        const ag::Tensor x = ag::tensor(std::vector<double>(v.begin(), v.end()), c.shape, ag::Dtype::Float32);
        const std::vector<double> got = ag::sum(x, c.dims).to_vector();
        // reference: walk the input in row-major order, adding each element to its output slot
        std::vector<bool> red(c.shape.size(), false);
        for (std::int64_t d : c.dims) red[static_cast<std::size_t>(d)] = true;
        std::int64_t out_n = 1;
        for (std::size_t d = 0; d < c.shape.size(); ++d) out_n *= red[d] ? 1 : c.shape[d];
        std::vector<float> want(static_cast<std::size_t>(out_n), 0.0f);
        std::vector<std::int64_t> idx(c.shape.size(), 0);
        for (std::int64_t i = 0; i < n; ++i) {
          std::int64_t o = 0;
          for (std::size_t d = 0; d < c.shape.size(); ++d)
            if (!red[d]) o = o * c.shape[d] + idx[d];
          want[static_cast<std::size_t>(o)] += v[static_cast<std::size_t>(i)];
          for (std::size_t d = c.shape.size(); d-- > 0;) {
            if (++idx[d] < c.shape[d]) break;
            idx[d] = 0;
          }
        }
        std::size_t bad = got.size() == want.size() ? 0 : 1000000;
        for (std::size_t i = 0; bad < 1000000 && i < want.size(); ++i) {
          const float g = static_cast<float>(got[i]);
          const bool ok = (std::isnan(g) && std::isnan(want[i])) || std::memcmp(&g, &want[i], sizeof g) == 0;
          bad += ok ? 0 : 1;
        }
        BOOST_TEST(bad == 0u, isa << " threads " << threads << " " << ag::shape_str(c.shape) << " dims "
                                  << c.dims.size() << " first " << c.dims[0]);
      }
    }
  }
  ag::set_num_threads(2);
}
