#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "backend/runtime/runtime.h"
#include "common/errors.h"

namespace stepcast::backend {

namespace {

class CpuRuntime final : public Runtime {
 public:
  bool is_cuda() const override { return false; }
  torch::Device device() const override { return torch::kCPU; }
  void comm_waits_for_compute() override {}
  int record_comm_event() override { return 0; }
  void compute_waits_for_event(int) override {}
  bool event_done(int) override { return true; }
  void host_waits_for_event(int) override {}
  std::function<void()> comm_host_waiter() override { return [] {}; }
  void compute_waits_for_comm() override {}
  void* comm_stream() override { return nullptr; }
  void synchronize() override {}
  int mark() override {
    marks_.push_back(std::chrono::steady_clock::now());
    return static_cast<int>(marks_.size()) - 1;
  }
  double elapsed_s(int from, int to) override {
    return std::chrono::duration<double>(marks_.at(static_cast<size_t>(to)) - marks_.at(static_cast<size_t>(from))).count();
  }
  void reset_markers() override { marks_.clear(); }
  void add_inplace_on_comm(torch::Tensor& dst, const torch::Tensor& src) override { dst.add_(src); }
  void copy_to_host_on_comm(torch::Tensor& host, const torch::Tensor& dev) override { host.copy_(dev); }
  void copy_to_device(torch::Tensor& dev, const torch::Tensor& host) override { dev.copy_(host); }
  void copy_to_device_on_comm(torch::Tensor& dev, const torch::Tensor& host) override {
    at::AutoDispatchBelowADInplaceOrView guard;  // stage-3 refills must not bump autograd's version counter
    dev.copy_(host);
  }
  std::string driver_version() override { return ""; }
  double peak_allocated_bytes() override { return 0; }
  double peak_reserved_bytes() override { return 0; }
  void reset_peak() override {}
  double alloc_retries() override { return 0; }
  bool expandable_segments() override { return false; }
  double device_memory_bytes() override { return 0; }
  void limit_memory(double) override { throw InputError("--gpu-mem-limit-gib needs a CUDA device (--device cuda)"); }
  std::string device_name() override { return "cpu"; }

 private:
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

double status_field_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stod(line.substr(key.size()));
  return 0;
}

}  // namespace

std::unique_ptr<Runtime> Runtime::cpu() { return std::make_unique<CpuRuntime>(); }

std::unique_ptr<Runtime> Runtime::from_flag(const std::string& device, int device_index) {
  if (device == "cuda" || (device == "auto" && torch::cuda::is_available())) return cuda(device_index);
  if (device == "cpu" || device == "auto") return cpu();
  throw InputError("--device \"" + device + "\" is not valid (valid: auto, cpu, cuda)");
}

#ifndef STEPCAST_BACKEND_CUDA
std::unique_ptr<Runtime> Runtime::cuda(int) {
  throw InputError("this build of train has no CUDA support (configure on a machine with CUDA and a CUDA LibTorch)");
}
#endif

bool runs_on_cpu(const std::string& device) {
  return device == "cpu" || (device == "auto" && !torch::cuda::is_available());
}

double host_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("MemAvailable:", 0) == 0) return 1024.0 * std::stod(line.substr(13));
  return 0;  // unknown
}

double host_rss_bytes() { return 1024.0 * status_field_kib("VmRSS"); }
double host_peak_rss_bytes() { return 1024.0 * status_field_kib("VmHWM"); }

}  // namespace stepcast::backend
