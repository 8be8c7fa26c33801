#include "grokking.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numbers>
#include <numeric>
#include <random>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_checks.hpp"

namespace grokking {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

bool is_prime(std::int64_t n) {
  if (n < 2) return false;
  for (std::int64_t d = 2; d * d <= n; ++d)
    if (n % d == 0) return false;
  return true;
}

// Every pair as "a b =" (p², 3) Int64, row a·p + b, and its label (a + b) mod p.
struct Data {
  ag::Tensor tokens, labels;             // all pairs
  std::vector<std::int64_t> train, test;  // row indices
  ag::Tensor train_tokens, train_labels, test_tokens, test_labels;
};

Data make_data(const Config& c) {
  const std::int64_t p = c.p, n = p * p;
  std::vector<std::int64_t> tokens, labels;
  tokens.reserve(static_cast<std::size_t>(3 * n));
  for (std::int64_t a = 0; a < p; ++a)
    for (std::int64_t b = 0; b < p; ++b) {
      tokens.insert(tokens.end(), {a, b, p});
      labels.push_back((a + b) % p);
    }
  Data d;
  d.tokens = ag::tensor(tokens, {n, 3});
  d.labels = ag::tensor(labels, {n});
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  std::mt19937_64 rng(c.seed * 0x9e3779b97f4a7c15ULL + 7);
  std::shuffle(order.begin(), order.end(), rng);
  const auto n_train = static_cast<std::size_t>(std::llround(c.train_fraction * static_cast<double>(n)));
  d.train.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n_train));
  d.test.assign(order.begin() + static_cast<std::ptrdiff_t>(n_train), order.end());
  d.train_tokens = ag::index_select(d.tokens, 0, d.train);
  d.train_labels = ag::index_select(d.labels, 0, d.train);
  d.test_tokens = ag::index_select(d.tokens, 0, d.test);
  d.test_labels = ag::index_select(d.labels, 0, d.test);
  return d;
}

// The logits at the "=" position, (N, p), in Float64: the loss is taken in double precision as
// the demo does (late in training the correct log-probabilities are within 1e-6 of 0).
// Only that position is computed after the attention's keys and values (TransformerLM::forward_last).
ag::Tensor answer_logits(const nn::TransformerLM& model, const ag::Tensor& tokens) {
  return model.forward_last(tokens).to(ag::Dtype::Float64);
}

double accuracy(const ag::Tensor& logits, const ag::Tensor& labels) {
  ag::NoGradGuard no_grad;
  const ag::Tensor right = ag::eq(ag::argmax(logits, 1), labels);
  return ag::mean(right.to(ag::Dtype::Float64)).item();
}

struct Measured {
  double loss = 0, accuracy = 0;
};

Measured measured(const ag::Tensor& logits, const ag::Tensor& labels) {
  ag::NoGradGuard no_grad;
  return {ag::cross_entropy(logits, labels).item(), accuracy(logits, labels)};
}

// Evaluations run without a graph over at most this many pairs at a time (all of p = 113's 12,769
// in one), so that a large p needs memory for one chunk's activations, not for all p² pairs'.
constexpr std::int64_t kChunk = 16384;

// The mean of per-chunk means, weighted by the chunks' sizes.
struct Mean {
  double sum = 0;
  std::int64_t count = 0, chunks = 0;
  double single = 0;  // the only chunk's mean, kept exact
  void add(double mean, std::int64_t n) {
    if (n == 0) return;
    sum += mean * static_cast<double>(n), count += n, single = mean, ++chunks;
  }
  double value() const { return chunks == 1 ? single : sum / static_cast<double>(count); }
};

Measured measure(const nn::TransformerLM& model, const ag::Tensor& tokens, const ag::Tensor& labels) {
  ag::NoGradGuard no_grad;
  Mean loss, right;
  for (std::int64_t start = 0; start < tokens.size(0); start += kChunk) {
    const std::int64_t n = std::min(kChunk, tokens.size(0) - start);
    const Measured m = measured(answer_logits(model, ag::narrow(tokens, 0, start, n)), ag::narrow(labels, 0, start, n));
    loss.add(m.loss, n), right.add(m.accuracy, n);
  }
  return {loss.value(), right.value()};
}

