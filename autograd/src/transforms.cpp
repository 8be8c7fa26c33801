// Function transforms: vjp, jvp (by the ops' forward-mode rules, or the double-vjp construction
// where a node has none), jacobian and hessian, all built on grad() (grad.cpp) over fresh leaves
// that share the inputs' data.
#include "autograd/transforms.hpp"

#include <unistd.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <vector>

#include "autograd/grad_mode.hpp"
#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "forward_mode.hpp"

namespace autograd {

namespace {

std::string label(const char* what, std::size_t i, const Tensor& t) {
  if (t.defined() && !t.name().empty()) return fmt::format("{} {} {}", what, i, quoted(t.name()));
  return fmt::format("{} {}", what, i);
}

// "[2, 3] Float64"
std::string shape_dtype(const Tensor& t) { return fmt::format("{} {}", shape_str(t.shape()), dtype_name(t.dtype())); }

// How many transforms' functions are running on this thread: a transform called inside another's
// function (torch.func's jacfwd(jacrev(f))) is nested, and then its results must stay functions
// of its inputs so the outer transform can differentiate them.
thread_local int transform_depth = 0;

struct InsideFunction {
  InsideFunction() { ++transform_depth; }
  ~InsideFunction() { --transform_depth; }
  InsideFunction(const InsideFunction&) = delete;
  InsideFunction& operator=(const InsideFunction&) = delete;
};

// Nested (inside another transform's function, with an input that carries a gradient): every
// backward is taken with create_graph and the results are left in the graph.
bool nested_call(const TensorList& inputs) {
  if (transform_depth == 0 || !is_grad_enabled()) return false;
  for (const auto& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

// Fresh leaves over the inputs' data, which fn is differentiated at. Nested, an input that
// requires grad gets a differentiable copy instead, so gradients reach it through the copy.
TensorList fresh_leaves(const char* op, const TensorList& inputs, bool nested = false) {
  if (inputs.empty()) fail(op, "no inputs given: nothing to differentiate with respect to");
  TensorList leaves;
  leaves.reserve(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined()) fail(op, "{} is {}", label("input", i, t), undefined_description(t));
    if (!is_floating(t.dtype()))
      fail(op, "{} is {}: only Float32 and Float64 tensors can be differentiated (convert with .to())",
           label("input", i, t), shape_dtype(t));
    Tensor leaf;
    if (nested && t.requires_grad()) {
      leaf = t.clone();
    } else {
      leaf = t.detach();
      leaf.requires_grad_();
    }
    if (!t.name().empty()) leaf.set_name(t.name());
    leaves.push_back(std::move(leaf));
  }
  return leaves;
}

// One vector per tensor of `like` (the inputs for tangents, the outputs for cotangents), each of
// its shape and dtype.
void check_vectors(const char* op, const char* vectors, const char* what, const TensorList& v, const TensorList& like) {
  if (v.size() != like.size())
    fail(op, "{} {}s but {} {} (give one per {}, of its shape and dtype)", like.size(), what, v.size(), vectors, what);
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!v[i].defined()) fail(op, "{}[{}] is {}", vectors, i, undefined_description(v[i]));
    if (v[i].shape() != like[i].shape() || v[i].dtype() != like[i].dtype())
      fail(op, "{}[{}] is {} but {} is {}", vectors, i, shape_dtype(v[i]), label(what, i, like[i]),
           shape_dtype(like[i]));
  }
}

void check_output(const char* op, std::size_t j, const Tensor& y) {
  if (!y.defined()) fail(op, "{} of the function is {}", label("output", j, y), undefined_description(y));
  if (!is_floating(y.dtype()))
    fail(op, "{} of the function is {}: not floating point, so it has no derivative (return Float32 or Float64 "
         "tensors)", label("output", j, y), shape_dtype(y));
}

TensorList call(const char* op, const TensorListFn& fn, const TensorList& leaves) {
  if (!fn) fail(op, "no function given");
  TensorList ys;
  {
    EnableGradGuard grad_on;
    InsideFunction inside;
    ys = fn(leaves);
  }
  if (ys.empty()) fail(op, "the function returned no outputs");
  for (std::size_t j = 0; j < ys.size(); ++j) check_output(op, j, ys[j]);
  return ys;
}

Tensor call_one(const char* op, const GradcheckFn& fn, const TensorList& leaves) {
  if (!fn) fail(op, "no function given");
  Tensor y;
  {
    EnableGradGuard grad_on;
    InsideFunction inside;
    y = fn(leaves);
  }
  check_output(op, 0, y);
  return y;
}

// The node that carries a gradient into t, without making one (null when t has none yet).
const Node* gradient_node(const Tensor& t) {
  if (t.grad_fn()) return t.grad_fn().get();
  return t.impl()->grad_accumulator.lock().get();
}

// fn must compute from its arguments: a result whose graph reaches an input tensor itself (a
// module's parameter read directly, say) would miss that path's part of the derivative (all of it
// when the leaf fn was given is not used), silently. Refused, naming the input.
void check_used_through_arguments(const char* op, const TensorList& outputs, const TensorList& inputs,
                                  const TensorList& leaves) {
  bool any = false;
  for (const auto& t : inputs) any = any || t.requires_grad();
  if (!any) return;
  std::unordered_set<const Node*> seen;
  // The walk stops at the leaves fn was given (nested, they are copies whose graph reaches the inputs).
  for (const auto& leaf : leaves)
    if (const Node* n = gradient_node(leaf)) seen.insert(n);
  std::vector<const Node*> stack;
  for (const auto& y : outputs)
    if (y.requires_grad())
      if (const Node* n = gradient_node(y); n && seen.insert(n).second) stack.push_back(n);
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    for (const auto& e : n->next_edges)
      if (e.valid() && seen.insert(e.node.get()).second) stack.push_back(e.node.get());
  }
  const auto reaches = [&](const Tensor& t) {
    for (const auto& y : outputs)
      if (y.is_same(t)) return true;
    const Node* n = gradient_node(t);
    return n != nullptr && seen.count(n) != 0;
  };
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].requires_grad() && reaches(inputs[i]))
      fail(op, "the function's result depends on {} {} itself, not on the argument it was given for it: fn is "
           "called on fresh leaves that share the inputs' data and must compute from those (a function that "
           "reads a module's parameters directly is not differentiated through them: pass the parameter's value "
           "as the input and use the argument in its place, e.g. with nn::functional's forms of the layer)",
           label("input", i, inputs[i]), shape_str(inputs[i].shape()));
}

