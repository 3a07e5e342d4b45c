#pragma once

#include <filesystem>
#include <string>

#include "model/hardware.h"
#include "model/model_spec.h"

namespace stepcast::test {

inline std::filesystem::path data_dir() { return STEPCAST_DATA_DIR; }
inline ModelSpec model(const std::string& name) { return resolve_model(name, data_dir()); }
inline HardwareProfile hardware(const std::string& name) { return resolve_hardware(name, data_dir()); }

// |a - b| <= abs + rel * |b|
inline bool close(double a, double b, double rel, double abs = 0.0) {
  const double diff = a > b ? a - b : b - a;
  return diff <= abs + rel * (b < 0 ? -b : b);
}

}  // namespace stepcast::test
