// nn::TransformerLM against TransformerLens 3.9's HookedTransformer, in float64, on the values that
// tests/data/transformer_lens/make_lm_reference.py computed with TL: four 2-layer models (A
// attention-only with LayerNorm, B MLP with gelu, C MLP with relu and no normalisation, D MLP with
// gelu_new), every weight random and no bias zero nor gain one, run on one fixed batch of tokens.
// Each model is TL's state dict loaded with nn::load_transformer_lens_state_dict; then
//   - logits and loss, and every hook point TL's run_with_cache gives, equal TL's to 1e-9,
//   - the loss's gradient at every hook point (run_with_cache with backward; TL's incl_bwd) too,
//     ln_1's points included (per q/k/v input when the block normalises them as one stack),
//   - nn::study::activation_patching of each layer's z, and nn::circuits::z_patching_sweep,
//     equal TL's patching functions to 1e-9,
//   - nn::circuits' decompose_resid, stack_head_results, accumulated_resid and logit_lens equal
//     TL's cache functions,
//   - transformer_lens_state_dict gives TL's state dict back exactly,
//   - a state dict with a tensor of the wrong shape, a missing tensor or an unknown tensor is
//     refused, naming the tensor, and leaves the model as it was,
// with negative controls showing that the checks can fail.
// Tolerance: every comparison is |ours - TL's| <= 1e-9 · (1 + |TL's|), element by element: an
// absolute 1e-9 for values up to 1 in size, a relative one beyond (logits, scores and LayerNorm
// scales are of order 1 to 10 here).
#define BOOST_TEST_MODULE transformer_lens_parity
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

#include "test_support.hpp"

namespace ag = autograd;
using ag::Dtype;
using ag::Tensor;
using test_support::check_throws;

