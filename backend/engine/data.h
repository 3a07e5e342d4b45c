// Training data: byte-level tokens of a text file (each byte is a token id,
// so any vocabulary of at least 256 works), or uniform random tokens. Every
// (step, micro-batch, rank) draws its windows from its own seeded stream, so
// a resumed run sees the same batches as an uninterrupted one.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

namespace stepcast::backend {

class TokenSource {
 public:
  // Empty path: random tokens in [0, vocab).
  TokenSource(const std::string& path, int64_t vocab, uint64_t seed);
  // (batch, seq + 1) int64 tokens for one micro-batch.
  torch::Tensor batch(int64_t step, int64_t micro, int rank, int64_t batch, int64_t seq) const;
  std::string description() const;

 private:
  std::vector<uint8_t> bytes_;
  std::string path_;
  int64_t vocab_;
  uint64_t seed_;
};

}  // namespace stepcast::backend
