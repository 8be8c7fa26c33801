// Uses only the installed headers and their public names, as an outside program would, and
// Eigen itself, as many do: its inline code here and in the library must be compiled alike (an
// AVX-512 library and a program without the flag once crashed freeing each other's matrices).
#include <Eigen/Dense>
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
  // An SVD here, then one inside the library (FactoredMatrix), both of dynamic Eigen matrices.
  Eigen::MatrixXd m = Eigen::MatrixXd::Random(6, 5);
  Eigen::JacobiSVD<Eigen::MatrixXd> own(m, Eigen::ComputeThinU | Eigen::ComputeThinV);
  ag::Generator gen(3);
  const nn::circuits::FactoredMatrix fm(ag::randn({6, 4}, ag::Dtype::Float64, gen), ag::randn({4, 5}, ag::Dtype::Float64, gen));
  const double s0 = fm.singular_values().to_vector()[0];
  if (!(s0 > 0) || !(own.singularValues()(0) > 0)) return 3;
  fmt::print("consumer: loss {} grad[5] {} gradcheck ok, singular values {:.3f} and {:.3f}\n", loss.item(), g[5],
             own.singularValues()(0), s0);
  return 0;
}