namespace {

constexpr std::int64_t L = 2, H = 4, E = 16, Dh = 4, V = 12, N_CTX = 16, D_MLP = 32, B = 2, T = 10;
constexpr double kTol = 1e-9;
const std::vector<std::string> kConfigs = {"A", "B", "C", "D"};

const std::map<std::string, Tensor>& reference() {
  static const std::map<std::string, Tensor> ref = [] {
    std::map<std::string, Tensor> m;
    for (auto& [name, t] : nn::load_safetensors(HEADGRAD_TEST_DATA_DIR "/transformer_lens/lm_reference.safetensors").tensors)
      m.emplace(name, t);
    return m;
  }();
  return ref;
}

const Tensor& fixture(const std::string& name) {
  const auto& m = reference();
  const auto it = m.find(name);
  BOOST_REQUIRE_MESSAGE(it != m.end(), "no reference tensor " << name);
  return it->second;
}

// The fixture's tensors named prefix + x, as (x, tensor), in name order.
nn::NamedTensors with_prefix(const std::string& prefix) {
  nn::NamedTensors out;
  for (const auto& [name, t] : reference())
    if (name.starts_with(prefix)) out.emplace_back(name.substr(prefix.size()), t);
  return out;
}

bool is_tl_buffer(const std::string& name) { return name.ends_with(".attn.mask") || name.ends_with(".attn.IGNORE"); }

// HookedTransformerConfig of make_lm_reference.py's CONFIGS, as ours.
nn::TransformerLMConfig config(const std::string& which) {
  nn::TransformerLMConfig c;
  c.n_layers = L;
  c.d_model = E;
  c.n_heads = H;
  c.d_head = Dh;
  c.d_vocab = V;
  c.n_ctx = N_CTX;
  c.positional_embedding = nn::PositionalEmbedding::Learned;
  c.layer_norm_eps = 1e-5;  // TL's default eps
  c.dtype = Dtype::Float64;
  c.d_mlp = which == "A" ? 0 : D_MLP;
  c.normalization = which == "C" ? nn::Normalization::None : nn::Normalization::LayerNorm;
  c.activation = which == "C" ? nn::Activation::Relu : which == "D" ? nn::Activation::GeluTanh : nn::Activation::Gelu;
  return c;
}

std::unique_ptr<nn::TransformerLM> tl_model(const std::string& which) {
  auto m = std::make_unique<nn::TransformerLM>(config(which));
  nn::load_transformer_lens_state_dict(*m, with_prefix(which + ".sd."));
  return m;
}

const Tensor& tokens() { return fixture("tokens"); }

// Largest |a - b| / (1 + |b|) over the elements of tensors of one shape (b is TL's).
double worst(const Tensor& a, const Tensor& b) {
  BOOST_REQUIRE_MESSAGE(a.shape() == b.shape(), ag::shape_str(a.shape()) << " vs " << ag::shape_str(b.shape()));
  const auto x = a.to_vector(), y = b.to_vector();
  double w = 0;
  for (std::size_t i = 0; i < x.size(); ++i) w = std::max(w, std::abs(x[i] - y[i]) / (1 + std::abs(y[i])));
  return w;
}

void check_close(const std::string& what, const Tensor& ours, const Tensor& tl, double tol = kTol) {
  const double w = worst(ours, tl);
  BOOST_TEST_MESSAGE(what << ": worst error " << w);
  BOOST_TEST(w <= tol, what << ": worst error " << w << " > " << tol);
}

double worst_scalar(double ours, double tl) { return std::abs(ours - tl) / (1 + std::abs(tl)); }

// ---- TL's hook points and ours ----
// How a TL point's value compares with ours.
enum class Layout {
  Same,         // the same shape and values
  PerHead,      // TL's split-qkv points (B, T, H, X), each head's copy the same; the fixture keeps
                // one, (B, T, 1, X) (make_lm_reference.py checks that every head's slice equals it),
                // and for ln1's gradients one per call, (B, T, 3, X) (q's, k's, v's, each summed
                // over the heads). Ours are (B, T, X), shared by the heads; ln_1's may be per
                // input, (B, T, 3, X), when the block normalises q, k and v as one stack. Against
                // a single ours, TL's calls are summed (the gradient of the stream they share)
  HeadsSecond,  // TL (B, T, H, X), ours (B, H, T, X)
  Causal,       // attention scores (B, H, T, T): TL's are -inf above the diagonal, ours masked
                // however the core masks; compared on the causal lower triangle (s <= t) alone
};

struct Mapped {
  std::string ours;
  Layout layout = Layout::Same;
};

// TL's LayerNorm hook_normalized is (x - mean) / scale, before w and b; our LayerNorm's "normalized"
// point is its output, after weight and bias (nn/layers.hpp). The two are compared through the
// affine map: ours against TL's value · weight + bias, with our (loaded, hence TL's) weight and bias.
// TL's unembed.hook_in, ln_final's output, is then our ln_final.normalized itself.
//
// TL's hook point -> ours, for a model of config `c`; nullopt for a TL point we have no name for.
// Our points with no TL counterpart: blocks.i.attn.raw_scores (q · kᵀ before scaling),
// blocks.i.attn.concat (the heads side by side, W_O's input), blocks.i.attn.out (the attention
// layer's output, the value of blocks.i.attn_out). TL points with no counterpart here: none of
// those run_with_cache gives for these configs (hook_attn_in, hook_mlp_in, attn.hook_rot_q/k and
// the shortformer points exist only under other config flags).
std::optional<Mapped> ours_for(const std::string& tl, const nn::TransformerLMConfig& c) {
  static const std::map<std::string, Mapped> top = {
      {"hook_embed", {"embed_out"}},
      {"hook_pos_embed", {"pos_embed_out"}},
      {"ln_final.hook_scale", {"ln_final.scale"}},
      {"ln_final.hook_normalized", {"ln_final.normalized"}},
      {"unembed.hook_out", {"logits"}},
  };
  static const std::map<std::string, Mapped> block = {
      {"hook_resid_pre", {"resid_pre"}},
      {"hook_q_input", {"q_input", Layout::PerHead}},
      {"hook_k_input", {"k_input", Layout::PerHead}},
      {"hook_v_input", {"v_input", Layout::PerHead}},
      {"ln1.hook_scale", {"ln_1.scale", Layout::PerHead}},
      {"ln1.hook_normalized", {"ln_1.normalized", Layout::PerHead}},
      {"attn.hook_q", {"attn.q", Layout::HeadsSecond}},
      {"attn.hook_k", {"attn.k", Layout::HeadsSecond}},
      {"attn.hook_v", {"attn.v", Layout::HeadsSecond}},
      {"attn.hook_attn_scores", {"attn.attn_scores", Layout::Causal}},
      {"attn.hook_pattern", {"attn.pattern"}},
      {"attn.hook_z", {"attn.z", Layout::HeadsSecond}},
      {"attn.hook_result", {"attn.result", Layout::HeadsSecond}},
      {"hook_attn_out", {"attn_out"}},
      {"hook_resid_mid", {"resid_mid"}},
      {"ln2.hook_scale", {"ln_2.scale"}},
      {"ln2.hook_normalized", {"ln_2.normalized"}},
      {"mlp.hook_pre", {"mlp_pre"}},
      {"mlp.hook_post", {"mlp_hidden"}},
      {"hook_mlp_out", {"mlp_out"}},
      {"hook_resid_post", {"resid_post"}},
  };
  if (const auto it = top.find(tl); it != top.end()) return it->second;
  // unembed's input: ln_final's output, or the last block's output without normalisation.
  if (tl == "unembed.hook_in") {
    if (c.normalization == nn::Normalization::None) return Mapped{fmt::format("blocks.{}.resid_post", c.n_layers - 1)};
    return Mapped{"ln_final.normalized"};
  }
  static const std::regex blocks(R"(blocks\.(\d+)\.(.+))");
  std::smatch m;
  if (!std::regex_match(tl, m, blocks)) return std::nullopt;
  const auto it = block.find(m[2].str());
  if (it == block.end()) return std::nullopt;
  return Mapped{"blocks." + m[1].str() + "." + it->second.ours, it->second.layout};
}

// Our points that no TL point maps to (listed above), by their name within a block.
bool ours_only(const std::string& name) {
  return name.ends_with(".attn.raw_scores") || name.ends_with(".attn.concat") || name.ends_with(".attn.out");
}

// The LayerNorm whose "normalized" point `ours` is ("blocks.0.ln_1.normalized", "ln_final.normalized"),
// or null for any other point.
const nn::LayerNorm* layer_norm_of(const nn::TransformerLM& m, const std::string& ours) {
  if (ours == "ln_final.normalized") return &m.ln_final();
  static const std::regex block(R"(blocks\.(\d+)\.ln_([12])\.normalized)");
  std::smatch g;
  if (!std::regex_match(ours, g, block)) return nullptr;
  const auto& b = m.block(std::stoll(g[1].str()));
  return g[2].str() == "1" ? &b.ln_1() : &b.ln_2();
}

// ours as TL lays the point out, and TL's value, both in the layout they are compared in.
// (Layout::Causal is for values: gradients are compared whole, 0 above the diagonal in both.)
std::pair<Tensor, Tensor> aligned(const Tensor& ours, const Tensor& tl, Layout layout) {
  switch (layout) {
    case Layout::Same: return {ours, tl};
    case Layout::PerHead: {
      BOOST_REQUIRE_MESSAGE(tl.dim() == 4 && (tl.size(2) == 1 || tl.size(2) == 3),
                            "TL's per-head point " << ag::shape_str(tl.shape()));
      if (ours.dim() == 3) return {ours, ag::sum(tl, 2)};  // (B, T, X)
      BOOST_REQUIRE_MESSAGE(ours.dim() == 4 && ours.size(2) == 3, "our per-input point " << ag::shape_str(ours.shape()));
      return {ours, tl.size(2) == 3 ? tl : ag::expand(tl, ours.shape())};
    }
    case Layout::HeadsSecond: return {ag::permute(ours, {0, 2, 1, 3}).clone(), tl};
    case Layout::Causal: {
      BOOST_REQUIRE(ours.shape() == tl.shape());
      const std::int64_t t_len = tl.size(2), s_len = tl.size(3);
      const auto o = ours.to_vector(), r = tl.to_vector();
      std::vector<double> lo, lr;
      for (std::size_t i = 0; i < r.size(); ++i) {
        const auto s = static_cast<std::int64_t>(i) % s_len, t = static_cast<std::int64_t>(i) / s_len % t_len;
        if (s <= t) {
          lo.push_back(o[i]);
          lr.push_back(r[i]);
        } else {
          BOOST_TEST((std::isinf(r[i]) && r[i] < 0), "TL's score above the diagonal is " << r[i]);
        }
      }
      const auto n = static_cast<std::int64_t>(lr.size());
      return {ag::tensor(lo, {n}, Dtype::Float64), ag::tensor(lr, {n}, Dtype::Float64)};
    }
  }
  return {ours, tl};
}

// The fixture's hook-point names for config `which` (TL's names).
std::vector<std::string> tl_points(const std::string& which) {
  std::vector<std::string> out;
  for (const auto& [name, t] : with_prefix(which + ".act.")) out.push_back(name);
  return out;
}

// The metric make_lm_reference.py patches with: the logit of a fixed token at the last position,
// averaged over the batch.
Tensor metric(const nn::TransformerLM& m, const Tensor& input) {
  const std::int64_t tok = fixture("B.patch.metric_token").item<std::int64_t>();
  const Tensor logits = m.forward(input);
  return ag::mean(ag::narrow(ag::narrow(logits, 1, logits.size(1) - 1, 1), 2, tok, 1));
}

std::map<std::string, std::vector<double>> parameter_values(const nn::Module& m) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& [name, p] : m.named_parameters()) out.emplace(name, p.to_vector());
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_fixture_is_transformer_lens_3_9) {
  const auto data = nn::load_safetensors(HEADGRAD_TEST_DATA_DIR "/transformer_lens/lm_reference.safetensors");
  BOOST_TEST(data.metadata.at("transformer_lens") == "3.9.0");
  BOOST_TEST(ag::shape_str(tokens().shape()) == ag::shape_str({B, T}));
  BOOST_TEST((tokens().dtype() == Dtype::Int64));
  // The logit lens is kept for a later test; its labels are in the metadata, in TL's order.
  BOOST_TEST(data.metadata.at("B.lens.accumulated_resid.labels") == "0_pre,0_mid,1_pre,1_mid,final_post");
  BOOST_TEST(data.metadata.at("B.lens.stack_head_results.labels") == "L0H0,L0H1,L0H2,L0H3,L1H0,L1H1,L1H2,L1H3");
}