// The results as they leave a transform: outside any graph, or kept in it when nested.
TensorList detached(const TensorList& ts, bool nested = false) {
  if (nested) return ts;
  TensorList out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(t.detach());
  return out;
}

Tensor or_zeros(const Tensor& g, const Tensor& like) { return g.defined() ? g : zeros(like.shape(), like.dtype()); }

// grad() for a transform, its failures named by it: with create_graph (the first half of forward
// mode, and every backward of a nested transform) a custom Function whose backward is
// once_differentiable throws, and a function that freed its own graph (by calling backward())
// makes the walk throw.
TensorList transform_grad(const char* op, const TensorList& outputs, const TensorList& inputs, const TensorList& seeds,
                          bool create_graph, bool retain_graph = true) {
  GradOptions o;
  o.grad_outputs = seeds;
  o.create_graph = create_graph;
  o.retain_graph = retain_graph || create_graph;
  o.allow_unused = true;
  try {
    EnableGradGuard grad_on;
    return grad(outputs, inputs, o);
  } catch (const std::runtime_error& e) {
    if (create_graph)
      throw std::runtime_error(fmt::format("{}: differentiating the backward pass (create_graph) failed: {}", op, e.what()));
    throw std::runtime_error(fmt::format("{}: the backward pass through the function failed: {}", op, e.what()));
  }
}

TensorList grad_with_graph(const char* op, const TensorList& outputs, const TensorList& inputs, const TensorList& seeds) {
  return transform_grad(op, outputs, inputs, seeds, true);
}

// A result that shares storage with a tangent or cotangent given (the identity's J·v is v) gets
// storage of its own, so changing the argument later does not change it.
Tensor own(const Tensor& t, const TensorList& given) {
  if (!t.defined()) return t;
  for (const auto& v : given)
    if (v.defined() && v.impl()->storage == t.impl()->storage) return t.requires_grad() ? t.clone() : t.detach().clone();
  return t;
}

// One-hot tensor: 1 at flat index k.
Tensor unit(const Shape& shape, Dtype dtype, std::int64_t k) {
  Tensor e = zeros(shape, dtype);
  dispatch(dtype, [&](auto zero) { e.data<decltype(zero)>()[k] = 1; });
  return e;
}

