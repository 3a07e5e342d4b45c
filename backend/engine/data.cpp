#include "backend/engine/data.h"

#include <fstream>
#include <random>

#include "common/errors.h"

namespace stepcast::backend {

TokenSource::TokenSource(const std::string& path, int64_t vocab, uint64_t seed)
    : path_(path), vocab_(vocab), seed_(seed) {
  if (path.empty()) return;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open the --data file");
  bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (vocab < 256) throw InputError(path + ": byte-level data needs a vocabulary of at least 256 tokens");
  if (bytes_.size() < 2) throw InputError(path + ": the --data file is empty");
}

torch::Tensor TokenSource::batch(int64_t step, int64_t micro, int rank, int64_t b, int64_t seq) const {
  std::seed_seq seq_seed{seed_, static_cast<uint64_t>(step), static_cast<uint64_t>(micro), static_cast<uint64_t>(rank)};
  std::mt19937_64 rng(seq_seed);
  auto out = torch::empty({b, seq + 1}, torch::kLong);
  auto* p = out.data_ptr<int64_t>();
  if (bytes_.empty()) {
    std::uniform_int_distribution<int64_t> tok(0, vocab_ - 1);
    for (int64_t i = 0; i < b * (seq + 1); ++i) p[i] = tok(rng);
    return out;
  }
  const int64_t n = static_cast<int64_t>(bytes_.size());
  if (n < seq + 1) throw InputError(path_ + ": the --data file has fewer bytes than --seq + 1");
  std::uniform_int_distribution<int64_t> start(0, n - seq - 1);
  for (int64_t r = 0; r < b; ++r) {
    const int64_t s0 = start(rng);
    for (int64_t j = 0; j <= seq; ++j) p[r * (seq + 1) + j] = bytes_[static_cast<size_t>(s0 + j)];
  }
  return out;
}

std::string TokenSource::description() const {
  return bytes_.empty() ? "random tokens" : path_ + " (" + std::to_string(bytes_.size()) + " bytes, byte-level)";
}

}  // namespace stepcast::backend