// The squared norm per frequency of W_E's first p rows in the Fourier basis: [0] the constant,
// [k] frequency k (its cos and sin rows together).
std::vector<double> fourier_power(const nn::TransformerLM& model, const ag::Tensor& basis) {
  ag::NoGradGuard no_grad;
  const std::int64_t p = basis.size(0);
  const ag::Tensor W_E = ag::narrow(model.embed().weight(), 0, 0, p).to(ag::Dtype::Float64);
  const std::vector<double> rows = ag::sum(ag::square(ag::matmul(basis, W_E)), {1}).to_vector();
  std::vector<double> power(static_cast<std::size_t>((p - 1) / 2 + 1), 0.0);
  power[0] = rows[0];
  for (std::int64_t k = 1; 2 * k < p + 1; ++k)
    power[static_cast<std::size_t>(k)] = rows[static_cast<std::size_t>(2 * k - 1)] + rows[static_cast<std::size_t>(2 * k)];
  return power;
}

// The unit vectors cos(w(a+b)) and sin(w(a+b)) over the pairs (row a·p + b), one column each per
// key frequency w: (p², 2K) Float64, orthonormal columns.
ag::Tensor sum_directions(std::int64_t p, const std::vector<std::int64_t>& keys) {
  const auto K = static_cast<std::int64_t>(keys.size());
  std::vector<double> v(static_cast<std::size_t>(p * p * 2 * K));
  for (std::int64_t k = 0; k < K; ++k) {
    double cos_norm = 0, sin_norm = 0;
    for (std::int64_t i = 0; i < p * p; ++i) {
      const double angle = 2 * std::numbers::pi * static_cast<double>(keys[static_cast<std::size_t>(k)]) *
                           static_cast<double>((i / p + i % p) % p) / static_cast<double>(p);
      const double c = std::cos(angle), s = std::sin(angle);
      v[static_cast<std::size_t>(i * 2 * K + 2 * k)] = c;
      v[static_cast<std::size_t>(i * 2 * K + 2 * k + 1)] = s;
      cos_norm += c * c, sin_norm += s * s;
    }
    for (std::int64_t i = 0; i < p * p; ++i) {
      v[static_cast<std::size_t>(i * 2 * K + 2 * k)] /= std::sqrt(cos_norm);
      v[static_cast<std::size_t>(i * 2 * K + 2 * k + 1)] /= std::sqrt(sin_norm);
    }
  }
  return ag::tensor(v, {p * p, 2 * K}, ag::Dtype::Float64);
}

// The model as it is now, from forwards over all p² pairs: its loss and accuracy on the training
// and on the test pairs, and the restricted and excluded losses (Nanda et al. 2023, section 5.1)
// from the MLP activations at the "=" position.
struct Snapshot {
  Measured train, test;
  double restricted_loss = 0, excluded_loss = 0;
};

// One chunk of pairs at the "=" position, Float64: the MLP's hidden activations (n, d_mlp), the
// residual stream before the MLP (n, d_model) and the logits (n, p).
struct LastPosition {
  ag::Tensor acts, resid_mid, logits;
};

LastPosition last_position(nn::TransformerLM& model, const ag::Tensor& tokens) {
  ag::NoGradGuard no_grad;
  const nn::ActivationCache cache =
      nn::run_with_cache(model, [&] { return model.forward(tokens); },
                         {.names = {"blocks.0.mlp_hidden", "blocks.0.resid_mid", "logits"}});
  const auto last = [](const ag::Tensor& t) {
    return ag::reshape(ag::narrow(t, 1, 2, 1), {t.size(0), t.size(2)}).to(ag::Dtype::Float64);
  };
  return {last(cache["blocks.0.mlp_hidden"]), last(cache["blocks.0.resid_mid"]), last(cache["logits"])};
}

