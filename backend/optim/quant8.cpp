#include "backend/optim/quant8.h"

#include <cmath>

namespace stepcast::backend::quant8 {

namespace {

Map build(int bits) {
  Map m{};
  m.bits = bits;
  for (int i = 0; i < bits; ++i) {
    const double decade = std::pow(10.0, i - bits + 1), points = std::ldexp(1.0, i);
    m.first[i] = static_cast<float>(decade * (0.1 + 0.9 / points));
    m.step[i] = i == 0 ? 1.0f : static_cast<float>(decade * 0.9 / points);
    m.inv_step[i] = 1.0f / m.step[i];
  }
  for (int i = 0; i + 1 < bits; ++i) {
    const float top = std::fma(static_cast<float>((1 << i) - 1), m.step[i], m.first[i]);
    m.threshold[i] = 0.5f * (top + m.first[i + 1]);
  }
  for (int i = bits - 1; i < 16; ++i) m.threshold[i] = 2.0f;  // never reached (y <= 1)
  m.zero_threshold = 0.5f * m.first[0];
  return m;
}

}  // namespace

const Map& signed_magnitudes() {
  static const Map map = build(7);
  return map;
}

const Map& unsigned_map() {
  static const Map map = build(8);
  return map;
}

uint8_t encode_magnitude(const Map& m, float y) {
  y = y < 1.0f ? y : 1.0f;  // also maps NaN to 1
  y = y > 0.0f ? y : 0.0f;
  if (y < m.zero_threshold) return 0;
  int i = 0;
  for (int k = 0; k + 1 < m.bits; ++k) i += y >= m.threshold[k] ? 1 : 0;
  const float t = (y - m.first[i]) * m.inv_step[i];
  // Round to nearest even without a libm call: adding and removing 1.5 x 2^23 (|t| < 2^22 here).
  int j = static_cast<int>((t + 0x1.8p23f) - 0x1.8p23f);
  const int last = (1 << i) - 1;
  j = j < 0 ? 0 : (j > last ? last : j);
  return static_cast<uint8_t>((1 << i) + j);
}

float decode_magnitude(const Map& m, uint8_t code) {
  if (code == 0) return 0.0f;
  const int i = 31 - __builtin_clz(code);
  return std::fma(static_cast<float>(code - (1 << i)), m.step[i], m.first[i]);
}

namespace {

// decode_magnitude of every code, computed once (the scalar kernels' lookup).
struct Decoded {
  float signed_value[256];
  float unsigned_value[256];
  Decoded() {
    for (int c = 0; c < 256; ++c) {
      const float mag = decode_magnitude(signed_magnitudes(), static_cast<uint8_t>(c & 0x7F));
      signed_value[c] = (c & 0x80) ? -mag : mag;
      unsigned_value[c] = decode_magnitude(unsigned_map(), static_cast<uint8_t>(c));
    }
  }
};

const Decoded& decoded() {
  static const Decoded d;
  return d;
}

}  // namespace

uint8_t encode_signed(float x) {
  const uint8_t mag = encode_magnitude(signed_magnitudes(), std::fabs(x));
  return static_cast<uint8_t>(std::signbit(x) ? (mag | 0x80u) : mag);
}

float decode_signed(uint8_t code) { return decoded().signed_value[code]; }

uint8_t encode_unsigned(float x) {
  const uint8_t c = encode_magnitude(unsigned_map(), x);
  return (c == 0 && x > 0.0f) ? uint8_t{1} : c;
}

float decode_unsigned(uint8_t code) { return decoded().unsigned_value[code]; }

}  // namespace stepcast::backend::quant8
