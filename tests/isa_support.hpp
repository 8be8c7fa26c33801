#pragma once
// The instruction-set variants in the ISA tests: which ones set_kernel_isa accepts on this CPU,
// and a scope that sets one and restores the previous variant.
#include <stdexcept>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

namespace test_support {

// The variants set_kernel_isa accepts here, lowest first.
inline std::vector<std::string> available_isas() {
  const std::string before(autograd::kernel_isa());
  std::vector<std::string> out;
  for (const char* isa : {"generic", "avx2", "avx512"}) {
    try {
      autograd::set_kernel_isa(isa);
      out.emplace_back(isa);
    } catch (const std::invalid_argument&) {
    }
  }
  autograd::set_kernel_isa(before);
  return out;
}

// Sets the variant for a scope and restores the previous one.
struct IsaScope {
  std::string previous{autograd::kernel_isa()};
  explicit IsaScope(const std::string& isa) { autograd::set_kernel_isa(isa); }
  ~IsaScope() { autograd::set_kernel_isa(previous); }
  IsaScope(const IsaScope&) = delete;
  IsaScope& operator=(const IsaScope&) = delete;
};

}  // namespace test_support