// The restricted loss keeps each neuron's mean over all pairs plus its key-frequency components
// (the projection on the columns of `directions`, also over all pairs), so a first pass over the
// chunks sums those; a second pass takes the losses chunk by chunk (one chunk: no second forward).
Snapshot progress_measures(nn::TransformerLM& model, const Data& d, const ag::Tensor& directions) {
  ag::NoGradGuard no_grad;
  const std::int64_t n = d.tokens.size(0), chunks = (n + kChunk - 1) / kChunk;
  const auto chunk = [&](std::int64_t i) {
    const std::int64_t start = i * kChunk;
    return std::pair{start, std::min(kChunk, n - start)};
  };
  std::optional<LastPosition> kept;
  ag::Tensor sum_acts, projected, sum_logits;  // (1, d_mlp), (2K, d_mlp), (1, p)
  for (std::int64_t i = 0; i < chunks; ++i) {
    const auto [start, len] = chunk(i);
    LastPosition x = last_position(model, ag::narrow(d.tokens, 0, start, len));
    const ag::Tensor dirs = ag::narrow(directions, 0, start, len);
    const ag::Tensor a = ag::sum(x.acts, {0}, true), pr = ag::matmul(ag::transpose(dirs, 0, 1), x.acts),
                     l = ag::sum(x.logits, {0}, true);
    sum_acts = i == 0 ? a : ag::add(sum_acts, a);
    projected = i == 0 ? pr : ag::add(projected, pr);
    sum_logits = i == 0 ? l : ag::add(sum_logits, l);
    if (chunks == 1) kept = std::move(x);
  }
  const double count = static_cast<double>(n);
  const nn::Linear& fc_2 = model.block(0).fc_2();
  const ag::Tensor W_out = fc_2.weight().to(ag::Dtype::Float64), W_U = model.W_U().to(ag::Dtype::Float64);
  const ag::Tensor b_out = fc_2.bias().to(ag::Dtype::Float64), b_U = model.b_U().to(ag::Dtype::Float64);
  const ag::Tensor mean_acts = ag::div(sum_acts, count);
  // Restricted logits, shifted so that their mean over the pairs is the model's: (mean + key part)
  // through W_out and W_U is linear, so its mean over the pairs is that of (mean + mean key part).
  const ag::Tensor mean_key_part = ag::matmul(ag::mean(directions, {0}, true), projected);
  const ag::Tensor shift = ag::sub(ag::div(sum_logits, count),
                                   ag::matmul(ag::matmul(ag::add(mean_acts, mean_key_part), W_out), W_U));

  std::vector<char> is_train(static_cast<std::size_t>(n), 0);
  for (auto row : d.train) is_train[static_cast<std::size_t>(row)] = 1;
  Mean train_loss, train_right, test_loss, test_right, restricted_loss, excluded_loss;
  for (std::int64_t i = 0; i < chunks; ++i) {
    const auto [start, len] = chunk(i);
    const LastPosition x = kept ? *kept : last_position(model, ag::narrow(d.tokens, 0, start, len));
    const ag::Tensor key_part = ag::matmul(ag::narrow(directions, 0, start, len), projected);
    const ag::Tensor restricted = ag::add(ag::matmul(ag::matmul(ag::add(mean_acts, key_part), W_out), W_U), shift);
    // Excluded: the key-frequency components removed from the activations, the rest of the
    // residual stream kept.
    const ag::Tensor resid = ag::add(ag::linear(ag::sub(x.acts, key_part), W_out, b_out), x.resid_mid);
    const ag::Tensor excluded = ag::add(ag::matmul(resid, W_U), b_U);
    std::vector<std::int64_t> train, test;
    for (std::int64_t r = 0; r < len; ++r) (is_train[static_cast<std::size_t>(start + r)] ? train : test).push_back(r);
    const ag::Tensor labels = ag::narrow(d.labels, 0, start, len);
    const auto rows = [](const ag::Tensor& t, const std::vector<std::int64_t>& r) { return ag::index_select(t, 0, r); };
    const auto n_of = [](const std::vector<std::int64_t>& r) { return static_cast<std::int64_t>(r.size()); };
    if (!train.empty()) {
      const Measured m = measured(rows(x.logits, train), rows(labels, train));
      train_loss.add(m.loss, n_of(train)), train_right.add(m.accuracy, n_of(train));
      excluded_loss.add(ag::cross_entropy(rows(excluded, train), rows(labels, train)).item(), n_of(train));
    }
    if (!test.empty()) {
      const Measured m = measured(rows(x.logits, test), rows(labels, test));
      test_loss.add(m.loss, n_of(test)), test_right.add(m.accuracy, n_of(test));
      restricted_loss.add(ag::cross_entropy(rows(restricted, test), rows(labels, test)).item(), n_of(test));
    }
  }
  return {.train = {train_loss.value(), train_right.value()},
          .test = {test_loss.value(), test_right.value()},
          .restricted_loss = restricted_loss.value(),
          .excluded_loss = excluded_loss.value()};
}

}  // namespace

