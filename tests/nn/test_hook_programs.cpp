// Random hook programs on small random graphs, checked against a reference without hooks.
//
// Each program builds a random graph over a leaf x: a shared prefix p = exp(0.5·x) (no hooks),
// then tensors h_0..h_{K-1}, each a random op of earlier ones, and loss = Σ c_i·sum(h_i), so
// that every h_i receives a gradient. A random subset of the h_i gets one hook each:
//   read      records the gradient it sees;
//   replace   records it and returns it times s;
//   nested    runs backward() of an auxiliary graph over x (sharing x's accumulator) or over p
//             (sharing p's interior nodes, with retain_graph), built before the walk or, with
//             grad mode turned on in the hook, inside it.
// The reference builds the same graph on a copy of x without hooks: a replacement becomes an
// identity op whose backward multiplies by s, each auxiliary graph is walked on its own, and
// retain_grad gives the gradient each hook should have seen. Seeded, so every run is the same.
#define BOOST_TEST_MODULE hook_programs
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <random>
#include <vector>

#include <autograd/autograd.hpp>

namespace ag = autograd;
using ag::Dtype;
using ag::Tensor;
using ag::TensorList;

namespace {

// Identity forward; the backward multiplies the gradient by s (a replacing hook, by hand).
struct ScaleGrad : ag::Function<ScaleGrad> {
  static constexpr const char* name = "scale_grad";
  static Tensor forward(ag::FunctionCtx& ctx, const Tensor& t, double s) {
    ctx.saved_data["s"] = s;
    return t * 1.0;
  }
  static TensorList backward(ag::FunctionCtx& ctx, const TensorList& g) { return {g[0] * ctx.saved_data["s"]}; }
};

struct Step {
  int op;      // 0: a·b, 1: a + b, 2: tanh(a), 3: a·c, 4: exp(0.3·a)
  int a, b;    // operands: -2 is x, -1 is p, i >= 0 is h_i
  double c;
};

enum class HookKind { none, read, replace, nested };

struct Hook {
  HookKind kind = HookKind::none;
  double scale = 1.0;     // replace
  bool over_p = false;    // nested: the auxiliary graph starts at p rather than x
  bool inside = false;    // nested: built inside the hook with grad mode on
  double weight = 1.0;    // nested: aux = weight · sum(tanh(base)·base)
};

struct Program {
  std::vector<double> x;
  std::vector<Step> steps;
  std::vector<double> loss_weights;
  std::vector<Hook> hooks;  // one per h_i
};

Program random_program(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<std::uint64_t>(n)); };
  Program p;
  const int n = 1 + pick(3), k = 2 + pick(5);
  for (int i = 0; i < n; ++i) p.x.push_back(uniform(-1.0, 1.0));
  for (int i = 0; i < k; ++i) {
    p.steps.push_back({pick(5), pick(i + 2) - 2, pick(i + 2) - 2, uniform(-1.5, 1.5)});
    p.loss_weights.push_back(uniform(-1.0, 1.0));
    Hook h;
    h.kind = static_cast<HookKind>(pick(4));
    h.scale = uniform(-2.0, 2.0);
    h.over_p = pick(2) == 1;
    h.inside = pick(2) == 1;
    h.weight = uniform(-1.0, 1.0);
    p.hooks.push_back(h);
  }
  return p;
}

Tensor apply_step(const Step& s, const Tensor& a, const Tensor& b) {
  switch (s.op) {
    case 0: return a * b;
    case 1: return a + b;
    case 2: return ag::tanh(a);
    case 3: return a * s.c;
    default: return ag::exp(a * 0.3);
  }
}

Tensor aux_of(const Tensor& base, double weight) { return ag::sum(ag::tanh(base) * base) * weight; }

Tensor prefix(const Tensor& x) { return ag::exp(x * 0.5); }

struct Built {
  Tensor loss;
  std::vector<Tensor> h;  // what the consumers of each h_i use
};

