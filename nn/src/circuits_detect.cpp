// Head detectors (TL's head_detector): how much of a head's attention falls where a previous-token,
// duplicate-token or induction head would put it.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "nn/circuits.hpp"

namespace nn::circuits {

namespace {

// tokens (T) or (B, T) as rows of integers.
std::vector<std::vector<std::int64_t>> token_rows(const char* op, const ag::Tensor& tokens) {
  if (!tokens.defined() || tokens.dim() < 1 || tokens.dim() > 2)
    ag::fail(op, "needs tokens (T) or (B, T), got {}",
             tokens.defined() ? ag::shape_str(tokens.shape()) : std::string("an undefined tensor"));
  const std::int64_t B = tokens.dim() == 2 ? tokens.size(0) : 1, T = tokens.size(-1);
  std::vector<std::vector<std::int64_t>> rows(static_cast<std::size_t>(B));
  if (tokens.dtype() == ag::Dtype::Int64) {  // read as integers: a double would merge ids beyond 2^53
    const std::int64_t* v = tokens.data<std::int64_t>();
    for (std::int64_t b = 0; b < B; ++b) rows[static_cast<std::size_t>(b)].assign(v + b * T, v + (b + 1) * T);
    return rows;
  }
  const std::vector<double> v = tokens.to_vector();
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t) {
      const double x = v[static_cast<std::size_t>(b * T + t)];
      // exact integers only: beyond 2^53 neighbouring ids share a double
      if (!std::isfinite(x) || x != std::floor(x) || std::abs(x) > 9007199254740992.0)
        ag::fail(op, "tokens must be integers of magnitude at most 2^53 (Int64 tokens may be larger), got {} at [{}, {}]",
                 x, b, t);
      rows[static_cast<std::size_t>(b)].push_back(static_cast<std::int64_t>(x));
    }
  return rows;
}

void check_kind(const char* op, HeadKind kind) {
  if (kind != HeadKind::PreviousToken && kind != HeadKind::DuplicateToken && kind != HeadKind::Induction)
    ag::fail(op, "unknown head kind {} (PreviousToken, DuplicateToken or Induction)", static_cast<int>(kind));
}

std::vector<double> pattern_of(HeadKind kind, const std::vector<std::int64_t>& tok) {
  const std::size_t T = tok.size();
  std::vector<double> d(T * T, 0.0);
  for (std::size_t i = 0; i < T; ++i)
    for (std::size_t j = 0; j <= i; ++j) {
      bool on = false;
      switch (kind) {
        case HeadKind::PreviousToken: on = j + 1 == i; break;
        case HeadKind::DuplicateToken: on = j < i && tok[j] == tok[i]; break;
        case HeadKind::Induction: on = j >= 1 && tok[j - 1] == tok[i]; break;
      }
      d[i * T + j] = on ? 1.0 : 0.0;
    }
  return d;
}

}  // namespace

std::string head_kind_name(HeadKind kind) {
  switch (kind) {
    case HeadKind::PreviousToken: return "previous_token_head";
    case HeadKind::DuplicateToken: return "duplicate_token_head";
    case HeadKind::Induction: return "induction_head";
  }
  return "?";
}

ag::Tensor detection_pattern(HeadKind kind, const ag::Tensor& tokens) {
  check_kind("circuits::detection_pattern", kind);
  const auto rows = token_rows("circuits::detection_pattern", tokens);
  const std::int64_t T = tokens.size(-1);
  std::vector<double> all;
  for (const auto& r : rows) {
    const auto d = pattern_of(kind, r);
    all.insert(all.end(), d.begin(), d.end());
  }
  if (tokens.dim() == 1) return ag::tensor(all, {T, T}, ag::Dtype::Float64);
  return ag::tensor(all, {tokens.size(0), T, T}, ag::Dtype::Float64);
}

