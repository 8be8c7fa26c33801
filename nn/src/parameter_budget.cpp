// The bound on the parameters a build from a file's config allocates (parameter_budget.hpp).
#include "parameter_budget.hpp"

#include <limits>
#include <utility>

#include "names.hpp"
#include "nn/checkpoint.hpp"

namespace nn::detail {

namespace {

thread_local ParameterBudget* active = nullptr;

// The element count, or the largest int64 when it does not fit.
std::int64_t elements_of(const autograd::Shape& shape) {
  std::int64_t n = 1;
  for (const std::int64_t d : shape) {
    if (d <= 0) return 0;
    if (n > std::numeric_limits<std::int64_t>::max() / d) return std::numeric_limits<std::int64_t>::max();
    n *= d;
  }
  return n;
}

}  // namespace

ParameterBudget::ParameterBudget(std::int64_t elements) : limit_(elements), previous_(active) {
  active = this;
}

ParameterBudget::~ParameterBudget() { active = previous_; }

BuildScope::BuildScope(std::string name, std::string type) : budget_(active) {
  if (budget_) budget_->nodes_.push_back({std::move(name), std::move(type)});
}

BuildScope::~BuildScope() {
  if (budget_) budget_->nodes_.pop_back();
}

void claim_parameter(std::string_view layer, std::string_view name, const autograd::Shape& shape) {
  ParameterBudget* budget = active;
  if (budget == nullptr) return;
  const std::int64_t n = elements_of(shape);
  if (n <= budget->limit_ - budget->used_) {
    budget->used_ += n;
    return;
  }
  std::string path;
  std::string type = "?";
  for (const auto& node : budget->nodes_) {
    if (!node.name.empty()) path += (path.empty() ? "" : ".") + node.name;
    if (!node.type.empty()) type = node.type;
  }
  const std::string module = path.empty() ? "the root module" : "module " + quote_name(path);
  throw CheckpointError(fmt::format(
      "the config asks for more parameters than the file's tensors hold ({} element{} in all): {} ({}) "
      "needs {} parameter {} of shape {} ({} elements{}); nothing was built",
      budget->limit_, budget->limit_ == 1 ? "" : "s", module, printable_text(type), layer, quote_name(name), ag::shape_str(shape),
      n, budget->used_ > 0 ? fmt::format(", after {} for the parameters before it", budget->used_) : ""));
}

}  // namespace nn::detail
