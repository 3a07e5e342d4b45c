// The engine's view of a device: a compute stream (LibTorch's current
// stream), a communication stream, events between them, timing markers and
// the few raw copies and kernels the engine launches itself. On the CPU
// every operation is synchronous and markers read the wall clock, so the
// ZeRO logic above is the same code on both.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>

namespace stepcast::backend {

class Runtime {
 public:
  virtual ~Runtime() = default;
  virtual bool is_cuda() const = 0;
  virtual torch::Device device() const = 0;

  // --- ordering between streams --------------------------------------------
  virtual void comm_waits_for_compute() = 0;  // work enqueued so far on compute precedes later comm work
  virtual int record_comm_event() = 0;        // an event after the comm work enqueued so far
  virtual void compute_waits_for_event(int event) = 0;
  virtual bool event_done(int event) = 0;
  virtual void host_waits_for_event(int event) = 0;
  // A function another thread may call, at any later time, to wait for the comm work
  // enqueued so far (its own event: it outlives reset_markers() and the step).
  virtual std::function<void()> comm_host_waiter() = 0;
  virtual void compute_waits_for_comm() = 0;
  virtual void* comm_stream() = 0;            // cudaStream_t, or nullptr on the CPU
  virtual void synchronize() = 0;             // host waits for both streams

  // --- timing ---------------------------------------------------------------
  virtual int mark() = 0;                     // a marker on the compute stream
  virtual double elapsed_s(int from, int to) = 0;  // valid after synchronize()
  virtual void reset_markers() = 0;           // at the start of each step

  // --- data movement the engine issues itself -------------------------------
  virtual void add_inplace_on_comm(torch::Tensor& dst, const torch::Tensor& src) = 0;  // dst += src
  virtual void copy_to_host_on_comm(torch::Tensor& host, const torch::Tensor& dev) = 0;
  virtual void copy_to_device(torch::Tensor& dev, const torch::Tensor& host) = 0;  // on compute
  virtual void copy_to_device_on_comm(torch::Tensor& dev, const torch::Tensor& host) = 0;

  // Memory the device's caching allocator reached (bytes); 0 where unknown.
  virtual double peak_allocated_bytes() = 0;
  virtual double peak_reserved_bytes() = 0;
  virtual void reset_peak() = 0;
  // Times the caching allocator freed its cache and retried an allocation since the process
  // began (a step near the device's capacity pays for each); 0 on the CPU.
  virtual double alloc_retries() = 0;
  virtual bool expandable_segments() = 0;  // whether the caching allocator grows expandable segments
  virtual double device_memory_bytes() = 0;  // total memory of the device
  // Caps what the caching allocator may hold on this device (bytes): it frees its cache and
  // retries before it fails, as on a card of that size. Throws InputError on the CPU.
  virtual void limit_memory(double bytes) = 0;
  virtual std::string device_name() = 0;
  virtual std::string driver_version() = 0;

  static std::unique_ptr<Runtime> cpu();
  static std::unique_ptr<Runtime> cuda(int device_index);  // throws where CUDA is not built
  // The --device flag of the CLIs: auto (CUDA where there is a GPU), cpu or cuda;
  // anything else is an InputError naming the flag and its value.
  static std::unique_ptr<Runtime> from_flag(const std::string& device, int device_index);
};

// Host memory of this process (bytes): current and peak resident set.
double host_rss_bytes();
// What the kernel could give without swapping (/proc/meminfo MemAvailable), 0 when unknown.
double host_available_bytes();
// Whether `--device` resolves to the CPU runtime.
bool runs_on_cpu(const std::string& device);
double host_peak_rss_bytes();

}  // namespace stepcast::backend