void neuron_frequencies(nn::TransformerLM& model, const ag::Tensor& pairs, const ag::Tensor& basis,
                        std::vector<std::int64_t>& frequency, std::vector<double>& explained) {
  ag::NoGradGuard no_grad;
  const std::int64_t p = basis.size(0), K = (p - 1) / 2;
  // C[i, j] = sum over (a, b) of F[i, a] F[j, b] A[a, b] per neuron: only C[0, j], C[i, 0] and the
  // 2 x 2 blocks C[{2k-1, 2k}, {2k-1, 2k}] are needed, accumulated over chunks of whole rows a, so
  // memory stays at one chunk's activations for any p.
  const std::vector<double> F = basis.to_vector();
  const auto f = [&](std::int64_t i, std::int64_t x) { return F[static_cast<std::size_t>(i * p + x)]; };
  std::vector<double> c0j, ci0, blocks, norm2;
  std::int64_t D = 0;
  const std::int64_t rows = std::max<std::int64_t>(1, kChunk / p);
  for (std::int64_t a0 = 0; a0 < p; a0 += rows) {
    const std::int64_t na = std::min(rows, p - a0);
    const ag::Tensor acts = last_position(model, ag::narrow(pairs, 0, a0 * p, na * p)).acts;  // (na·p, D)
    if (D == 0) {
      D = acts.size(1);
      c0j.assign(static_cast<std::size_t>(p * D), 0.0), ci0.assign(static_cast<std::size_t>(p * D), 0.0);
      blocks.assign(static_cast<std::size_t>(4 * K * D), 0.0), norm2.assign(static_cast<std::size_t>(D), 0.0);
    }
    // G[a, j, n] = sum over b of F[j, b] A[a, b, n]
    const std::vector<double> G = ag::matmul(basis, ag::reshape(acts, {na, p, D})).to_vector();
    const std::vector<double> A = acts.to_vector();
    for (std::size_t i = 0; i < A.size(); ++i) norm2[i % static_cast<std::size_t>(D)] += A[i] * A[i];
    const auto g = [&](std::int64_t a, std::int64_t j, std::int64_t n) {
      return G[static_cast<std::size_t>((a * p + j) * D + n)];
    };
    for (std::int64_t la = 0; la < na; ++la) {
      const std::int64_t a = a0 + la;
      for (std::int64_t j = 0; j < p; ++j)
        for (std::int64_t n = 0; n < D; ++n) {
          c0j[static_cast<std::size_t>(j * D + n)] += f(0, a) * g(la, j, n);
          ci0[static_cast<std::size_t>(j * D + n)] += f(j, a) * g(la, 0, n);
        }
      for (std::int64_t k = 1; k <= K; ++k)
        for (std::int64_t r = 0; r < 2; ++r)
          for (std::int64_t c = 0; c < 2; ++c)
            for (std::int64_t n = 0; n < D; ++n)
              blocks[static_cast<std::size_t>((((k - 1) * 2 + r) * 2 + c) * D + n)] +=
                  f(2 * k - 1 + r, a) * g(la, 2 * k - 1 + c, n);
    }
  }
  frequency.assign(static_cast<std::size_t>(D), 0);
  explained.assign(static_cast<std::size_t>(D), 0.0);
  const auto sq = [](double x) { return x * x; };
  for (std::int64_t n = 0; n < D; ++n) {
    const auto at = [&](const std::vector<double>& v, std::int64_t i) { return v[static_cast<std::size_t>(i * D + n)]; };
    // The transform is orthonormal: the squares of all coefficients sum to the activation's.
    const double total = norm2[static_cast<std::size_t>(n)] - sq(at(c0j, 0));
    if (!(total > 0)) continue;  // a dead neuron (constant over the pairs): no frequency
    for (std::int64_t k = 1; k <= K; ++k) {
      double part = sq(at(c0j, 2 * k - 1)) + sq(at(c0j, 2 * k)) + sq(at(ci0, 2 * k - 1)) + sq(at(ci0, 2 * k));
      for (std::int64_t e = 0; e < 4; ++e) part += sq(at(blocks, (k - 1) * 4 + e));
      if (part / total > explained[static_cast<std::size_t>(n)])
        explained[static_cast<std::size_t>(n)] = part / total, frequency[static_cast<std::size_t>(n)] = k;
    }
  }
}

