// Order statistics shared by the benchmarks, the micro-benchmarks and the
// calibration records.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace stepcast {

// The median: the middle value, or the mean of the two middle values of an even count; 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The nearest-rank percentile: the ceil(q n)-th smallest of n values (q in (0, 1]); 0 for none.
inline double nearest_rank_percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(std::max<size_t>(rank, 1), v.size()) - 1];
}

// Mean, nearest-rank 90th percentile and largest of n values, each times `scale` (100: fractions
// as percent); zeros for none.
struct MeanP90Max {
  double mean = 0, p90 = 0, max = 0;
};
inline MeanP90Max mean_p90_max(const std::vector<double>& v, double scale = 1.0) {
  if (v.empty()) return {};
  double sum = 0;
  for (double x : v) sum += x;
  return {scale * sum / static_cast<double>(v.size()), scale * nearest_rank_percentile(v, 0.9),
          scale * *std::max_element(v.begin(), v.end())};
}

// Kendall's tau-b rank correlation of paired samples (Kendall 1945): (concordant - discordant)
// pairs over sqrt((pairs - ties in x) (pairs - ties in y)). 1: the same order, -1: reversed;
// 0 when fewer than two pairs or one side is constant.
inline double kendall_tau_b(const std::vector<double>& x, const std::vector<double>& y) {
  const size_t n = std::min(x.size(), y.size());
  double concordant = 0, discordant = 0, ties_x = 0, ties_y = 0, pairs = 0;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j) {
      const double dx = x[i] - x[j], dy = y[i] - y[j];
      pairs += 1;
      if (dx == 0) ties_x += 1;
      if (dy == 0) ties_y += 1;
      if (dx * dy > 0) concordant += 1;
      else if (dx * dy < 0) discordant += 1;
    }
  const double denom = std::sqrt((pairs - ties_x) * (pairs - ties_y));
  return denom > 0 ? (concordant - discordant) / denom : 0.0;
}

// The fewest scores whose 95 % conformal quantile is one of them: ceil(0.95 (n + 1)) <= n.
inline constexpr size_t kConformalMinScores = 19;

// The split-conformal 95 % quantile of n scores (Vovk et al.; Lei et al. 2018, "Distribution-free
// predictive inference for regression"): the ceil(0.95 (n + 1))-th smallest, the largest when
// that rank passes n; 0 for none. A new score from the same distribution falls at or below it
// with probability at least 95 %.
inline double conformal_q95(std::vector<double> scores) {
  if (scores.empty()) return 0;
  std::sort(scores.begin(), scores.end());
  const size_t rank = static_cast<size_t>(std::ceil(0.95 * static_cast<double>(scores.size() + 1)));
  return scores[std::min(rank, scores.size()) - 1];
}

// The Wilson score interval of a binomial proportion (Wilson 1927, "Probable inference, the law
// of succession, and statistical inference", JASA 22:209; Newcombe 1998, Stat. Med. 17:857, method
// 3): the p whose normal test at z does not reject `successes` of `trials`. A measured coverage of
// a few predictions carries it: 4 of 5 inside a 95 % interval is [0.376, 0.964] at z 1.96, which
// holds 0.95. {0, 1} for no trials.
struct ProportionInterval {
  double lo = 0, hi = 1;
};
inline ProportionInterval wilson_interval(int successes, int trials, double z = 1.96) {
  if (trials <= 0) return {};
  const double n = trials, p = successes / n, z2 = z * z;
  const double center = (p + z2 / (2 * n)) / (1 + z2 / n);
  const double half = z / (1 + z2 / n) * std::sqrt(p * (1 - p) / n + z2 / (4 * n * n));
  return {std::max(0.0, center - half), std::min(1.0, center + half)};
}

}  // namespace stepcast