// dst[offset + n·stride] = src[n] for every element n of src (converted to dst's dtype).
void scatter_into(const Tensor& dst, std::int64_t offset, std::int64_t stride, const Tensor& src) {
  Tensor s = src;
  if (s.dtype() != dst.dtype()) {
    NoGradGuard no_grad;
    s = s.to(dst.dtype());
  }
  dispatch(dst.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* d = dst.data<T>();
    const T* p = s.data<T>();
    const std::int64_t n = s.numel();
    for (std::int64_t i = 0; i < n; ++i) d[offset + i * stride] = p[i];
  });
}

Shape concat(const Shape& a, const Shape& b) {
  Shape s = a;
  for (auto d : b) s.push_back(d);
  return s;
}

Dtype wider(Dtype a, Dtype b) { return a == Dtype::Float64 || b == Dtype::Float64 ? Dtype::Float64 : Dtype::Float32; }

// The machine's physical memory in bytes (0 when the system does not say).
double physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

// "8 TiB", "23.5 GiB", "512 MiB"
std::string byte_size(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) bytes /= 1024, ++u;
  return fmt::format("{:.3g} {}", bytes, units[u]);
}

// A zero tensor of shape lead ++ tail, its size checked first: a dense result larger than the
// machine's memory is refused by name before anything is allocated or computed.
Tensor result_tensor(const char* op, const Shape& lead, const Shape& tail, Dtype dtype, const char* what) {
  const Shape shape = concat(lead, tail);
  std::int64_t numel = 0;
  if (!numel_fits(shape, numel))
    fail(op, "the {} {} has more elements than fit in 64 bits", what, shape_str(shape));
  const double bytes = static_cast<double>(numel) * static_cast<double>(dtype_size(dtype));
  const double memory = physical_memory_bytes();
  if (memory > 0 && bytes > memory)
    fail(op, "the {} {} of {} needs {}, more than this machine's memory ({}); take vjp or jvp "
         "products with the directions wanted instead", what, shape_str(shape), dtype_name(dtype),
         byte_size(bytes), byte_size(memory));
  return zeros(shape, dtype);
}

// Nested: a Jacobian or Hessian assembled from its rows (or columns) with differentiable ops, so
// it stays a function of the inputs. `parts` are stacked along `dim`, converted to dtype and
// reshaped to `shape`; an undefined part (no dependence) is zeros of the shape `like`.
Tensor assemble(TensorList parts, const Shape& like, std::int64_t dim, const Shape& shape, Dtype dtype) {
  if (parts.empty()) return zeros(shape, dtype);
  for (auto& t : parts) {
    if (!t.defined()) t = zeros(like, dtype);
    if (t.dtype() != dtype) t = t.to(dtype);
  }
  return reshape(stack(parts, dim), shape);
}

}  // namespace

VjpResult vjp(const TensorListFn& fn, const TensorList& inputs, const TensorList& cotangents) {
  const bool nested = nested_call(inputs) || nested_call(cotangents);
  const TensorList leaves = fresh_leaves("vjp", inputs, nested);
  const TensorList ys = call("vjp", fn, leaves);
  check_used_through_arguments("vjp", ys, inputs, leaves);
  check_vectors("vjp", "cotangents", "output", cotangents, ys);
  VjpResult r;
  r.outputs = detached(ys, nested);
  TensorList roots, seeds;
  for (std::size_t j = 0; j < ys.size(); ++j)
    if (ys[j].requires_grad()) roots.push_back(ys[j]), seeds.push_back(nested ? cotangents[j] : cotangents[j].detach());
  TensorList g(leaves.size());
  if (!roots.empty()) g = transform_grad("vjp", roots, leaves, seeds, nested, false);
  for (std::size_t i = 0; i < leaves.size(); ++i) r.cotangents.push_back(own(or_zeros(g[i], leaves[i]), cotangents));
  return r;
}

