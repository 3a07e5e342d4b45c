// The CUDA runtime of the engine: raw streams and events beside LibTorch's
// compute stream. Built wherever the CUDA toolkit is found; LibTorch's CUDA
// parts (current stream, allocator statistics) only where LibTorch has CUDA.
#include <cuda_runtime.h>

#include <memory>

#include <stdexcept>
#include <vector>

#include "common/errors.h"
#include "common/units.h"
#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"
#include "backend/runtime/runtime.h"

#ifdef STEPCAST_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace stepcast::backend {

namespace {

kernels::DType dtype_of(const torch::Tensor& t) {
  if (t.scalar_type() == torch::kFloat) return kernels::DType::kFloat32;
  if (t.scalar_type() == torch::kBFloat16) return kernels::DType::kBFloat16;
  throw InternalError("unsupported dtype for the engine's kernels");
}

class CudaRuntime final : public Runtime {
 public:
  explicit CudaRuntime(int index) : index_(index) {
    CUDA_CHECK(cudaSetDevice(index));
    CUDA_CHECK(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&sync_event_, cudaEventDisableTiming));
  }
  ~CudaRuntime() override {
    for (auto e : events_) cudaEventDestroy(e);
    for (auto e : markers_) cudaEventDestroy(e);
    cudaEventDestroy(sync_event_);
    cudaStreamDestroy(comm_);
  }
  bool is_cuda() const override { return true; }
  torch::Device device() const override { return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index_)); }

  cudaStream_t compute() const {
#ifdef STEPCAST_TORCH_CUDA
    return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(index_)).stream();
#else
    return nullptr;  // LibTorch's default stream is the legacy default stream
#endif
  }

  void comm_waits_for_compute() override {
    CUDA_CHECK(cudaEventRecord(sync_event_, compute()));
    CUDA_CHECK(cudaStreamWaitEvent(comm_, sync_event_, 0));
  }
  int record_comm_event() override {
    if (next_event_ == events_.size()) {
      cudaEvent_t e;
      CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      events_.push_back(e);
    }
    CUDA_CHECK(cudaEventRecord(events_[next_event_], comm_));
    return static_cast<int>(next_event_++);
  }
  void compute_waits_for_event(int e) override { CUDA_CHECK(cudaStreamWaitEvent(compute(), events_.at(static_cast<size_t>(e)), 0)); }
  bool event_done(int e) override {
    cudaError_t r = cudaEventQuery(events_.at(static_cast<size_t>(e)));
    if (r == cudaErrorNotReady) return false;
    CUDA_CHECK(r);
    return true;
  }
  void host_waits_for_event(int e) override { CUDA_CHECK(cudaEventSynchronize(events_.at(static_cast<size_t>(e)))); }
  std::function<void()> comm_host_waiter() override {
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(e, comm_));
    // Owned by the waiter (and its copies): destroyed with the last of them.
    std::shared_ptr<CUevent_st> owned(e, [](cudaEvent_t ev) { cudaEventDestroy(ev); });
    return [owned] { CUDA_CHECK(cudaEventSynchronize(owned.get())); };
  }
  void compute_waits_for_comm() override {
    CUDA_CHECK(cudaEventRecord(sync_event_, comm_));
    CUDA_CHECK(cudaStreamWaitEvent(compute(), sync_event_, 0));
  }
  void* comm_stream() override { return comm_; }
  void synchronize() override {
    CUDA_CHECK(cudaStreamSynchronize(comm_));
    CUDA_CHECK(cudaStreamSynchronize(compute()));
  }
  int mark() override {
    if (next_marker_ == markers_.size()) {
      cudaEvent_t e;
      CUDA_CHECK(cudaEventCreate(&e));
      markers_.push_back(e);
    }
    CUDA_CHECK(cudaEventRecord(markers_[next_marker_], compute()));
    return static_cast<int>(next_marker_++);
  }
  double elapsed_s(int from, int to) override {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, markers_.at(static_cast<size_t>(from)), markers_.at(static_cast<size_t>(to))));
    return 1e-3 * ms;
  }
  void reset_markers() override {
    next_marker_ = 0;
    next_event_ = 0;
  }
  void add_inplace_on_comm(torch::Tensor& dst, const torch::Tensor& src) override {
    kernels::add_inplace(dst.data_ptr(), src.data_ptr(), dst.numel(), dtype_of(dst), comm_);
  }
  void copy_to_host_on_comm(torch::Tensor& host, const torch::Tensor& dev) override {
    CUDA_CHECK(cudaMemcpyAsync(host.data_ptr(), dev.data_ptr(), dev.numel() * dev.element_size(),
                               cudaMemcpyDeviceToHost, comm_));
  }
  void copy_to_device(torch::Tensor& dev, const torch::Tensor& host) override {
    CUDA_CHECK(cudaMemcpyAsync(dev.data_ptr(), host.data_ptr(), host.numel() * host.element_size(),
                               cudaMemcpyHostToDevice, compute()));
  }
  void copy_to_device_on_comm(torch::Tensor& dev, const torch::Tensor& host) override {
    CUDA_CHECK(cudaMemcpyAsync(dev.data_ptr(), host.data_ptr(), host.numel() * host.element_size(),
                               cudaMemcpyHostToDevice, comm_));
  }
  std::string driver_version() override {
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    return "driver " + std::to_string(driver) + ", runtime " + std::to_string(runtime);
  }
  // Peaks of the caching allocator (aggregate over pools); 0 without LibTorch's CUDA.
  double peak_allocated_bytes() override { return allocator_peak(/*reserved=*/false); }
  double peak_reserved_bytes() override { return allocator_peak(/*reserved=*/true); }
  double allocator_peak(bool reserved) const {
#ifdef STEPCAST_TORCH_CUDA
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index_));
    return static_cast<double>((reserved ? stats.reserved_bytes : stats.allocated_bytes)[0].peak);
