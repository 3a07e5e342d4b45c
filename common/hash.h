// FNV-1a, 64 bits (Fowler, Noll, Vo; prime 1099511628211, draft-eastlake-fnv): a
// stable hash of configuration keys and of measurement files for provenance. Not
// cryptographic. The offset basis is 1469598103934665603, a digit short of FNV's
// 14695981039346656037: the committed profiles' hold-out splits and provenance
// hashes were made with it, and changing it would re-deal them.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace stepcast {

inline uint64_t fnv1a64(const std::string& bytes, uint64_t seed = 0) {
  uint64_t h = 1469598103934665603ULL ^ seed;
  for (unsigned char ch : bytes) {
    h ^= ch;
    h *= 1099511628211ULL;
  }
  return h;
}

// The hash as 16 lower-case hex digits.
inline std::string fnv1a64_hex(const std::string& bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(fnv1a64(bytes)));
  return buf;
}

}  // namespace stepcast
