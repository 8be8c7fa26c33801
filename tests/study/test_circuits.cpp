// nn::circuits against TransformerLens 3.9: per-head weights, FactoredMatrix, OV / QK circuits,
// composition scores and head detectors, on the float64 values that
// tests/data/transformer_lens/make_circuits_reference.py computed with TL (a random 2-layer
// attention-only model with nonzero biases, and a batch of token sequences with repeats). The TL
// weights are loaded into nn::MultiHeadAttention layers by reshaping: TL's W_Q[h] (E, d) is our
// W_Q's columns h·d .. (h+1)·d - 1, TL's W_O[h] (d, E) our W_O's rows.
#define BOOST_TEST_MODULE circuits
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <complex>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

#include "test_support.hpp"

namespace ag = autograd;
namespace circuits = nn::circuits;
using ag::Dtype;
using ag::Tensor;
using ag::TensorList;
using circuits::Composition;
using circuits::FactoredMatrix;
using circuits::HeadKind;

namespace {

constexpr std::int64_t L = 2, H = 4, E = 16, D = 4;

const std::map<std::string, Tensor>& reference() {
  static const std::map<std::string, Tensor> ref = [] {
    std::map<std::string, Tensor> m;
    for (auto& [name, t] : nn::load_safetensors(HEADGRAD_TEST_DATA_DIR "/transformer_lens/circuits_reference.safetensors").tensors)
      m.emplace(name, t);
    return m;
  }();
  return ref;
}

const Tensor& tl_ref(const std::string& name) {
  const auto& m = reference();
  const auto it = m.find(name);
  BOOST_REQUIRE_MESSAGE(it != m.end(), "no reference tensor " << name);
  return it->second;
}

// TL's parameter `name` ("W_Q", ...) of layer `layer`: W_Q (H, E, d), W_O (H, d, E), b_Q (H, d), b_O (E).
Tensor tl(const std::string& name, std::int64_t layer) {
  return tl_ref("param.blocks." + std::to_string(layer) + ".attn." + name);
}

// The TL model's attention layers as nn::MultiHeadAttention, weights copied in by reshaping.
struct Layers {
  std::vector<std::unique_ptr<nn::MultiHeadAttention>> attn;
  Layers() {
    ag::Generator gen(3);
    for (std::int64_t l = 0; l < L; ++l) {
      auto a = std::make_unique<nn::MultiHeadAttention>(
          nn::MultiHeadAttentionOptions{.embed_dim = E, .num_heads = H, .dtype = Dtype::Float64}, gen);
      ag::NoGradGuard no_grad;
      // TL W_Q (H, E, d) -> ours (E, H·d): column h·d + j is TL's W_Q[h][:, j]
      auto in_proj = [](const Tensor& w) { return ag::reshape(ag::permute(w, {1, 0, 2}), {E, H * D}); };
      a->W_Q().copy_(in_proj(tl("W_Q", l)));
      a->W_K().copy_(in_proj(tl("W_K", l)));
      a->W_V().copy_(in_proj(tl("W_V", l)));
      a->W_O().copy_(ag::reshape(tl("W_O", l), {H * D, E}));  // TL W_O (H, d, E): rows h·d + j
      a->b_Q().copy_(ag::reshape(tl("b_Q", l), {E}));
      a->b_K().copy_(ag::reshape(tl("b_K", l), {E}));
      a->b_V().copy_(ag::reshape(tl("b_V", l), {E}));
      a->b_O().copy_(tl("b_O", l));
      attn.push_back(std::move(a));
    }
  }
  std::vector<const nn::MultiHeadAttention*> list() const {
    std::vector<const nn::MultiHeadAttention*> out;
    for (const auto& a : attn) out.push_back(a.get());
    return out;
  }
};

const Layers& layers() {
  static const Layers l;
  return l;
}

// Largest |a - b| / (1 + |b|), element by element, of tensors of one shape.
double worst(const Tensor& a, const Tensor& b) {
  BOOST_REQUIRE_MESSAGE(a.shape() == b.shape(), ag::shape_str(a.shape()) << " vs " << ag::shape_str(b.shape()));
  const auto x = a.to_vector(), y = b.to_vector();
  double w = 0;
  for (std::size_t i = 0; i < x.size(); ++i) w = std::max(w, std::abs(x[i] - y[i]) / (1 + std::abs(y[i])));
  return w;
}

void check_close(const std::string& what, const Tensor& got, const Tensor& expected, double tol) {
  const double w = worst(got, expected);
  BOOST_TEST_MESSAGE(what << ": worst error " << w);
  BOOST_TEST(w <= tol, what << ": worst error " << w << " > " << tol);
}

// TL's eigenvalues (..., r) in LAPACK's order, sorted per matrix as FactoredMatrix sorts them.
std::vector<std::complex<double>> sorted_eigenvalues(const Tensor& re, const Tensor& im) {
  const auto r = re.to_vector(), i = im.to_vector();
  const std::size_t n = static_cast<std::size_t>(re.size(-1));
  std::vector<std::complex<double>> out;
  for (std::size_t start = 0; start < r.size(); start += n) {
    std::vector<std::complex<double>> ev;
    for (std::size_t j = 0; j < n; ++j) ev.emplace_back(r[start + j], i[start + j]);
    std::sort(ev.begin(), ev.end(), [](const auto& x, const auto& y) {
      const double ax = std::abs(x), ay = std::abs(y);
      if (ax != ay) return ax > ay;
      if (x.real() != y.real()) return x.real() > y.real();
      return x.imag() > y.imag();
    });
    out.insert(out.end(), ev.begin(), ev.end());
  }
  return out;
}

double worst_complex(const std::vector<std::complex<double>>& a, const std::vector<std::complex<double>>& b) {
  BOOST_REQUIRE_EQUAL(a.size(), b.size());
  double w = 0;
  for (std::size_t i = 0; i < a.size(); ++i) w = std::max(w, std::abs(a[i] - b[i]) / (1 + std::abs(b[i])));
  return w;
}

Tensor layer_slice(const Tensor& t, std::int64_t l) { return ag::squeeze(ag::narrow(t, 0, l, 1), 0); }

std::string detector_key(HeadKind kind, bool bos, bool cur, bool abs) {
  return "scores." + circuits::head_kind_name(kind) + ".bos" + (bos ? "1" : "0") + ".cur" + (cur ? "1" : "0") + "." +
         (abs ? "abs" : "mul");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(weights)

BOOST_AUTO_TEST_CASE(head_weights_are_tls_per_head_matrices) {
  for (std::int64_t l = 0; l < L; ++l)
    for (std::int64_t h = 0; h < H; ++h) {
      const auto w = circuits::head_weights(*layers().attn[static_cast<std::size_t>(l)], h);
      auto head = [&](const std::string& name) { return layer_slice(tl(name, l), h); };
      BOOST_TEST(worst(w.W_Q, head("W_Q")) == 0.0);
      BOOST_TEST(worst(w.W_K, head("W_K")) == 0.0);
      BOOST_TEST(worst(w.W_V, head("W_V")) == 0.0);
      BOOST_TEST(worst(w.W_O, head("W_O")) == 0.0);
      BOOST_TEST(worst(w.b_Q, head("b_Q")) == 0.0);
      BOOST_TEST(worst(w.b_K, head("b_K")) == 0.0);
      BOOST_TEST(worst(w.b_V, head("b_V")) == 0.0);
    }
}

BOOST_AUTO_TEST_CASE(stacked_weights_have_tls_shapes_and_values) {
  const auto one = circuits::stacked_head_weights(*layers().attn[1]);
  BOOST_TEST(ag::shape_str(one.W_Q.shape()) == "[4, 16, 4]");
  BOOST_TEST(ag::shape_str(one.W_O.shape()) == "[4, 4, 16]");
  BOOST_TEST(worst(one.W_K, tl("W_K", 1)) == 0.0);
  BOOST_TEST(worst(one.b_V, tl("b_V", 1)) == 0.0);
  const auto all = circuits::stacked_head_weights(layers().list());
  for (const char* name : {"W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"}) {
    const Tensor& got = std::string(name) == "W_Q"   ? all.W_Q
                        : std::string(name) == "W_K" ? all.W_K
                        : std::string(name) == "W_V" ? all.W_V
                        : std::string(name) == "W_O" ? all.W_O
                        : std::string(name) == "b_Q" ? all.b_Q
                        : std::string(name) == "b_K" ? all.b_K
                        : std::string(name) == "b_V" ? all.b_V
                                                     : all.b_O;
    BOOST_TEST(worst(got, ag::stack({tl(name, 0), tl(name, 1)}, 0)) == 0.0, name);
  }
}

BOOST_AUTO_TEST_CASE(head_weights_pass_gradients_to_that_heads_columns_only) {
  nn::MultiHeadAttention attn(nn::MultiHeadAttentionOptions{.embed_dim = 6, .num_heads = 3, .dtype = Dtype::Float64});
  const auto w = circuits::head_weights(attn, 1);
  ag::sum(w.W_Q * w.W_Q).backward();
  const auto g = attn.W_Q().grad().to_vector(), v = attn.W_Q().to_vector();
  for (std::int64_t i = 0; i < 6; ++i)
    for (std::int64_t j = 0; j < 6; ++j) {
      const auto k = static_cast<std::size_t>(i * 6 + j);
      BOOST_TEST(g[k] == (j == 2 || j == 3 ? 2 * v[k] : 0.0));
    }
}

BOOST_AUTO_TEST_CASE(bad_heads_and_layouts_are_refused_by_name) {
  const auto& a = *layers().attn[0];
  test_support::check_message([&] { circuits::head_weights(a, 4); }, "circuits::head_weights: head 4 is out of range for a layer of 4 heads");
  test_support::check_message([&] { circuits::ov_circuit(a, -1); }, "circuits::ov_circuit: head -1");
  nn::MultiHeadAttention other(nn::MultiHeadAttentionOptions{.embed_dim = 16, .num_heads = 2, .dtype = Dtype::Float64});
  test_support::check_message([&] { circuits::all_composition_scores({&a, &other}, Composition::K); },
                              "layer 1 (embed_dim 16, 2 heads");
  test_support::check_message([&] { circuits::stacked_head_weights(std::vector<const nn::MultiHeadAttention*>{}); },
                              "needs at least one layer");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(factored_matrix)

BOOST_AUTO_TEST_CASE(product_norm_and_singular_values_match_tl) {
  const FactoredMatrix fm(tl_ref("fm.A"), tl_ref("fm.B"));
  BOOST_TEST(ag::shape_str(fm.shape()) == "[3, 7, 5]");
  check_close("AB", fm.AB(), tl_ref("fm.AB"), 1e-12);
  check_close("norm", fm.norm(), tl_ref("fm.norm"), 1e-12);
  check_close("S", fm.singular_values(), tl_ref("fm.S"), 1e-12);
  check_close("collapse_l norm", ag::sqrt(ag::sum(ag::square(fm.collapse_l()), {-2, -1})), tl_ref("fm.collapse_l_norm"), 1e-12);
  check_close("T.AB", fm.T().AB(), tl_ref("fm.T.AB"), 1e-12);
  check_close("T.S", fm.T().singular_values(), tl_ref("fm.T.S"), 1e-12);
  // Factors scaled by 2^±70 (float32: their Gram products would underflow or overflow) and by
  // 10^±150 (float64): the same norm, scaled, and finite.
  const Tensor A32 = tl_ref("fm.A").to(Dtype::Float32), B32 = tl_ref("fm.B").to(Dtype::Float32);
  const std::vector<double> n32 = FactoredMatrix(A32, B32).norm().to_vector();
  const std::vector<double> s32 = FactoredMatrix(A32 * std::ldexp(1.0, -70), B32 * std::ldexp(1.0, 70)).norm().to_vector();
  BOOST_TEST(s32 == n32, boost::test_tools::per_element());
  check_close("norm of 1e-150 A times 1e150 B",
              FactoredMatrix(tl_ref("fm.A") * 1e-150, tl_ref("fm.B") * 1e150).norm(), tl_ref("fm.norm"), 1e-12);
}

BOOST_AUTO_TEST_CASE(svd_factors_rebuild_the_product_with_orthonormal_columns) {
  const FactoredMatrix fm(tl_ref("fm.A"), tl_ref("fm.B"));
  const auto s = fm.svd();
  BOOST_TEST(ag::shape_str(s.U.shape()) == "[3, 7, 4]");
  BOOST_TEST(ag::shape_str(s.V.shape()) == "[3, 5, 4]");
  const Tensor rebuilt = ag::matmul(s.U * ag::unsqueeze(s.S, -2), ag::transpose(s.V, -2, -1));
  check_close("U S Vᵀ", rebuilt, fm.AB(), 1e-12);
  const Tensor eye = ag::expand(ag::reshape(ag::tensor({1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1}, {4, 4}, Dtype::Float64), {1, 4, 4}), {3, 4, 4});
  check_close("UᵀU", ag::matmul(ag::transpose(s.U, -2, -1), s.U), eye, 1e-12);
  check_close("VᵀV", ag::matmul(ag::transpose(s.V, -2, -1), s.V), eye, 1e-12);
  const FactoredMatrix even = fm.make_even();
  check_close("make_even keeps the product", even.AB(), fm.AB(), 1e-12);
}

BOOST_AUTO_TEST_CASE(products_stay_factored_as_tl_keeps_them) {
  const FactoredMatrix fm(tl_ref("fm.A"), tl_ref("fm.B"));
  const FactoredMatrix right = fm.matmul(tl_ref("fm.M"));  // n = 5 > r = 4: (A, B·M)
  check_close("(fm @ M).A", right.A(), tl_ref("fm_M.A"), 0.0);
  check_close("(fm @ M).B", right.B(), tl_ref("fm_M.B"), 1e-14);
  check_close("(fm @ M).S", right.singular_values(), tl_ref("fm_M.S"), 1e-12);
  const FactoredMatrix left = fm.rmatmul(tl_ref("fm.Ml"));  // m = 7 > r = 4: (Ml·A, B)
  BOOST_TEST(left.mdim() == 4);
  check_close("(Ml @ fm).AB", left.AB(), tl_ref("Ml_fm.AB"), 1e-12);
  check_close("(Ml @ fm).S", left.singular_values(), tl_ref("Ml_fm.S"), 1e-12);
  const FactoredMatrix ff = fm.matmul(FactoredMatrix(tl_ref("ff.W"), tl_ref("ff.W2")));
  check_close("fm @ fm2 AB", ff.AB(), tl_ref("ff.AB"), 1e-12);
  check_close("fm @ fm2 S", ff.singular_values(), tl_ref("ff.S"), 1e-12);
  const Tensor v = ag::tensor({1, -2, 0.5, 3, 1}, {5}, Dtype::Float64);
  check_close("matvec", fm.matvec(v), ag::squeeze(ag::matmul(fm.AB(), ag::unsqueeze(v, -1)), -1), 1e-12);
  check_close("scaled", fm.scaled(-2.5).AB(), fm.AB() * -2.5, 1e-12);
  check_close("index", fm[1].AB(), layer_slice(fm.AB(), 1), 0.0);
}

BOOST_AUTO_TEST_CASE(eigenvalues_of_a_square_product_match_tls_as_a_set) {
  const FactoredMatrix sq(tl_ref("sq.A"), tl_ref("sq.B"));  // (2, 6, 6) of rank 3
  const auto ev = sq.eigenvalues();
  BOOST_TEST(ag::shape_str(ev.real.shape()) == "[2, 3]");
  const double w = worst_complex(ev.values(), sorted_eigenvalues(tl_ref("sq.eig_real"), tl_ref("sq.eig_imag")));
  BOOST_TEST_MESSAGE("eigenvalues: worst error " << w);
  BOOST_TEST(w <= 1e-12);
  test_support::check_message([&] { FactoredMatrix(tl_ref("fm.A"), tl_ref("fm.B")).eigenvalues(); },
                              "circuits::FactoredMatrix::eigenvalues: needs a square matrix, got shape [3, 7, 5]");
}

BOOST_AUTO_TEST_CASE(composition_scores_broadcast_as_tls) {
  const FactoredMatrix fm(tl_ref("fm.A"), tl_ref("fm.B"));
  const Tensor outer = circuits::composition_scores(fm, FactoredMatrix(tl_ref("comp.R_A"), tl_ref("comp.R_B")));
  check_close("broadcast_dims", outer, tl_ref("comp.broadcast"), 1e-12);
  const Tensor paired = circuits::composition_scores(fm, FactoredMatrix(tl_ref("comp.R2_A"), tl_ref("comp.R2_B")), false);
  check_close("leading dims shared", paired, tl_ref("comp.elementwise"), 1e-12);
}

BOOST_AUTO_TEST_CASE(mismatched_factors_are_refused_naming_the_shapes) {
  const Tensor a = ag::zeros({3, 4}, Dtype::Float64), b = ag::zeros({5, 2}, Dtype::Float64);
  test_support::check_message([&] { FactoredMatrix(a, b); }, "circuits::FactoredMatrix: inner dimensions differ: A [3, 4] and B [5, 2]");
  test_support::check_message([&] { FactoredMatrix(ag::zeros({2, 3, 4}, Dtype::Float64), ag::zeros({3, 4, 2}, Dtype::Float64)); },
                              "shapes cannot be broadcast");
  const FactoredMatrix f(a, ag::zeros({4, 2}, Dtype::Float64));
  test_support::check_message([&] { f.matmul(ag::zeros({3, 3}, Dtype::Float64)); }, "inner dimensions differ: [3, 2] x [3, 3]");
  test_support::check_message([&] { f[0]; }, "has no leading dim to index");
}

BOOST_AUTO_TEST_CASE(empty_and_non_finite_factors_are_refused_before_a_decomposition) {
  const auto f64 = [](ag::Shape s) { return ag::ones(s, Dtype::Float64); };
  for (const auto& ab : {std::pair{ag::Shape{4, 0}, ag::Shape{0, 5}}, std::pair{ag::Shape{0, 3}, ag::Shape{3, 5}},
                         std::pair{ag::Shape{4, 3}, ag::Shape{3, 0}}})
    test_support::check_message([&] { FactoredMatrix(f64(ab.first), f64(ab.second)); },
                                "circuits::FactoredMatrix: the matrix dimensions must be positive, got A " +
                                    ag::shape_str(ab.first) + " and B " + ag::shape_str(ab.second));
  std::vector<double> v(12, 1.0);
  v[5] = std::nan("");
  const FactoredMatrix nan_a(ag::tensor(v, {4, 3}, Dtype::Float64), test_support::input({3, 4}, 2));
  test_support::check_message([&] { nan_a.singular_values(); },
                              "circuits::FactoredMatrix::svd: factor A [4, 3] holds nan at flat index 5");
  test_support::check_message([&] { nan_a.eigenvalues(); }, "circuits::FactoredMatrix::eigenvalues: factor A [4, 3]");
  const FactoredMatrix inf_b(test_support::input({4, 3}, 3), ag::full({3, 4}, INFINITY, Dtype::Float64));
  test_support::check_message([&] { inf_b.make_even(); }, "factor B [3, 4] holds inf at flat index 0");
}

BOOST_AUTO_TEST_CASE(composition_scores_need_nonzero_circuits_of_one_dtype_and_keep_their_scale_invariance) {
  const FactoredMatrix zero(ag::zeros({4, 2}, Dtype::Float64), ag::zeros({2, 5}, Dtype::Float64));
  const FactoredMatrix w(test_support::input({5, 3}, 1), test_support::input({3, 4}, 2));
  test_support::check_message([&] { circuits::composition_scores(zero, w); },
                              "circuits::composition_scores: the left circuit [4, 5] has norm 0");
  test_support::check_message([&] { circuits::composition_score(ag::zeros({4, 5}, Dtype::Float64), w.AB()); },
                              "circuits::composition_score: W_A has norm 0");
  test_support::check_message([&] { circuits::composition_score(w.AB(), ag::ones({4, 2}, Dtype::Int64)); },
                              "circuits::composition_score: needs Float32 or Float64 matrices, got Float64 and Int64");
  const FactoredMatrix w32(w.A().to(Dtype::Float32), w.B().to(Dtype::Float32));
  const FactoredMatrix v(test_support::input({4, 3}, 3), test_support::input({3, 6}, 4));
  test_support::check_message([&] { circuits::composition_scores(w32, v); },
                              "circuits::composition_scores: the circuits have different dtypes: Float32 and Float64");
  // Float32 weights of 1e-25: the score does not depend on scale (the float32 norms would underflow).
  const FactoredMatrix v32(v.A().to(Dtype::Float32), v.B().to(Dtype::Float32));
  const double at_scale = circuits::composition_scores(w32.scaled(1e-25), v32.scaled(1e-25)).item();
  const double plain = circuits::composition_scores(w, v).item();
  BOOST_TEST(std::abs(at_scale - plain) <= 1e-6 * plain, at_scale << " vs " << plain);
}

BOOST_AUTO_TEST_CASE(norm_and_composition_scores_pass_gradchecks) {
  const Tensor A = test_support::input({2, 5, 3}, 1), B = test_support::input({3, 6}, 2);
  const Tensor C = test_support::input({6, 2}, 3), Dm = test_support::input({2, 4}, 4);
  test_support::check_gradients("norm", [](const TensorList& x) { return ag::sum(FactoredMatrix(x[0], x[1]).norm()); }, {A, B});
  test_support::check_gradients(
      "composition score",
      [](const TensorList& x) { return ag::sum(circuits::composition_scores(FactoredMatrix(x[0], x[1]), FactoredMatrix(x[2], x[3]))); },
      {A, B, C, Dm});
  test_support::check_gradients("plain score", [](const TensorList& x) { return circuits::composition_score(x[0], x[1]); },
                                {test_support::input({4, 6}, 5), test_support::input({6, 3}, 6)});
}

BOOST_AUTO_TEST_CASE(a_gradcheck_of_a_norm_with_a_detached_factor_fails) {
  const Tensor A = test_support::input({5, 3}, 1), B = test_support::input({3, 6}, 2);
  const auto r = ag::gradcheck([](const TensorList& x) { return FactoredMatrix(x[0].detach(), x[1]).norm(); }, {A, B});
  BOOST_TEST(!r.ok);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(circuits_of_the_tl_model)

BOOST_AUTO_TEST_CASE(ov_and_qk_norms_singular_values_and_eigenvalues_match_tl) {
  const auto list = layers().list();
  const FactoredMatrix ov = circuits::ov_circuit(list), qk = circuits::qk_circuit(list);
  BOOST_TEST(ag::shape_str(ov.shape()) == "[2, 4, 16, 16]");
  check_close("OV.AB", ov.AB(), tl_ref("OV.AB"), 1e-12);
  check_close("QK.AB", qk.AB(), tl_ref("QK.AB"), 1e-12);
  check_close("OV.norm", ov.norm(), tl_ref("OV.norm"), 1e-12);
  check_close("QK.norm", qk.norm(), tl_ref("QK.norm"), 1e-12);
  check_close("OV.S", ov.singular_values(), tl_ref("OV.S"), 1e-12);
  check_close("QK.S", qk.singular_values(), tl_ref("QK.S"), 1e-12);
  const double w_ov = worst_complex(ov.eigenvalues().values(), sorted_eigenvalues(tl_ref("OV.eig_real"), tl_ref("OV.eig_imag")));
  const double w_qk = worst_complex(qk.eigenvalues().values(), sorted_eigenvalues(tl_ref("QK.eig_real"), tl_ref("QK.eig_imag")));
  BOOST_TEST_MESSAGE("OV eigenvalues: worst error " << w_ov << ", QK: " << w_qk);
  BOOST_TEST(w_ov <= 1e-10);
  BOOST_TEST(w_qk <= 1e-10);
  // One head and one layer give the same slices.
  check_close("one head", circuits::ov_circuit(*list[1], 2).AB(), layer_slice(layer_slice(tl_ref("OV.AB"), 1), 2), 1e-12);
  check_close("one layer", circuits::qk_circuit(*list[0]).norm(), layer_slice(tl_ref("QK.norm"), 0), 1e-12);
}

BOOST_AUTO_TEST_CASE(all_composition_scores_match_tl_for_q_k_and_v) {
  const auto list = layers().list();
  for (Composition mode : {Composition::Q, Composition::K, Composition::V}) {
    const std::string name = circuits::composition_name(mode);
    const Tensor all = circuits::all_composition_scores(list, mode);
    BOOST_TEST(ag::shape_str(all.shape()) == "[2, 4, 2, 4]");
    check_close(name + " composition (L, H, L, H)", all, tl_ref("composition." + name), 1e-12);
    // The pair of layers alone: TL's [0, :, 1, :].
    const Tensor pair = circuits::composition_scores(*list[0], *list[1], mode);
    check_close(name + " composition of layer 0 into layer 1", pair, ag::squeeze(ag::narrow(layer_slice(tl_ref("composition." + name), 0), 1, 1, 1), 1), 1e-12);
  }
}

BOOST_AUTO_TEST_CASE(a_perturbed_weight_moves_the_scores_away_from_tls) {
  Layers perturbed;
  {
    ag::NoGradGuard no_grad;
    Tensor w = perturbed.attn[0]->W_O();
    std::vector<double> v = w.to_vector();
    v[5] += 1e-3;  // one weight of head 0 of layer 0
    w.copy_(ag::tensor(v, w.shape(), Dtype::Float64));
  }
  const Tensor k = circuits::all_composition_scores(perturbed.list(), Composition::K);
  const double w = worst(k, tl_ref("composition.K"));
  BOOST_TEST_MESSAGE("K composition with W_O[0][5] moved by 1e-3: error " << w);
  BOOST_TEST(w > 1e-7);
  BOOST_TEST(worst(circuits::ov_circuit(perturbed.list()).norm(), tl_ref("OV.norm")) > 1e-7);
}

BOOST_AUTO_TEST_CASE(composition_scores_of_layers_pass_a_gradcheck_in_the_weights) {
  ag::Generator gen(11);
  nn::MultiHeadAttention a(nn::MultiHeadAttentionOptions{.embed_dim = 6, .num_heads = 2, .dtype = Dtype::Float64}, gen);
  nn::MultiHeadAttention b(nn::MultiHeadAttentionOptions{.embed_dim = 6, .num_heads = 2, .dtype = Dtype::Float64}, gen);
  const TensorList inputs = {a.W_V(), a.W_O(), b.W_Q(), b.W_K()};
  test_support::check_gradients("K composition", [&](const TensorList&) {
    const Tensor s = circuits::composition_scores(a, b, Composition::K);
    return ag::sum(s * ag::tensor({1, -2, 0.5, 3}, {2, 2}, Dtype::Float64));
  }, inputs);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(random_baseline)

BOOST_AUTO_TEST_CASE(random_circuits_score_about_one_over_root_of_the_residual_width) {
  // Two rank-d circuits of Gaussian factors, (E x d)(d x E) each: their row and column spaces are
  // random d-dim subspaces of the E-dim residual, and the score is about 1/sqrt(E) (0.977/sqrt(E)
  // for d = 4 in a numpy simulation of 200 draws at E = 16, 64 and 256).
  auto circuit = [](std::int64_t e) { return FactoredMatrix(ag::zeros({e, 4}, Dtype::Float64), ag::zeros({4, e}, Dtype::Float64)); };
  ag::Generator gen16(5), gen64(5);
  const auto b16 = circuits::random_composition_baseline(circuit(16), circuit(16), gen16, 200);
  const auto b64 = circuits::random_composition_baseline(circuit(64), circuit(64), gen64, 200);
  BOOST_TEST_MESSAGE("baseline E=16: " << b16.mean << " +- " << b16.std << ", E=64: " << b64.mean << " +- " << b64.std);
  BOOST_TEST(b16.samples == 200);
  BOOST_TEST(b64.mean * 8 > 0.93);
  BOOST_TEST(b64.mean * 8 < 1.02);
  BOOST_TEST(b16.mean / b64.mean > 1.85);
  BOOST_TEST(b16.mean / b64.mean < 2.1);
  BOOST_TEST(b64.std > 0.0);
}

BOOST_AUTO_TEST_CASE(the_baseline_is_fixed_by_the_generators_seed) {
  const auto& a = *layers().attn[0];
  ag::Generator g1(9), g2(9), g3(10);
  const auto x = circuits::random_composition_baseline(a, a, Composition::K, g1, 20);
  const auto y = circuits::random_composition_baseline(a, a, Composition::K, g2, 20);
  const auto z = circuits::random_composition_baseline(a, a, Composition::K, g3, 20);
  BOOST_TEST(x.mean == y.mean);
  BOOST_TEST(x.mean != z.mean);
  test_support::check_message([&] { circuits::random_composition_baseline(a, a, Composition::Q, g1, 0); },
                              "circuits::random_composition_baseline: needs at least 2 samples (its std is over samples), "
                              "got 0");
  test_support::check_message([&] { circuits::random_composition_baseline(a, a, Composition::Q, g1, 1); },
                              "needs at least 2 samples");
  test_support::check_message([&] { circuits::random_composition_baseline(a, a, static_cast<Composition>(9), g1, 5); },
                              "circuits::random_composition_baseline: unknown composition mode 9");
  test_support::check_message([&] { circuits::all_composition_scores({&a, &a}, Composition::K); },
                              "circuits::all_composition_scores: layers 0 and 1 are the same module");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(head_detectors)

BOOST_AUTO_TEST_CASE(detection_patterns_are_tls) {
  const Tensor tokens = tl_ref("tokens");  // (3, 12) Int64, with repeats
  for (HeadKind kind : {HeadKind::PreviousToken, HeadKind::DuplicateToken, HeadKind::Induction}) {
    const Tensor batch = circuits::detection_pattern(kind, tokens);
    BOOST_TEST(ag::shape_str(batch.shape()) == "[3, 12, 12]");
    for (std::int64_t b = 0; b < 3; ++b) {
      const std::string key = "detection." + circuits::head_kind_name(kind) + "." + std::to_string(b);
      BOOST_TEST(worst(layer_slice(batch, b), tl_ref(key)) == 0.0, key);
      BOOST_TEST(worst(circuits::detection_pattern(kind, layer_slice(tokens, b)), tl_ref(key)) == 0.0, key);
    }
  }
}

BOOST_AUTO_TEST_CASE(head_scores_match_tl_for_every_kind_option_and_measure) {
  const Tensor tokens = tl_ref("tokens");
  double w_mul = 0, w_abs = 0;
  for (HeadKind kind : {HeadKind::PreviousToken, HeadKind::DuplicateToken, HeadKind::Induction})
    for (bool bos : {false, true})
      for (bool cur : {false, true})
        for (bool abs : {false, true}) {
          const circuits::DetectorOptions o{.exclude_bos = bos, .exclude_current_token = cur,
                                            .error_measure = abs ? circuits::ErrorMeasure::Abs : circuits::ErrorMeasure::Mul};
          const Tensor expected = tl_ref(detector_key(kind, bos, cur, abs));  // (L, H)
          for (std::int64_t l = 0; l < L; ++l) {
            const Tensor got = circuits::head_scores(tl_ref("pattern." + std::to_string(l)), kind, tokens, o);
            const double w = worst(got, layer_slice(expected, l));
            (abs ? w_abs : w_mul) = std::max(abs ? w_abs : w_mul, w);
            BOOST_TEST(w <= 1e-12, detector_key(kind, bos, cur, abs) << " layer " << l << ": " << w);
          }
        }
  BOOST_TEST_MESSAGE("head scores: worst error mul " << w_mul << ", abs " << w_abs);
}

BOOST_AUTO_TEST_CASE(the_repeated_batch_has_heads_that_score_differently) {
  // The reference scores are not degenerate: the heads differ, so matching them means something.
  const Tensor s = tl_ref(detector_key(HeadKind::Induction, false, false, false));
  const auto v = s.to_vector();
  BOOST_TEST(*std::max_element(v.begin(), v.end()) - *std::min_element(v.begin(), v.end()) > 0.02);
}

BOOST_AUTO_TEST_CASE(a_perturbed_pattern_fails_the_comparison) {
  const Tensor tokens = tl_ref("tokens");
  std::vector<double> p = tl_ref("pattern.1").to_vector();
  // Move 0.01 of query 7's attention in sequence 0, head 2 from key 7 to key 2, which follows the
  // earlier copy of query 7's token (rows still sum to 1).
  const std::size_t row = ((0 * 4 + 2) * 12 + 7) * 12;
  p[row + 7] -= 0.01;
  p[row + 2] += 0.01;
  const Tensor moved = ag::tensor(p, tl_ref("pattern.1").shape(), Dtype::Float64);
  const Tensor got = circuits::head_scores(moved, HeadKind::Induction, tokens);
  const double w = worst(got, layer_slice(tl_ref(detector_key(HeadKind::Induction, false, false, false)), 1));
  BOOST_TEST_MESSAGE("moved pattern: error " << w);
  BOOST_TEST(w > 1e-4);
}

BOOST_AUTO_TEST_CASE(mul_scores_pass_a_gradcheck_in_the_pattern) {
  ag::Generator gen(4);
  const Tensor raw = ag::randn({2, 3, 5, 5}, Dtype::Float64, gen);
  const Tensor pattern = ag::softmax(raw, -1).detach().requires_grad_();
  const Tensor tokens = ag::tensor(std::vector<std::int64_t>{1, 2, 1, 2, 3, 0, 0, 4, 0, 4}, {2, 5});
  for (bool bos : {false, true})
    test_support::check_gradients("induction score", [&](const TensorList& x) {
      return ag::sum(circuits::head_scores(x[0], HeadKind::Induction, tokens, {.exclude_bos = bos}) *
                     ag::tensor({1, 2, -1}, {3}, Dtype::Float64));
    }, {pattern});
}

BOOST_AUTO_TEST_CASE(scores_of_every_cached_layer_stack_per_layer) {
  // Two attention layers in a module, run with a cache: the helper scores each cached pattern.
  struct Two : nn::Module {
    std::shared_ptr<nn::MultiHeadAttention> a0, a1;
    explicit Two(ag::Generator& gen) : nn::Module("Two") {
      a0 = register_module("a0", std::make_shared<nn::MultiHeadAttention>(
                                     nn::MultiHeadAttentionOptions{.embed_dim = 8, .num_heads = 2, .dtype = Dtype::Float64}, gen));
      a1 = register_module("a1", std::make_shared<nn::MultiHeadAttention>(
                                     nn::MultiHeadAttentionOptions{.embed_dim = 8, .num_heads = 2, .dtype = Dtype::Float64}, gen));
    }
  };
  ag::Generator gen(8);
  Two model(gen);
  const Tensor x = ag::randn({2, 6, 8}, Dtype::Float64, gen);
  const Tensor tokens = ag::tensor(std::vector<std::int64_t>{1, 2, 3, 1, 2, 3, 5, 5, 4, 5, 5, 4}, {2, 6});
  const auto cache = nn::run_with_cache(model, [&] {
    const Tensor h = model.a0->forward(x, {.is_causal = true}).output;
    return model.a1->forward(h, {.is_causal = true}).output;
  });
  const Tensor all = circuits::head_scores(cache, HeadKind::Induction, tokens);
  BOOST_TEST(ag::shape_str(all.shape()) == "[2, 2]");
  BOOST_TEST(worst(layer_slice(all, 0), circuits::head_scores(cache["a0.pattern"], HeadKind::Induction, tokens)) == 0.0);
  BOOST_TEST(worst(layer_slice(all, 1), circuits::head_scores(cache["a1.pattern"], HeadKind::Induction, tokens)) == 0.0);
  const Tensor one = circuits::head_scores(cache, HeadKind::PreviousToken, tokens, {}, {"a1.pattern"});
  BOOST_TEST(ag::shape_str(one.shape()) == "[1, 2]");
}

BOOST_AUTO_TEST_CASE(share_scores_count_only_the_positions_that_have_a_target) {
  const Tensor tokens = tl_ref("tokens");
  const Tensor p = tl_ref("pattern.1");  // (3, 4, 12, 12)
  const Tensor got = circuits::head_scores(p, HeadKind::Induction, tokens, {.error_measure = circuits::ErrorMeasure::Share});
  // By hand: over every (sequence, query) with an earlier occurrence, the attention on the targets.
  const std::vector<double> P = p.to_vector(), Dv = circuits::detection_pattern(HeadKind::Induction, tokens).to_vector();
  std::vector<double> want(4, 0.0);
  double rows = 0;
  for (std::int64_t b = 0; b < 3; ++b)
    for (std::int64_t i = 0; i < 12; ++i) {
      bool any = false;
      for (std::int64_t j = 0; j < 12; ++j) any = any || Dv[static_cast<std::size_t>((b * 12 + i) * 12 + j)] != 0;
      if (!any) continue;
      rows += 1;
      for (std::int64_t h = 0; h < 4; ++h)
        for (std::int64_t j = 0; j < 12; ++j)
          want[static_cast<std::size_t>(h)] += P[static_cast<std::size_t>(((b * 4 + h) * 12 + i) * 12 + j)] *
                                                Dv[static_cast<std::size_t>((b * 12 + i) * 12 + j)];
    }
  for (double& x : want) x /= rows;
  BOOST_TEST(worst(got, ag::tensor(want, {4}, Dtype::Float64)) <= 1e-15);
  // A perfect previous-token pattern scores 1 under Share, and less under Mul (query 0 has no target).
  std::vector<double> perfect(12 * 12, 0.0);
  perfect[0] = 1;
  for (std::size_t i = 1; i < 12; ++i) perfect[i * 12 + i - 1] = 1;
  const Tensor one = ag::tensor(perfect, {1, 12, 12}, Dtype::Float64);
  const Tensor t0 = layer_slice(tokens, 0);
  BOOST_TEST(circuits::head_scores(one, HeadKind::PreviousToken, t0, {.error_measure = circuits::ErrorMeasure::Share}).item() == 1.0);
  BOOST_TEST(circuits::head_scores(one, HeadKind::PreviousToken, t0).item() < 1.0);
  test_support::check_gradients("share score", [&](const TensorList& x) {
    return ag::sum(circuits::head_scores(x[0], HeadKind::Induction, tokens, {.error_measure = circuits::ErrorMeasure::Share}));
  }, {p.detach().requires_grad_()});
  // Distinct tokens have no induction target at any position: refused.
  std::vector<std::int64_t> distinct(12);
  for (std::size_t i = 0; i < 12; ++i) distinct[i] = static_cast<std::int64_t>(i);
  test_support::check_message([&] {
    circuits::head_scores(one, HeadKind::Induction, ag::tensor(distinct, {12}), {.error_measure = circuits::ErrorMeasure::Share});
  }, "circuits::head_scores: no query position of the detection pattern has a 1 to score (Share)");
}

BOOST_AUTO_TEST_CASE(unknown_kinds_measures_and_non_finite_patterns_are_refused) {
  const Tensor tokens = tl_ref("tokens");
  const Tensor p = tl_ref("pattern.0");
  test_support::check_message([&] { circuits::detection_pattern(static_cast<HeadKind>(9), tokens); },
                              "circuits::detection_pattern: unknown head kind 9");
  test_support::check_message([&] {
    circuits::head_scores(p, HeadKind::Induction, tokens, {.error_measure = static_cast<circuits::ErrorMeasure>(9)});
  }, "circuits::head_scores: unknown error measure 9");
  test_support::check_message([&] { circuits::head_scores(ag::full(p.shape(), NAN, Dtype::Float64), HeadKind::PreviousToken, tokens); },
                              "circuits::head_scores: the patterns [3, 4, 12, 12] hold nan at flat index 0");
}

BOOST_AUTO_TEST_CASE(bad_patterns_and_tokens_are_refused_by_name) {
  const Tensor tokens = tl_ref("tokens");
  const Tensor p = tl_ref("pattern.0");
  test_support::check_message([&] { circuits::head_scores(ag::narrow(p, 3, 0, 11), HeadKind::Induction, tokens); },
                              "circuits::head_scores: patterns [3, 4, 12, 11] are over 11 positions but tokens [3, 12] over 12");
  test_support::check_message([&] { circuits::head_scores(ag::narrow(p, 0, 0, 2), HeadKind::Induction, tokens); },
                              "patterns [2, 4, 12, 12] are for 2 sequences but tokens [3, 12] hold 3");
  test_support::check_message([&] { circuits::detection_pattern(HeadKind::Induction, ag::tensor({1.5, 2}, {2}, Dtype::Float64)); },
                              "circuits::detection_pattern: tokens must be integers of magnitude at most 2^53 "
                              "(Int64 tokens may be larger), got 1.5 at [0, 0]");
  test_support::check_message([&] { circuits::detection_pattern(HeadKind::Induction, ag::tensor({1e20, 3e20}, {2}, Dtype::Float64)); },
                              "got 1e+20 at [0, 0]");
  // Int64 ids are compared as integers: 2^53 and 2^53 + 1 are different tokens.
  const Tensor big = ag::tensor(std::vector<std::int64_t>{std::int64_t{1} << 53, (std::int64_t{1} << 53) + 1}, {2});
  BOOST_TEST(circuits::detection_pattern(HeadKind::DuplicateToken, big).to_vector() == std::vector<double>(4, 0.0),
             boost::test_tools::per_element());
  // No sequence or no position to score; a detection pattern of other values than 0 and 1.
  test_support::check_message([&] { circuits::head_scores(ag::narrow(p, 0, 0, 0), ag::ones({12, 12}, Dtype::Float64)); },
                              "circuits::head_scores: patterns [0, 4, 12, 12] hold no sequence to score");
  test_support::check_message([&] { circuits::head_scores(ag::narrow(p, 0, 0, 1), ag::full({12, 12}, 5.0, Dtype::Float64)); },
                              "circuits::head_scores: a detection pattern holds 0s and 1s, but [12, 12] holds 5 at flat index 0");
  // All of a head's attention on key 0 and the current token: nothing left to score.
  std::vector<double> z(2 * 1 * 2 * 2, 0.0);
  z[0] = 1;      // sequence 0, query 0 -> key 0
  z[2] = 1;      // query 1 -> key 0
  z[4] = 1;      // sequence 1, query 0 -> key 0
  z[7] = 1;      // query 1 -> key 1
  const Tensor blocked = ag::tensor(z, {2, 1, 2, 2}, Dtype::Float64);
  test_support::check_message([&] {
    circuits::head_scores(blocked, HeadKind::PreviousToken, ag::tensor(std::vector<std::int64_t>{0, 1, 0, 1}, {2, 2}),
                          {.exclude_bos = true, .exclude_current_token = true});
  }, "circuits::head_scores: head 0 of sequence 0 puts no attention on the entries scored");
}

BOOST_AUTO_TEST_SUITE_END()
