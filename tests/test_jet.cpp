// The one formula, differentiated: predict_step_time and predict_memory
// instantiated on ceres::Jet must give the same values as on double, and
// derivatives equal to central finite differences of the double version.
#include <ceres/jet.h>
#include "doctest_after_glog.h"

#include "model/prediction.h"
#include "test_util.h"

using namespace stepcast;

namespace {

using Jet = ceres::Jet<double, kNumCoefs>;

double step_at(const Features& f, CoefVector c) { return predict_step_time(f.step, c.data()).step_s; }
double mem_at(const Features& f, CoefVector c) { return predict_memory(f.memory, c.data()).gpu_total_bytes; }

}  // namespace

TEST_CASE("Jet derivatives equal finite differences for every coefficient") {
  const ModelSpec m = test::model("llama-2-7b");
  const HardwareProfile hw = test::hardware("h200-sxm");
  for (int variant = 0; variant < 4; ++variant) {
    TrainConfig c;
    c.gpus_per_node = 2;
    c.micro_batch = 2;
    c.gas = 4;
    c.zero_stage = variant;
    if (variant >= 2) c.offload_optimizer = OffloadDevice::kCpu;
    if (variant == 3) c.activation_checkpointing = true;
    CAPTURE(variant);
    const Features f = make_features(m, hw, c);
    const CoefVector base = hw.coefs;
    std::array<Jet, kNumCoefs> jets;
    for (int i = 0; i < kNumCoefs; ++i) jets[i] = Jet(base[i], i);
    const StepTime<Jet> tj = predict_step_time(f.step, jets.data());
    const MemoryEstimate<Jet> mj = predict_memory(f.memory, jets.data());
    CHECK(tj.step_s.a == doctest::Approx(step_at(f, base)).epsilon(1e-12));
    CHECK(mj.gpu_total_bytes.a == doctest::Approx(mem_at(f, base)).epsilon(1e-12));
    for (int i = 0; i < kNumCoefs; ++i) {
      CAPTURE(coef_table()[i].name);
      const double h = 1e-6 * std::max(std::abs(base[i]), 1e-9);
      CoefVector up = base, down = base;
      up[i] += h;
      down[i] -= h;
      const double fd_step = (step_at(f, up) - step_at(f, down)) / (2 * h);
      const double fd_mem = (mem_at(f, up) - mem_at(f, down)) / (2 * h);
      // Relative to the value's scale: the formula has kinks (max with 0) where
      // one-sided slopes differ; the configurations here sit away from them.
      CHECK(std::abs(tj.step_s.v[i] - fd_step) * std::abs(base[i]) <= 1e-5 * tj.step_s.a + 1e-12);
      CHECK(std::abs(mj.gpu_total_bytes.v[i] - fd_mem) * std::abs(base[i]) <= 1e-5 * mj.gpu_total_bytes.a + 1e-3);
    }
  }
}
