// calibrate fit: fits the coefficients to run records and micro-benchmarks
// (calibrate/fit.h) and writes the calibrated profile with its provenance.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace stepcast::calibrate {

// Returns the exit status; prints the coefficients and the fit's accuracy (or JSON).
int run_fit(const std::vector<std::string>& run_files, const std::string& hw_name, const std::string& out_path,
            double holdout_frac, uint64_t seed, const std::string& dir, bool json,
            const std::string& engine = "stepcast");

}  // namespace stepcast::calibrate
