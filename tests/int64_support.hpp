#pragma once
// Int64 tensors in the Int64 tests: ints({1, 2}, {2}) builds one, int_values reads one back.
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <vector>

#include <autograd/autograd.hpp>

namespace test_support {

using I64 = std::vector<std::int64_t>;

inline autograd::Tensor ints(const I64& v, const autograd::Shape& s) { return autograd::tensor(v, s); }

inline I64 int_values(const autograd::Tensor& t) {
  BOOST_REQUIRE(t.dtype() == autograd::Dtype::Int64);
  const std::int64_t* p = t.data<std::int64_t>();
  return I64(p, p + t.numel());
}

}  // namespace test_support
