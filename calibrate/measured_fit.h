// The component-only calibration of hardware that step runs cannot calibrate: `microbench` on
// it times the components (the CPU optimizer, PCIe copies; GEMMs, attention and collectives
// where it ran on the GPU), the component fit (fit.h, stage 1) measures their coefficients, and
// the same fit on the reference profile's micro-benchmarks gives the ratios that the profile's
// [coefficients.measured] holds (model/hardware.h, MeasuredComponents).
#pragma once

#include <string>
#include <vector>

#include "calibrate/fit.h"
#include "calibrate/micro_record.h"
#include "model/hardware.h"

namespace stepcast::calibrate {

struct MeasuredFit {
  MeasuredComponents measured;   // ratios of the coefficients measured on both; no source or runs yet
  FitResult here, reference;     // the two component fits
  std::vector<Coef> coefs;       // the coefficients both sets of records measure, in Coef order
  std::vector<Coef> only_here;   // measured here, not on the reference: left out
  std::vector<Coef> same_gpu;    // GPU components on the reference's GPU kind: left out
};

// The host's components (the CPU optimizer's rates, the PCIe copies): measured on every
// hardware; the GPU's only where it is not the reference's kind.
bool is_host_component(Coef c);

// Throws InputError naming the record when a GPU benchmark was timed on a "cpu" device.
void check_micro_devices(const std::vector<MicroRecord>& micro);

// The component fits of `micro` on `hw` and `ref_micro` on `ref`, from the default coefficients,
// and the ratio of each coefficient both measure. Throws InputError when they share none.
MeasuredFit measure_components(const std::vector<MicroRecord>& micro, const HardwareProfile& hw,
                               const std::vector<MicroRecord>& ref_micro, const HardwareProfile& ref);

// calibrate fit with micro-benchmarks and no step runs: writes [coefficients.measured] into the
// profile (or `out_path`) and prints the ratios (or JSON). Returns the exit status.
int run_measured_fit(const std::vector<std::string>& run_files, const std::string& hw_name, const std::string& out_path,
                     const std::string& dir, bool json);

}  // namespace stepcast::calibrate
