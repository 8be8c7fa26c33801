// Writes a page with every kind of nn::viewer picture, for the browser test "viewer"
// (scripts/test_browser.sh, tests/browser/viewer.expect): the attention patterns of a random
// 2-layer TransformerLM over 6 named tokens, a heatmap with both signs, a line chart with a mark
// and a table. Usage: viewer_page OUT.html
#include <cstdio>
#include <string>
#include <vector>

#include <nn/nn.hpp>

namespace ag = autograd;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT.html\n", argv[0]);
    return 2;
  }
  ag::Generator gen(3);
  nn::TransformerLM model({.n_layers = 2, .d_model = 16, .n_heads = 2, .d_vocab = 10, .n_ctx = 8}, gen);
  const ag::Tensor tokens = ag::tensor(std::vector<std::int64_t>{1, 4, 1, 5, 9, 2}, {1, 6});
  const nn::ActivationCache cache = nn::run_with_cache(model, [&] { return model.forward(tokens); });
  const std::vector<std::string> words = {"the", "<cat>", "sat", "\"on\"", "a&b", "mat"};
  nn::viewer::Page page("nn::viewer test page");
  page.section("Layer 0").attention_patterns(cache["blocks.0.attn.pattern"], words, "L0");
  page.section("Layer 1").attention_patterns(cache["blocks.1.attn.pattern"], words, "L1");
  page.section("Patching")
      .heatmap({.title = "signed values", .values = {{-2.0, 0.5}, {0.25, 1.0}}, .row_labels = {"L0", "L1"},
                .col_labels = {"H0", "H1"}, .row_axis = "layer", .col_axis = "head", .value_name = "metric change"});
  page.section("Curves")
      .line_chart({.title = "loss", .series = {{"train", {0, 1, 2, 3}, {3.0, 2.0, 1.5, 1.4}}}, .x_axis = "step",
                   .y_axis = "loss", .x_labels = {}, .marks = {2}})
      .table({{"head", "score"}, {"L0H1", "0.61"}});
  page.save(argv[1]);
  return 0;
}
