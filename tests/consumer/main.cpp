// Uses only the installed headers and their public names, as an outside program would.
#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

namespace ag = autograd;

int main() {
  ag::Tensor a = ag::tensor({1, 2, 3, 4, 5, 6}, {2, 3}, ag::Dtype::Float64);
  a.requires_grad_(true);
  ag::Tensor loss = ag::sum(a * a + a);
  loss.backward();
  const auto g = a.grad().to_vector();  // 2a + 1
  if (g[5] != 13.0) return 1;
  auto result = ag::gradcheck([](const std::vector<ag::Tensor>& in) { return ag::sum(in[0] * in[0]); }, {a});
  if (!result.ok) return 2;
  fmt::print("consumer: loss {} grad[5] {} gradcheck ok\n", loss.item(), g[5]);
  return 0;
}