JvpResult jvp(const std::function<TensorList(const TensorList&)>& fn, const TensorList& inputs,
              const TensorList& tangents) {
  const bool nested = nested_call(inputs) || nested_call(tangents);
  const TensorList leaves = fresh_leaves("jvp", inputs, nested);
  check_vectors("jvp", "tangents", "input", tangents, leaves);
  const TensorList ys = call("jvp", fn, leaves);
  check_used_through_arguments("jvp", ys, inputs, leaves);
  JvpResult r;
  r.outputs = detached(ys, nested);
  // The ops' forward-mode rules, where every node between the inputs and the outputs has one
  // (outside another transform: their tangents are computed outside any graph).
  if (!nested) {
    TensorList vs;
    for (const auto& t : tangents) vs.push_back(t.detach());
    if (auto jv = detail::tangents_by_rules(ys, leaves, vs)) {
      for (std::size_t j = 0; j < ys.size(); ++j) {
        Tensor t = (*jv)[j].defined() ? own((*jv)[j], tangents) : zeros(ys[j].shape(), ys[j].dtype());
        for (std::size_t i = 0; i < j; ++i)  // fn returning one tensor twice: two tangents of their own
          if (t.impl()->storage == r.tangents[i].impl()->storage) t = t.clone();
        r.tangents.push_back(std::move(t));
      }
      return r;
    }
  }
  // Otherwise the double-vjp construction. u: a cotangent per output that depends on the
  // inputs; g = Jᵀu, linear in u.
  std::vector<std::size_t> live;
  TensorList roots, us;
  for (std::size_t j = 0; j < ys.size(); ++j) {
    if (!ys[j].requires_grad()) continue;
    live.push_back(j);
    roots.push_back(ys[j]);
    us.push_back(zeros(ys[j].shape(), ys[j].dtype()).requires_grad_());
  }
  TensorList jv(us.size());
  if (!roots.empty()) {
    const TensorList g = grad_with_graph("jvp", roots, leaves, us);
    // J·v = d(Σ_i ⟨g_i(u), v_i⟩)/du, over the gradients that depend on u.
    TensorList gs, vs;
    for (std::size_t i = 0; i < g.size(); ++i)
      if (g[i].defined() && g[i].requires_grad())
        gs.push_back(g[i]), vs.push_back(nested ? tangents[i] : tangents[i].detach());
    if (!gs.empty()) jv = transform_grad("jvp", gs, us, vs, nested, false);
  }
  r.tangents.resize(ys.size());
  for (std::size_t j = 0; j < ys.size(); ++j) r.tangents[j] = zeros(ys[j].shape(), ys[j].dtype());
  for (std::size_t k = 0; k < live.size(); ++k)
    if (jv[k].defined()) r.tangents[live[k]] = own(jv[k], tangents);
  return r;
}