namespace {

double key_share(const std::vector<double>& power, const std::vector<std::int64_t>& keys) {
  double total = 0, key = 0;
  for (std::size_t k = 1; k < power.size(); ++k) total += power[k];
  for (auto k : keys) key += power[static_cast<std::size_t>(k)];
  return total > 0 ? key / total : 0.0;
}

double weight_norm(const std::vector<ag::Tensor>& weights) {
  ag::NoGradGuard no_grad;
  double sum = 0;
  for (const auto& w : weights) sum += ag::sum(ag::square(w.to(ag::Dtype::Float64))).item();
  return std::sqrt(sum);
}

// The initial weights under TransformerLens's names, with the training pairs' rows, for
// benchmarks/grokking_torch.py to train the same model from the same start.
void save_initial(const nn::TransformerLM& model, const Data& d, const std::string& path) {
  nn::NamedTensors tensors = nn::transformer_lens_state_dict(model);
  tensors.emplace_back("data.train_indices", ag::tensor(d.train, {static_cast<std::int64_t>(d.train.size())}));
  nn::save_safetensors(path, tensors);
}

}  // namespace

Config Config::quick() {
  Config c;
  c.p = 53;
  c.train_fraction = 0.6;
  c.steps = 2000;
  c.eval_interval = 50;
  c.snapshot_interval = 100;
  return c;
}

// The messages name the command line's flags (the betas have none: they are the demo's).
void Config::check() const {
  const auto fail = [](const std::string& what) { throw std::invalid_argument("grokking: " + what); };
  if (!is_prime(p) || p < 5) fail(fmt::format("--p must be a prime >= 5, got {}", p));
  if (p > 1000) fail(fmt::format("--p {} is too large (at most 1000: the data holds p² pairs)", p));
  if (!(train_fraction > 0 && train_fraction < 1))
    fail(fmt::format("--train-fraction must be in (0, 1), got {}", train_fraction));
  const double train = std::round(train_fraction * static_cast<double>(p * p));
  if (train < 1 || train > static_cast<double>(p * p - 1))
    fail(fmt::format("--train-fraction {} of {} pairs leaves no training or no test pair", train_fraction, p * p));
  if (d_model <= 0 || n_heads <= 0 || d_mlp <= 0 || d_model % n_heads != 0)
    fail(fmt::format("--d-model {} must be a positive multiple of --heads {}, and --d-mlp {} positive", d_model,
                     n_heads, d_mlp));
  if (steps <= 0 || eval_interval <= 0 || snapshot_interval <= 0)
    fail(fmt::format("--steps {}, --eval-interval {} and --snapshot-interval {} must be positive", steps,
                     eval_interval, snapshot_interval));
  if (!std::isfinite(lr) || !(lr > 0)) fail(fmt::format("--lr must be finite and > 0, got {}", lr));
  if (!std::isfinite(weight_decay) || weight_decay < 0)
    fail(fmt::format("--weight-decay must be finite and >= 0, got {}", weight_decay));
  if (const std::string decay = cli_checks::decay_problem(lr, weight_decay); !decay.empty()) fail(decay);
  if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1))
    fail(fmt::format("the betas {}, {} must be in [0, 1)", beta1, beta2));
  // Sizes past these would only fail later, in an allocation or the model's own check, naming no flag.
  if (d_model > (1 << 14)) fail(fmt::format("--d-model {} is too large (at most {})", d_model, 1 << 14));
  if (d_mlp > (1 << 20)) fail(fmt::format("--d-mlp {} is too large (at most {})", d_mlp, 1 << 20));
  // Each snapshot keeps a copy of the trained weights until the progress measures are taken.
  const double weights = static_cast<double>(d_model) * static_cast<double>(2 * p + 4 + 4 * d_model + 2 * d_mlp);
  const double bytes = (static_cast<double>(steps / snapshot_interval) + 2) * weights *
                       (dtype == ag::Dtype::Float64 ? 8.0 : 4.0);
  if (bytes > 4.0 * (1 << 30))
    fail(fmt::format("--snapshot-interval {} over --steps {} keeps {:.1f} GiB of weight snapshots (at most 4 GiB): "
                     "take them less often",
                     snapshot_interval, steps, bytes / (1 << 30)));
}