BOOST_AUTO_TEST_CASE(logits_and_loss_equal_transformer_lens) {
  for (const auto& which : kConfigs) {
    BOOST_TEST_CONTEXT("config " << which) {
      const auto m = tl_model(which);
      check_close(which + " logits", m->forward(tokens()), fixture(which + ".logits"));
      const double loss = m->loss(tokens()).item(), tl = fixture(which + ".loss").item();
      BOOST_TEST_MESSAGE(which << " loss " << loss << " vs TL " << tl << ": error " << worst_scalar(loss, tl));
      BOOST_TEST(worst_scalar(loss, tl) <= kTol, which << " loss " << loss << " vs TL's " << tl);
    }
  }
}

BOOST_AUTO_TEST_CASE(every_hook_point_equals_transformer_lens) {
  for (const auto& which : kConfigs) {
    BOOST_TEST_CONTEXT("config " << which) {
      const auto m = tl_model(which);
      const nn::ActivationCache cache = nn::run_with_cache(*m, [&] { return m->forward(tokens()); });
      check_close(which + " cached logits", cache.output, fixture(which + ".logits"));
      const auto points = tl_points(which);
      BOOST_TEST(points.size() >= (which == "D" ? 4u : 20u));
      std::set<std::string> mapped;
      for (const auto& tl : points) {
        const auto o = ours_for(tl, m->config());
        BOOST_TEST(o.has_value(), "TL's hook point " << tl << " has no counterpart");
        if (!o) continue;
        BOOST_TEST_REQUIRE(cache.contains(o->ours), "our hook point " << o->ours << " (TL's " << tl << ") is not cached");
        auto [ours, theirs] = aligned(cache[o->ours], fixture(which + ".act." + tl), o->layout);
        if (const nn::LayerNorm* ln = tl != "unembed.hook_in" ? layer_norm_of(*m, o->ours) : nullptr)
          theirs = ag::add(ag::mul(theirs, ln->weight()), ln->bias());  // TL's is before w and b
        check_close(which + " " + tl + " vs " + o->ours, ours, theirs);
        mapped.insert(o->ours);
      }
      // The other way round: every point of ours that TL has is among those compared (D's
      // fixture keeps its MLP points alone).
      if (which != "D")
        for (const auto& name : cache.names())
          BOOST_TEST((mapped.count(name) || ours_only(name)), "our hook point " << name << " was not compared");
    }
  }
}