// The graph of a program over x; `scaled` inserts ScaleGrad after each replaced h_i.
Built build(const Program& prog, const Tensor& x, const Tensor& p, bool scaled) {
  Built out;
  auto operand = [&](int i) { return i == -2 ? x : i == -1 ? p : out.h[static_cast<std::size_t>(i)]; };
  for (std::size_t i = 0; i < prog.steps.size(); ++i) {
    Tensor h = apply_step(prog.steps[i], operand(prog.steps[i].a), operand(prog.steps[i].b));
    if (scaled && prog.hooks[i].kind == HookKind::replace) h = ScaleGrad::apply(h, prog.hooks[i].scale);
    out.h.push_back(h);
  }
  out.loss = ag::sum(out.h[0]) * prog.loss_weights[0];
  for (std::size_t i = 1; i < out.h.size(); ++i) out.loss = out.loss + ag::sum(out.h[i]) * prog.loss_weights[i];
  return out;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    BOOST_CHECK_MESSAGE(std::abs(got[i] - want[i]) <= 1e-12 + 1e-10 * std::abs(want[i]),
                        what << "[" << i << "]: " << got[i] << " vs reference " << want[i]);
}

void run_program(std::uint64_t seed) {
  BOOST_TEST_CONTEXT("program " << seed) {
    const Program prog = random_program(seed);
    const auto n = static_cast<std::int64_t>(prog.x.size());
    auto fresh_x = [&] { return ag::tensor(prog.x, {n}, Dtype::Float64).requires_grad_(); };

    // With hooks.
    Tensor x = fresh_x();
    Tensor p = prefix(x);
    Built g = build(prog, x, p, /*scaled=*/false);
    std::vector<Tensor> prebuilt(prog.steps.size());
    std::vector<std::vector<double>> seen(prog.steps.size());
    for (std::size_t i = 0; i < prog.steps.size(); ++i) {
      const Hook hook = prog.hooks[i];
      if (hook.kind == HookKind::none) continue;
      if (hook.kind == HookKind::nested && !hook.inside) prebuilt[i] = aux_of(hook.over_p ? p : x, hook.weight);
      g.h[i].register_hook([&, i, hook](const Tensor& grad) -> Tensor {
        seen[i] = grad.to_vector();
        if (hook.kind == HookKind::replace) return grad * hook.scale;
        if (hook.kind == HookKind::nested) {
          if (hook.inside) {
            ag::EnableGradGuard grad_on;
            aux_of(hook.over_p ? p : x, hook.weight).backward({.retain_graph = hook.over_p});
          } else {
            prebuilt[i].backward({.retain_graph = hook.over_p});
          }
        }
        return Tensor();
      });
    }
    g.loss.backward();

    // Reference: no hooks.
    Tensor xr = fresh_x();
    Built r = build(prog, xr, prefix(xr), /*scaled=*/true);
    for (std::size_t i = 0; i < prog.steps.size(); ++i)
      if (prog.hooks[i].kind != HookKind::none) r.h[i].retain_grad();
    r.loss.backward();
    std::vector<double> expected = xr.grad().to_vector();
    for (std::size_t i = 0; i < prog.steps.size(); ++i) {
      const Hook& hook = prog.hooks[i];
      if (hook.kind == HookKind::none) continue;
      check_close(seen[i], r.h[i].grad().to_vector(), "gradient seen by the hook on h_" + std::to_string(i));
      if (hook.kind != HookKind::nested) continue;
      Tensor xa = fresh_x();
      aux_of(hook.over_p ? prefix(xa) : xa, hook.weight).backward();
      const auto aux = xa.grad().to_vector();
      for (std::size_t k = 0; k < expected.size(); ++k) expected[k] += aux[k];
    }
    check_close(x.grad().to_vector(), expected, "x.grad");
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(random_hook_programs_match_the_reference) {
  for (std::uint64_t seed = 1; seed <= 400; ++seed) run_program(seed);
}

BOOST_AUTO_TEST_CASE(the_reference_tells_a_lost_gradient_apart) {
  // Negative control of the comparison: a replacing hook that the reference does not know of
  // must show as a mismatch, or the property above could not fail.
  const Program prog = random_program(7);
  Tensor x = ag::tensor(prog.x, {static_cast<std::int64_t>(prog.x.size())}, Dtype::Float64).requires_grad_();
  Built g = build(prog, x, prefix(x), false);
  g.h.back().register_hook([](const Tensor& grad) { return grad * 3.0; });
  g.loss.backward();
  Tensor xr = ag::tensor(prog.x, {static_cast<std::int64_t>(prog.x.size())}, Dtype::Float64).requires_grad_();
  Program plain = prog;
  for (auto& h : plain.hooks) h.kind = HookKind::none;
  build(plain, xr, prefix(xr), true).loss.backward();
  const auto got = x.grad().to_vector(), want = xr.grad().to_vector();
  bool differs = false;
  for (std::size_t i = 0; i < got.size(); ++i) differs = differs || std::abs(got[i] - want[i]) > 1e-9;
  BOOST_CHECK(differs);
}