std::string Config::describe() const {
  return fmt::format("a + b mod {}; {:.0f} % of the {} pairs for training", p, 100 * train_fraction, p * p);
}

ag::Tensor fourier_basis(std::int64_t p) {
  std::vector<double> f(static_cast<std::size_t>(p * p));
  const auto at = [&](std::int64_t r, std::int64_t x) -> double& { return f[static_cast<std::size_t>(r * p + x)]; };
  for (std::int64_t x = 0; x < p; ++x) at(0, x) = 1 / std::sqrt(static_cast<double>(p));
  for (std::int64_t k = 1; 2 * k < p + 1; ++k)
    for (std::int64_t x = 0; x < p; ++x) {
      const double angle = 2 * std::numbers::pi * static_cast<double>(k * x % p) / static_cast<double>(p);
      const double scale = std::sqrt(2 / static_cast<double>(p));
      at(2 * k - 1, x) = scale * std::cos(angle);
      at(2 * k, x) = scale * std::sin(angle);
    }
  return ag::tensor(f, {p, p}, ag::Dtype::Float64);
}

std::vector<std::int64_t> key_frequencies(const std::vector<double>& norms) {
  std::vector<std::int64_t> order(norms.size());
  std::iota(order.begin(), order.end(), std::int64_t{0});
  std::sort(order.begin(), order.end(),
            [&](auto a, auto b) { return norms[static_cast<std::size_t>(a)] > norms[static_cast<std::size_t>(b)]; });
  double total = 0;
  for (double n : norms) total += n * n;
  std::vector<std::int64_t> keys;
  double carried = 0;
  for (auto i : order) {
    if (carried >= 0.9 * total) break;
    keys.push_back(i + 1);
    carried += norms[static_cast<std::size_t>(i)] * norms[static_cast<std::size_t>(i)];
  }
  return keys;
}

nn::TransformerLMConfig model_config(const Config& c) {
  return {.n_layers = 1, .d_model = c.d_model, .n_heads = c.n_heads, .d_mlp = c.d_mlp, .d_vocab = c.p + 1,
          .n_ctx = 3, .activation = nn::Activation::Relu, .normalization = nn::Normalization::None,
          .dtype = c.dtype, .d_vocab_out = c.p};
}