BOOST_AUTO_TEST_CASE(activation_patching_of_z_equals_transformer_lens) {
  const auto m = tl_model("B");
  const Tensor clean = tokens(), corrupted = fixture("corrupted_tokens");
  const auto run = [&](const Tensor& input) { return metric(*m, input); };
  const std::int64_t tok = fixture("B.patch.metric_token").item<std::int64_t>();
  const auto of_logits = [&](const Tensor& logits) {  // metric's, on logits (B, T or 1, V)
    return ag::mean(ag::narrow(ag::narrow(logits, 1, logits.size(1) - 1, 1), 2, tok, 1));
  };
  const auto all_pos = fixture("B.patch.head_out_all_pos").to_vector();  // (L, H)
  const auto by_pos = fixture("B.patch.head_out_by_pos").to_vector();    // (L, T, H)
  // The hooked patching of each layer, and the sweep reading every position or the last one.
  std::map<std::string, std::vector<nn::study::PatchingResult>> ways;
  for (std::int64_t l = 0; l < L; ++l)
    ways["activation_patching"].push_back(
        nn::study::activation_patching(*m, fmt::format("blocks.{}.attn.z", l), run, clean, corrupted));
  ways["z_patching_sweep"] = nn::circuits::z_patching_sweep(*m, of_logits, clean, corrupted);
  ways["z_patching_sweep, last position"] = nn::circuits::z_patching_sweep(
      *m, of_logits, clean, corrupted, {.reads = nn::circuits::MetricReads::LastPosition});
  for (const auto& [way, results] : ways) {
    BOOST_REQUIRE_EQUAL(results.size(), static_cast<std::size_t>(L));
    for (std::int64_t l = 0; l < L; ++l) {
      const nn::study::PatchingResult& r = results[static_cast<std::size_t>(l)];
      BOOST_TEST(worst_scalar(r.clean_metric, fixture("B.patch.clean_metric").item()) <= kTol);
      BOOST_TEST(worst_scalar(r.corrupted_metric, fixture("B.patch.corrupted_metric").item()) <= kTol);
      BOOST_REQUIRE_EQUAL(r.per_head.size(), static_cast<std::size_t>(H));
      double w = 0;
      for (std::int64_t h = 0; h < H; ++h) {
        const double tl = all_pos[static_cast<std::size_t>(l * H + h)];
        w = std::max(w, worst_scalar(r.per_head[static_cast<std::size_t>(h)], tl));
        BOOST_REQUIRE_EQUAL(r.per_head_position[static_cast<std::size_t>(h)].size(), static_cast<std::size_t>(T));
        for (std::int64_t t = 0; t < T; ++t)
          w = std::max(w, worst_scalar(r.per_head_position[static_cast<std::size_t>(h)][static_cast<std::size_t>(t)],
                                       by_pos[static_cast<std::size_t>((l * T + t) * H + h)]));
      }
      BOOST_TEST_MESSAGE(way << ", layer " << l << ": worst error " << w);
      BOOST_TEST(w <= kTol, way << ", layer " << l << ": worst error " << w);
      // Negative control: the other layer's TL values are far from these.
      double other = 0;
      for (std::int64_t h = 0; h < H; ++h)
        other = std::max(other, std::abs(r.per_head[static_cast<std::size_t>(h)] -
                                         all_pos[static_cast<std::size_t>((1 - l) * H + h)]));
      BOOST_TEST(other > 1e-3, way << ", layer " << l << " is indistinguishable from layer " << 1 - l);
    }
  }
}