#else
    (void)reserved;
    return 0;
#endif
  }
  double alloc_retries() override {
#ifdef STEPCAST_TORCH_CUDA
    return static_cast<double>(
        c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index_)).num_alloc_retries);
#else
    return 0;
#endif
  }
  // Read from what the allocator made, not from its settings: CUDAAllocatorConfig's inline
  // query answers false outside torch's own build (PYTORCH_C10_DRIVER_API_SUPPORTED is torch's),
  // while the allocator itself, in libc10_cuda, takes the setting.
  bool expandable_segments() override {
#ifdef STEPCAST_TORCH_CUDA
    // A block of the large pool (above 1 MiB), where the training's tensors live.
    const torch::Tensor probe = torch::empty({int64_t{32} << 20}, torch::TensorOptions().dtype(torch::kUInt8).device(device()));
    for (const auto& segment : c10::cuda::CUDACachingAllocator::snapshot().segments)
      if (segment.device == index_ && segment.is_expandable) return true;
    return false;
#else
    return false;
#endif
  }
  void reset_peak() override {
#ifdef STEPCAST_TORCH_CUDA
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(index_));
#endif
  }
  double device_memory_bytes() override {
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    return static_cast<double>(total_b);
  }
  void limit_memory(double bytes) override {
    const double total = device_memory_bytes();
    if (!(bytes > 0.0) || bytes > total)
      throw InputError("--gpu-mem-limit-gib " + std::to_string(bytes / kBytesPerGiB) + " is out of range (0, " +
                       std::to_string(total / kBytesPerGiB) + "] for this device");
#ifdef STEPCAST_TORCH_CUDA
    (void)torch::empty({1}, torch::TensorOptions().device(device()));  // the allocator starts on first use
    c10::cuda::CUDACachingAllocator::setMemoryFraction(bytes / total, static_cast<c10::DeviceIndex>(index_));
#else
    throw InputError("--gpu-mem-limit-gib needs LibTorch with CUDA");
#endif
  }
  std::string device_name() override {
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, index_));
    return prop.name;
  }

 private:
  int index_;
  cudaStream_t comm_{};
  cudaEvent_t sync_event_{};
  std::vector<cudaEvent_t> events_, markers_;
  size_t next_event_ = 0, next_marker_ = 0;
};

}  // namespace

std::unique_ptr<Runtime> Runtime::cuda(int index) { return std::make_unique<CudaRuntime>(index); }

}  // namespace stepcast::backend