Result run(const Config& config, const Outputs& outputs) {
  config.check();
  Result r;
  r.config = config;
  const Config& c = r.config;
  const Data d = make_data(c);
  r.train_pairs = static_cast<std::int64_t>(d.train.size());
  r.test_pairs = static_cast<std::int64_t>(d.test.size());
  ag::Generator init(c.seed);
  nn::TransformerLM model(model_config(c), init);
  r.parameters = model.num_parameters();
  r.threads = ag::get_num_threads();
  if (!outputs.initial_weights.empty()) save_initial(model, d, outputs.initial_weights);
  // The biases stay 0 as in the demo (which sets requires_grad = False on them): only the weights
  // and embeddings are trained.
  nn::NamedTensors trained;
  for (const auto& [name, p] : model.named_parameters())
    if (p.dim() >= 2) trained.emplace_back(name, p), r.trained_parameters += p.numel();
  nn::AdamW opt(trained, {.lr = c.lr, .beta1 = c.beta1, .beta2 = c.beta2, .weight_decay = c.weight_decay});

  std::vector<std::pair<std::int64_t, std::vector<ag::Tensor>>> snapshots;
  const auto snapshot = [&](std::int64_t step) {
    ag::NoGradGuard no_grad;
    std::vector<ag::Tensor> values;
    for (const auto& [name, p] : trained) values.push_back(p.clone());
    snapshots.emplace_back(step, std::move(values));
  };
  // A loss that is not finite ends the run, naming the flags that make weights diverge, before
  // anything is written.
  const auto check_finite = [&](const char* which, double loss, std::int64_t step) {
    if (!std::isfinite(loss))
      throw std::runtime_error(fmt::format("grokking: the {} loss is {} at step {}: the weights diverged (lower --lr, "
                                           "now {}{})",
                                           which, loss, step, c.lr,
                                           c.weight_decay > 0 ? fmt::format(", or --weight-decay, now {}", c.weight_decay)
                                                              : std::string()));
  };
  const auto evaluate = [&](std::int64_t step, Measured train) {
    const Measured test = measure(model, d.test_tokens, d.test_labels);
    check_finite("training", train.loss, step);
    check_finite("test", test.loss, step);
    CurvePoint point{step, train.loss, train.accuracy, test.loss, test.accuracy};
    r.curve.push_back(point);
    if (!r.grokked_step && test.accuracy >= 0.99) r.grokked_step = step;
    if (outputs.progress) outputs.progress(point);
  };
  for (std::int64_t step = 0; step < c.steps; ++step) {
    const auto start = Clock::now();
    opt.zero_grad();
    const ag::Tensor logits = answer_logits(model, d.train_tokens);
    ag::Tensor loss = ag::cross_entropy(logits, d.train_labels);
    const Measured train{loss.item(), accuracy(logits, d.train_labels)};
    check_finite("training", train.loss, step);
    r.train_seconds += seconds_since(start);
    r.train_losses.push_back(train.loss);
    if (!r.memorized_step && train.accuracy >= 0.99) r.memorized_step = step;
    if (step % c.eval_interval == 0) evaluate(step, train);
    if (step % c.snapshot_interval == 0) snapshot(step);
    const auto resumed = Clock::now();
    loss.backward();
    opt.step();
    r.train_seconds += seconds_since(resumed);
  }
  evaluate(c.steps, measure(model, d.train_tokens, d.train_labels));
  if (!outputs.trained_weights.empty()) nn::save_transformer_lens_state_dict(model, outputs.trained_weights);
  if (snapshots.back().first != c.steps) snapshot(c.steps);
  r.final_point = r.curve.back();
  r.test_loss_peak = *std::max_element(r.curve.begin(), r.curve.end(),
                                       [](const auto& a, const auto& b) { return a.test_loss < b.test_loss; });

  const auto measure_start = Clock::now();
  const ag::Tensor basis = fourier_basis(c.p);
  const std::vector<double> power = fourier_power(model, basis);
  r.constant_norm = std::sqrt(power[0]);
  for (std::size_t k = 1; k < power.size(); ++k) r.frequency_norms.push_back(std::sqrt(power[k]));
  r.key_frequencies = key_frequencies(r.frequency_norms);
  const ag::Tensor directions = sum_directions(c.p, r.key_frequencies);
  for (const auto& [step, values] : snapshots) {
    {
      ag::NoGradGuard no_grad;
      for (std::size_t i = 0; i < values.size(); ++i) {
        ag::Tensor target = trained[i].second;
        target.copy_(values[i]);
      }
    }
    const Snapshot m = progress_measures(model, d, directions);
    r.progress.push_back({.step = step, .train_loss = m.train.loss, .test_loss = m.test.loss,
                          .train_accuracy = m.train.accuracy, .test_accuracy = m.test.accuracy,
                          .restricted_loss = m.restricted_loss, .excluded_loss = m.excluded_loss,
                          .key_share = key_share(fourier_power(model, basis), r.key_frequencies),
                          .weight_norm = weight_norm(values)});
  }
  // The snapshots end with the final weights (the last one is taken after the last step).
  neuron_frequencies(model, d.tokens, basis, r.neuron_frequency, r.neuron_explained);
  r.measure_seconds = seconds_since(measure_start);
  return r;
}

}  // namespace grokking