TensorList jacobian(const GradcheckFn& fn, const TensorList& inputs, const JacobianOptions& options) {
  if (options.mode != JacobianMode::Reverse && options.mode != JacobianMode::Forward)
    fail("jacobian", "mode {} is neither JacobianMode::Reverse nor JacobianMode::Forward",
         static_cast<int>(options.mode));
  const bool nested = nested_call(inputs);
  const TensorList leaves = fresh_leaves("jacobian", inputs, nested);
  const Tensor y = call_one("jacobian", fn, leaves);
  check_used_through_arguments("jacobian", {y}, inputs, leaves);
  TensorList J;
  for (const auto& x : leaves)
    J.push_back(result_tensor("jacobian", y.shape(), x.shape(), wider(y.dtype(), x.dtype()), "Jacobian"));
  if (!y.requires_grad()) return J;  // constant in every input
  const std::int64_t M = y.numel();
  // Nested, each backward keeps its graph and the rows (columns) are assembled differentiably.
  const auto backward = [&](const TensorList& outputs, const TensorList& wrt, const Tensor& seed, bool keep) {
    return transform_grad("jacobian", outputs, wrt, {seed}, nested, keep);
  };

  if (options.mode == JacobianMode::Reverse) {
    // Row m: the gradients for a unit cotangent at output element m, all through one graph.
    std::vector<TensorList> rows(leaves.size());
    for (std::int64_t m = 0; m < M; ++m) {
      Tensor seed = unit(y.shape(), y.dtype(), m);
      if (nested) seed.requires_grad_();  // as for the Hessian's seed: a graph cut is refused, not zeros
      const TensorList g = backward({y}, leaves, seed, m + 1 < M);
      for (std::size_t i = 0; i < leaves.size(); ++i) {
        if (nested) rows[i].push_back(g[i]);
        else if (g[i].defined()) scatter_into(J[i], m * leaves[i].numel(), 1, g[i]);
      }
    }
    if (nested)
      for (std::size_t i = 0; i < leaves.size(); ++i)
        J[i] = assemble(rows[i], leaves[i].shape(), 0, J[i].shape(), J[i].dtype());
    return J;
  }

  // Column (i, n): J·e_n by the ops' forward-mode rules where they cover the graph (one walk per
  // column through the graph of the one call of fn), outside another transform.
  if (!nested) {
    bool covered = true;
    for (std::size_t i = 0; covered && i < leaves.size(); ++i) {
      const std::int64_t N = leaves[i].numel();
      TensorList t(leaves.size());
      for (std::int64_t n = 0; n < N; ++n) {
        t[i] = unit(leaves[i].shape(), leaves[i].dtype(), n);
        const std::optional<TensorList> jv = detail::tangents_by_rules({y}, leaves, t);
        if (!jv) {
          covered = false;
          break;
        }
        if ((*jv)[0].defined()) scatter_into(J[i], n, N, (*jv)[0]);
      }
    }
    if (covered) return J;
    for (auto& Ji : J) Ji = zeros(Ji.shape(), Ji.dtype());  // (columns the rules filled before one lacked)
  }
  // Otherwise column (i, n) is J·e_n by the double vjp, every column through the one graph of
  // g(u) = Jᵀu.
  const Tensor u = zeros(y.shape(), y.dtype()).requires_grad_();
  const TensorList g = grad_with_graph("jacobian", {y}, leaves, {u});
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    if (!g[i].defined() || !g[i].requires_grad()) continue;
    const std::int64_t N = leaves[i].numel();
    TensorList columns;
    for (std::int64_t n = 0; n < N; ++n) {
      const Tensor jv = backward({g[i]}, {u}, unit(leaves[i].shape(), leaves[i].dtype(), n), true)[0];
      if (nested) columns.push_back(jv);
      else if (jv.defined()) scatter_into(J[i], n, N, jv);
    }
    if (nested) J[i] = assemble(columns, y.shape(), y.dim(), J[i].shape(), J[i].dtype());
  }
  return J;
}

std::vector<TensorList> hessian(const GradcheckFn& fn, const TensorList& inputs) {
  const bool nested = nested_call(inputs);
  const TensorList leaves = fresh_leaves("hessian", inputs, nested);
  const Tensor y = call_one("hessian", fn, leaves);
  check_used_through_arguments("hessian", {y}, inputs, leaves);
  if (y.numel() != 1)
    fail("hessian", "the function must return one element (a scalar), got shape {}; take the jacobian of a "
         "non-scalar function instead", shape_str(y.shape()));
  std::vector<TensorList> H(leaves.size());
  for (std::size_t i = 0; i < leaves.size(); ++i)
    for (std::size_t j = 0; j < leaves.size(); ++j)
      H[i].push_back(result_tensor("hessian", concat(y.shape(), leaves[i].shape()), leaves[j].shape(),
                                   wider(y.dtype(), wider(leaves[i].dtype(), leaves[j].dtype())), "Hessian"));
  if (!y.requires_grad()) return H;
  // The seed requires grad, so a backward that computes outside the graph (from raw values) is
  // refused by name instead of giving zero rows.
  const TensorList g = grad_with_graph("hessian", {y}, leaves, {ones(y.shape(), y.dtype()).requires_grad_()});
  // Row (i, m): the gradient of g_i[m], one backward through the gradient's graph.
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    if (!g[i].defined() || !g[i].requires_grad()) continue;  // linear in inputs[i]: zero rows
    const std::int64_t N = leaves[i].numel();
    std::vector<TensorList> rows(leaves.size());
    for (std::int64_t m = 0; m < N; ++m) {
      const TensorList h = transform_grad("hessian", {g[i]}, leaves, {unit(g[i].shape(), g[i].dtype(), m)}, nested);
      for (std::size_t j = 0; j < leaves.size(); ++j) {
        if (nested) rows[j].push_back(h[j]);
        else if (h[j].defined()) scatter_into(H[i][j], m * leaves[j].numel(), 1, h[j]);
      }
    }
    if (nested)
      for (std::size_t j = 0; j < leaves.size(); ++j)
        H[i][j] = assemble(rows[j], leaves[j].shape(), 0, H[i][j].shape(), H[i][j].dtype());
  }
  return H;
}

}  // namespace autograd
