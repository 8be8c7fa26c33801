// A new op with a hand-written backward, checked with gradcheck.
//
// softplus(x) = log(1 + eˣ), written the stable way: max(x, 0) + log(1 + e^-|x|).
// Its derivative is the logistic sigmoid: d/dx softplus(x) = 1 / (1 + e^-x).
#include <cmath>

#include <autograd/autograd.hpp>

namespace ag = autograd;

struct Softplus : ag::Function<Softplus> {
  static constexpr const char* name = "softplus";

  static ag::Tensor forward(ag::FunctionCtx& ctx, const ag::Tensor& x) {
    ctx.save_for_backward({x});
    return ag::relu(x) + ag::log(1.0 + ag::exp(-ag::abs(x)));
  }

  static ag::TensorList backward(ag::FunctionCtx& ctx, const ag::TensorList& grad_out) {
    const ag::Tensor x = ctx.saved_tensors()[0];
    // y = softplus(x)  =>  dx = dy · sigmoid(x)
    return {grad_out[0] * ag::sigmoid(x)};
  }
};

// The same op with a classic mistake: the derivative of log(1 + eˣ) taken as eˣ.
struct SoftplusWrong : ag::Function<SoftplusWrong> {
  static constexpr const char* name = "softplus_wrong";
  static ag::Tensor forward(ag::FunctionCtx& ctx, const ag::Tensor& x) { return Softplus::forward(ctx, x); }
  static ag::TensorList backward(ag::FunctionCtx& ctx, const ag::TensorList& grad_out) {
    return {grad_out[0] * ag::exp(ctx.saved_tensors()[0])};
  }
};

int main() {
  ag::Generator gen(7);
  ag::Tensor x = ag::randn({2, 3}, ag::Dtype::Float64, gen).requires_grad_();
  x.set_name("x");

  ag::Tensor y = Softplus::apply(x);
  fmt::print("x = {}\n\nsoftplus(x) = {}\n\n", x, y);

  auto good = ag::gradcheck([](const ag::TensorList& in) { return Softplus::apply(in[0]); }, {x});
  fmt::print("softplus with the right backward:\n  {}\n\n", good);

  auto bad = ag::gradcheck([](const ag::TensorList& in) { return SoftplusWrong::apply(in[0]); }, {x});
  fmt::print("softplus with a wrong backward (eˣ instead of sigmoid):\n  {}\n\n", bad);

  ag::Tensor loss = ag::sum(Softplus::apply(x));
  fmt::print("graph of sum(softplus(x)) in Graphviz DOT:\n{}", ag::to_dot(loss));
  return good.ok && !bad.ok ? 0 : 1;
}