BOOST_AUTO_TEST_CASE(the_state_dict_comes_back_exactly) {
  for (const auto& which : kConfigs) {
    BOOST_TEST_CONTEXT("config " << which) {
      const auto m = tl_model(which);
      std::map<std::string, Tensor> ours;
      for (const auto& [name, t] : nn::transformer_lens_state_dict(*m)) ours.emplace(name, t);
      std::size_t compared = 0;
      for (const auto& [name, t] : with_prefix(which + ".sd.")) {
        if (is_tl_buffer(name)) continue;
        const auto it = ours.find(name);
        BOOST_TEST_REQUIRE((it != ours.end()), "transformer_lens_state_dict lacks " << name);
        BOOST_TEST(ag::shape_str(it->second.shape()) == ag::shape_str(t.shape()), name);
        if (it->second.shape() == t.shape()) BOOST_TEST(test_support::max_abs_diff(it->second, t) == 0.0, name);
        ++compared;
      }
      BOOST_TEST(ours.size() == compared, "ours has " << ours.size() << " tensors, TL's " << compared);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_bad_state_dict_is_refused_naming_the_tensor_and_changes_nothing) {
  // The model holds config B's weights; every state dict offered has all its tensors moved by 1, so
  // that a partial copy before the refusal would show.
  const auto m = tl_model("B");
  const auto before = parameter_values(*m);
  nn::NamedTensors moved;
  for (const auto& [name, t] : with_prefix("B.sd."))
    moved.emplace_back(name, is_tl_buffer(name) ? t : ag::add(t, 1.0));
  const auto without = [&](const std::string& gone) {
    nn::NamedTensors out;
    for (const auto& [name, t] : moved)
      if (name != gone) out.emplace_back(name, t);
    return out;
  };
  const auto replaced = [&](const std::string& which, const Tensor& value) {
    nn::NamedTensors out = moved;
    for (auto& [name, t] : out)
      if (name == which) t = value;
    return out;
  };
  const auto unchanged = [&](const std::string& what) {
    BOOST_TEST((parameter_values(*m) == before), what << " changed the model");
  };
  // The wrong shape: blocks.1.attn.W_Q as (H, d_head, E).
  check_throws<std::invalid_argument>(
      [&] { nn::load_transformer_lens_state_dict(*m, replaced("blocks.1.attn.W_Q", ag::zeros({H, Dh, E}, Dtype::Float64))); },
      {"blocks.1.attn.W_Q", "[4, 4, 16]", "[4, 16, 4]"});
  unchanged("a wrong shape");
  // A missing tensor (the last one checked, so that every other has been taken by then).
  check_throws<std::invalid_argument>([&] { nn::load_transformer_lens_state_dict(*m, without("unembed.b_U")); },
                                      {"unembed.b_U", "missing"});
  unchanged("a missing tensor");
  check_throws<std::invalid_argument>([&] { nn::load_transformer_lens_state_dict(*m, without("blocks.0.ln1.b")); },
                                      {"blocks.0.ln1.b", "missing"});
  unchanged("a missing LayerNorm bias");
  // An unknown tensor: a third layer, and a LayerNorm in a model without normalisation.
  nn::NamedTensors extra = moved;
  extra.emplace_back("blocks.2.attn.W_Q", ag::zeros({H, E, Dh}, Dtype::Float64));
  check_throws<std::invalid_argument>([&] { nn::load_transformer_lens_state_dict(*m, extra); }, {"blocks.2.attn.W_Q"});
  unchanged("an unknown tensor");
  nn::TransformerLM c(config("C"));
  const auto c_before = parameter_values(c);
  nn::NamedTensors c_extra = with_prefix("C.sd.");
  c_extra.emplace_back("blocks.0.ln1.w", ag::ones({E}, Dtype::Float64));
  check_throws<std::invalid_argument>([&] { nn::load_transformer_lens_state_dict(c, c_extra); }, {"blocks.0.ln1.w"});
  BOOST_TEST((parameter_values(c) == c_before), "an unknown LayerNorm changed the model");
  // The control: the same moved state dict, whole, loads and changes every parameter.
  nn::load_transformer_lens_state_dict(*m, moved);
  const auto after = parameter_values(*m);
  for (const auto& [name, v] : before) BOOST_TEST((after.at(name) != v), name << " did not change");
}

BOOST_AUTO_TEST_CASE(negative_controls_a_wrong_layout_or_a_small_change_is_seen) {
  const Tensor& tl_logits = fixture("B.logits");
  // W_Q with its heads in reverse order (b_Q as it was): the shapes fit, the logits do not.
  {
    nn::NamedTensors sd = with_prefix("B.sd.");
    for (auto& [name, t] : sd)
      if (name.ends_with(".attn.W_Q")) {
        std::vector<Tensor> heads;
        for (std::int64_t h = H - 1; h >= 0; --h) heads.push_back(ag::narrow(t, 0, h, 1));
        t = ag::cat(heads, 0);
      }
    nn::TransformerLM m(config("B"));
    nn::load_transformer_lens_state_dict(m, sd);
    const double d = test_support::max_abs_diff(m.forward(tokens()), tl_logits);
    BOOST_TEST_MESSAGE("W_Q heads reversed: logits differ by " << d);
    BOOST_TEST(d > 1e-3, "reversing W_Q's heads changed the logits by only " << d);
  }
  // W_Q (H, E, d) read as if it were (E, H, d) flattened the other way: a transposed layout.
  {
    nn::NamedTensors sd = with_prefix("B.sd.");
    for (auto& [name, t] : sd)
      if (name.ends_with(".attn.W_Q")) t = ag::reshape(ag::permute(ag::reshape(t, {E, H, Dh}), {1, 0, 2}), {H, E, Dh});
    nn::TransformerLM m(config("B"));
    nn::load_transformer_lens_state_dict(m, sd);
    const double d = test_support::max_abs_diff(m.forward(tokens()), tl_logits);
    BOOST_TEST_MESSAGE("W_Q heads transposed: logits differ by " << d);
    BOOST_TEST(d > 1e-3, "transposing W_Q's layout changed the logits by only " << d);
  }
  // One bias moved by 1e-6: the 1e-9 check sees it.
  {
    nn::NamedTensors sd = with_prefix("B.sd.");
    for (auto& [name, t] : sd)
      if (name == "blocks.0.attn.b_V") t = ag::add(t, 1e-6);
    nn::TransformerLM m(config("B"));
    nn::load_transformer_lens_state_dict(m, sd);
    const double w = worst(m.forward(tokens()), tl_logits);
    BOOST_TEST_MESSAGE("b_V + 1e-6: worst logit error " << w);
    BOOST_TEST(w > kTol, "moving b_V by 1e-6 left the logits within " << kTol);
  }
  // Comparing a head-major point without its transpose fails (the mapping's layouts matter).
  {
    const auto m = tl_model("B");
    const nn::ActivationCache cache = nn::run_with_cache(*m, [&] { return m->forward(tokens()); },
                                                         {.names = {"blocks.0.attn.z"}});
    const Tensor ours = cache["blocks.0.attn.z"];  // (B, H, T, d) read as (B, T, H, d)
    const double w = worst(ag::reshape(ours, {B, T, H, Dh}), fixture("B.act.blocks.0.attn.hook_z"));
    BOOST_TEST(w > 1e-3, "z without its transpose is within " << w << " of TL's");
  }
  // TL's LayerNorm point compared as it is, without w and b, fails: the affine map matters.
  {
    const auto m = tl_model("B");
    const nn::ActivationCache cache = nn::run_with_cache(*m, [&] { return m->forward(tokens()); },
                                                         {.names = {"ln_final.normalized"}});
    const double w = worst(cache["ln_final.normalized"], fixture("B.act.ln_final.hook_normalized"));
    BOOST_TEST_MESSAGE("ln_final.normalized vs TL's hook_normalized without w and b: " << w);
    BOOST_TEST(w > 1e-3, "ln_final.normalized is within " << w << " of TL's value before w and b");
  }
  // A TL point with no counterpart is reported, not skipped.
  for (const char* tl : {"hook_tokens", "blocks.0.attn.hook_rot_q", "blocks.0.hook_attn_in", "blocks.0.mlp.hook_x"})
    BOOST_TEST(!ours_for(tl, config("B")).has_value(), tl << " was mapped");
}


namespace {

// Our gradients at the hook points of config B (d loss / d value, from run_with_cache with
// backward) against TL's, for the points `which` selects; returns how many were compared.
// TL's per-head points are summed over the heads in the fixture (the gradient with respect to the
// stream the heads share, which ours is), and its ln1 points over the q, k and v calls. Our
// LayerNorm's "normalized" is after weight and bias, so d loss / d (TL's, before them) is ours · weight.
std::size_t compare_gradients(const std::function<bool(const std::string&)>& which) {
  const auto m = tl_model("B");
  const nn::ActivationCache cache =
      nn::run_with_cache(*m, [&] { return m->loss(tokens()); }, {.backward = true});
  check_close("B cached loss", cache.output, fixture("B.loss"));
  std::size_t compared = 0;
  std::set<std::string> mapped;
  for (const auto& [tl, grad] : with_prefix("B.grad.")) {
    if (!which(tl)) continue;
    const auto o = ours_for(tl, m->config());
    BOOST_TEST(o.has_value(), "TL's hook point " << tl << " has no counterpart");
    if (!o) continue;
    mapped.insert(o->ours);
    BOOST_TEST(cache.has_grad(o->ours), "no gradient reached our " << o->ours << " (TL's " << tl << ")");
    if (!cache.has_grad(o->ours)) continue;
    auto [ours, theirs] = aligned(cache.grad(o->ours), grad, o->layout == Layout::Causal ? Layout::Same : o->layout);
    if (const nn::LayerNorm* ln = tl != "unembed.hook_in" ? layer_norm_of(*m, o->ours) : nullptr)
      ours = ag::mul(ours, ln->weight());
    check_close("B d loss / d " + tl + " vs " + o->ours, ours, theirs);
    ++compared;
  }
  for (const auto& name : cache.names())
    if (which(name) && cache.has_grad(name))
      BOOST_TEST((mapped.count(name) || ours_only(name)), "our gradient at " << name << " was not compared");
  return compared;
}

bool ln_1_point(const std::string& name) { return name.find(".ln1.") != std::string::npos || name.find(".ln_1.") != std::string::npos; }

}  // namespace

BOOST_AUTO_TEST_CASE(loss_gradients_at_every_hook_point_equal_transformer_lens) {
  const std::size_t n = compare_gradients([](const std::string& name) { return !ln_1_point(name); });
  BOOST_TEST(n >= 40u);
  // Negative control: the gradient at ln_2's output taken for the one before its weight fails.
  const auto m = tl_model("B");
  const nn::ActivationCache cache = nn::run_with_cache(*m, [&] { return m->loss(tokens()); },
                                                       {.names = {"blocks.0.ln_2.normalized"}, .backward = true});
  const double w = worst(cache.grad("blocks.0.ln_2.normalized"), fixture("B.grad.blocks.0.ln2.hook_normalized"));
  BOOST_TEST(w > 1e-6, "the gradient without ln_2's weight is within " << w << " of TL's");
}

// With the q/k/v inputs watched by backward hooks (as run_with_cache with backward does),
// TransformerBlock normalises q, k and v as one (..., 3, E) stack through ln_1: its points get the
// gradient per input, TL's per call.
BOOST_AUTO_TEST_CASE(ln_1_gradients_equal_transformer_lens) {
  const std::size_t n = compare_gradients(ln_1_point);
  BOOST_TEST(n == 4u);
}


namespace {

std::vector<std::string> lens_labels(const std::string& name) {
  const auto data = nn::load_safetensors(HEADGRAD_TEST_DATA_DIR "/transformer_lens/lm_reference.safetensors");
  std::vector<std::string> out;
  const std::string s = data.metadata.at("B.lens." + name + ".labels");
  for (std::size_t at = 0; at <= s.size();) {
    const std::size_t comma = std::min(s.find(',', at), s.size());
    out.push_back(s.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

Tensor component(const Tensor& stack, std::int64_t i) { return ag::squeeze(ag::narrow(stack, 0, i, 1), 0); }

}  // namespace

// TL's cache.decompose_resid(apply_ln=True) and stack_head_results(apply_ln=True) on config B's
// clean run (centred, divided by the cached ln_final scale) against nn::circuits' on ours.
BOOST_AUTO_TEST_CASE(decomposed_and_per_head_residual_stacks_equal_transformer_lens) {
  const auto m = tl_model("B");
  const nn::ActivationCache cache = nn::run_with_cache(*m, [&] { return m->forward(tokens()); });
  const std::vector<std::pair<std::string, nn::circuits::ResidualStack>> stacks = {
      {"decompose_resid", nn::circuits::decompose_resid(*m, cache, -1, true)},
      {"stack_head_results", nn::circuits::stack_head_results(*m, cache, -1, true)},
  };
  for (const auto& [name, s] : stacks) {
    BOOST_TEST(s.labels == lens_labels(name), name << " labels");
    check_close("B " + name, s.stack, fixture("B.lens." + name));
  }
  // Negative control: without apply_ln the components are far from TL's.
  const double w = worst(nn::circuits::decompose_resid(*m, cache, -1, false).stack, fixture("B.lens.decompose_resid"));
  BOOST_TEST(w > 1e-3, "decompose_resid without apply_ln is within " << w << " of TL's with it");
}

// TL 3.9's cache.accumulated_resid(apply_ln=True) for the final layer (layer None) is the logit
// lens's input: ln_final applied to each accumulated stream with that stream's own statistics,
// weight and bias included (ActivationCache.apply_ln_to_stack with recompute_ln=True), not the
// stream divided by the cached final scale. Ours: accumulated_resid's raw streams through
// ln_final, and logit_lens, which applies the same.
BOOST_AUTO_TEST_CASE(the_accumulated_residual_stream_and_logit_lens_equal_transformer_lens) {
  const auto m = tl_model("B");
  const nn::ActivationCache cache = nn::run_with_cache(*m, [&] { return m->forward(tokens()); });
  const nn::circuits::ResidualStack acc = nn::circuits::accumulated_resid(*m, cache, -1, true, false);
  BOOST_TEST(acc.labels == lens_labels("accumulated_resid"));
  const Tensor& tl = fixture("B.lens.accumulated_resid");  // (5, B, T, E)
  BOOST_REQUIRE_EQUAL(acc.stack.size(0), tl.size(0));
  ag::TensorList normed;
  for (std::int64_t i = 0; i < acc.stack.size(0); ++i) normed.push_back(m->ln_final().forward(component(acc.stack, i)));
  check_close("B accumulated_resid through ln_final", ag::stack(normed, 0), tl);
  // The logit lens: TL's stack through the unembedding (W_U, b_U).
  const Tensor tl_lens = ag::add(ag::matmul(tl, m->W_U()), m->b_U());
  check_close("B logit_lens", nn::circuits::logit_lens(*m, acc), tl_lens);
  // Its last component is the model's logits.
  check_close("B logit_lens final_post", component(tl_lens, tl.size(0) - 1), fixture("B.logits"));
}

// circuits::accumulated_resid with apply_ln up to the final layer: TL 3.9's stack itself.
BOOST_AUTO_TEST_CASE(accumulated_resid_with_apply_ln_equals_transformer_lens_3_9) {
  const auto m = tl_model("B");
  const nn::ActivationCache cache = nn::run_with_cache(*m, [&] { return m->forward(tokens()); });
  check_close("B accumulated_resid(apply_ln)", nn::circuits::accumulated_resid(*m, cache, -1, true, true).stack,
              fixture("B.lens.accumulated_resid"));
}