ag::Tensor head_scores(const ag::Tensor& pattern, const ag::Tensor& detection, const DetectorOptions& options) {
  constexpr const char* op = "circuits::head_scores";
  if (!pattern.defined() || (pattern.dim() != 3 && pattern.dim() != 4))
    ag::fail(op, "needs attention patterns (B, H, T, T) or (H, T, T), got {}",
             pattern.defined() ? ag::shape_str(pattern.shape()) : std::string("an undefined tensor"));
  if (pattern.dtype() == ag::Dtype::Int64) ag::fail(op, "needs Float32 or Float64 patterns, got Int64");
  const ErrorMeasure measure = options.error_measure;
  if (measure != ErrorMeasure::Mul && measure != ErrorMeasure::Abs && measure != ErrorMeasure::Share)
    ag::fail(op, "unknown error measure {} (Mul, Abs or Share)", static_cast<int>(measure));
  {
    const std::vector<double> values = pattern.detach().to_vector();
    for (std::size_t i = 0; i < values.size(); ++i)
      if (!std::isfinite(values[i]))
        ag::fail(op, "the patterns {} hold {} at flat index {}", ag::shape_str(pattern.shape()), values[i], i);
  }
  const ag::Tensor A = pattern.dim() == 3 ? ag::unsqueeze(pattern, 0) : pattern;  // (B, H, T, T)
  const std::int64_t B = A.size(0), H = A.size(1), T = A.size(2);
  if (A.size(3) != T)
    ag::fail(op, "needs square patterns (as many keys as queries), got {}", ag::shape_str(pattern.shape()));
  if (!detection.defined() || (detection.dim() != 2 && detection.dim() != 3) || detection.size(-1) != T ||
      detection.size(-2) != T || (detection.dim() == 3 && detection.size(0) != B))
    ag::fail(op, "needs a detection pattern ({}, {}) or ({}, {}, {}) for patterns {}, got {}", T, T, B, T, T,
             ag::shape_str(pattern.shape()),
             detection.defined() ? ag::shape_str(detection.shape()) : std::string("an undefined tensor"));
  if (B == 0 || T == 0)
    ag::fail(op, "patterns {} hold no {} to score", ag::shape_str(pattern.shape()), B == 0 ? "sequence" : "position");
  {
    const std::vector<double> values = detection.detach().to_vector();
    for (std::size_t i = 0; i < values.size(); ++i)
      if (values[i] != 0.0 && values[i] != 1.0)
        ag::fail(op, "a detection pattern holds 0s and 1s, but {} holds {} at flat index {}",
                 ag::shape_str(detection.shape()), values[i], i);
  }
  const ag::Tensor D = ag::unsqueeze(detection.dim() == 2 ? ag::unsqueeze(detection, 0) : detection, 1)
                           .detach()
                           .to(A.dtype());  // (B or 1, 1, T, T)
  // The entries left out: key 0 (exclude_bos) and the diagonal (exclude_current_token).
  std::vector<double> keep(static_cast<std::size_t>(T * T), 1.0);
  for (std::int64_t i = 0; i < T; ++i)
    for (std::int64_t j = 0; j < T; ++j)
      if ((options.exclude_bos && j == 0) || (options.exclude_current_token && i == j))
        keep[static_cast<std::size_t>(i * T + j)] = 0.0;
  const ag::Tensor K = ag::tensor(keep, {T, T}, A.dtype());
  if (measure == ErrorMeasure::Share) {
    const ag::Tensor DK = ag::expand(D * K, {B, 1, T, T});                                  // the scored 1s
    const std::vector<double> per_row = ag::sum(DK, -1).to_vector();                        // (B, 1, T)
    std::vector<double> has(per_row.size());
    double rows = 0;
    for (std::size_t i = 0; i < per_row.size(); ++i) rows += has[i] = per_row[i] > 0 ? 1.0 : 0.0;
    if (rows == 0) ag::fail(op, "no query position of the detection pattern has a 1 to score (Share)");
    const ag::Tensor on = ag::sum(A * DK, -1);                                               // (B, H, T)
    const ag::Tensor with = on * ag::tensor(has, {B, 1, T}, A.dtype());
    return ag::sum(with, {0, 2}) / rows;                                                     // (H)
  }
  if (measure == ErrorMeasure::Mul) {
    const ag::Tensor kept = A * K;                                    // (B, H, T, T)
    const ag::Tensor total = ag::sum(kept, {-2, -1});                 // (B, H)
    const std::vector<double> t = total.to_vector();
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h)
        if (!(t[static_cast<std::size_t>(b * H + h)] != 0.0))
          ag::fail(op, "head {} of sequence {} puts no attention on the entries scored (sum {}): its score is 0/0", h,
                   b, t[static_cast<std::size_t>(b * H + h)]);
    const ag::Tensor per = ag::sum(kept * D, {-2, -1}) / total;  // (B, H)
    return ag::mean(per, 0);                                      // (H)
  }
  // Abs: 1 - round(T · mean |A - D|, 3) per sequence, the mean over all T·T entries after the
  // excluded ones are set to 0.
  const std::vector<double> diff = (ag::abs(A - D) * K).detach().to(ag::Dtype::Float64).to_vector();
  std::vector<double> scores(static_cast<std::size_t>(H), 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      double s = 0;
      for (std::int64_t e = 0; e < T * T; ++e) s += diff[static_cast<std::size_t>((b * H + h) * T * T + e)];
      const double raw = s / static_cast<double>(T * T) * static_cast<double>(T);
      scores[static_cast<std::size_t>(h)] += (1.0 - std::nearbyint(raw * 1000.0) / 1000.0) / static_cast<double>(B);
    }
  return ag::tensor(scores, {H}, ag::Dtype::Float64).to(A.dtype());
}

ag::Tensor head_scores(const ag::Tensor& pattern, HeadKind kind, const ag::Tensor& tokens,
                       const DetectorOptions& options) {
  constexpr const char* op = "circuits::head_scores";
  check_kind(op, kind);
  if (pattern.defined() && pattern.dim() == 4 && tokens.defined() && tokens.dim() == 2 &&
      tokens.size(0) != pattern.size(0))
    ag::fail(op, "patterns {} are for {} sequences but tokens {} hold {}", ag::shape_str(pattern.shape()),
             pattern.size(0), ag::shape_str(tokens.shape()), tokens.size(0));
  if (pattern.defined() && tokens.defined() && tokens.dim() >= 1 && pattern.size(-1) != tokens.size(-1))
    ag::fail(op, "patterns {} are over {} positions but tokens {} over {}", ag::shape_str(pattern.shape()),
             pattern.size(-1), ag::shape_str(tokens.shape()), tokens.size(-1));
  return head_scores(pattern, detection_pattern(kind, tokens), options);
}

ag::Tensor head_scores(const ActivationCache& cache, HeadKind kind, const ag::Tensor& tokens,
                       const DetectorOptions& options, const std::vector<std::string>& pattern_points) {
  std::vector<std::string> names = pattern_points;
  if (names.empty()) {
    const std::string suffix = "pattern";
    for (const auto& n : cache.names())
      if (n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
        names.push_back(n);
    if (names.empty())
      ag::fail("circuits::head_scores", "the cache holds no point whose name ends in \"pattern\" (it holds {})",
               fmt::join(cache.names(), ", "));
  }
  ag::TensorList rows;
  for (const auto& n : names) rows.push_back(head_scores(cache[n], kind, tokens, options));
  return ag::stack(rows, 0);
}

}  // namespace nn::circuits
