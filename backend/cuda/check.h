// The checked calls of the CUDA runtime and NCCL: CUDA_CHECK(call) and
// NCCL_CHECK(call) throw std::runtime_error naming the call, the file and the
// line, with the library's own description of the status (as llm.c's cudaCheck).
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#ifdef STEPCAST_BACKEND_NCCL
#include <nccl.h>
#endif

namespace stepcast::backend {

[[noreturn]] inline void throw_call_failed(const char* call, const char* file, int line, const char* why) {
  throw std::runtime_error(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " + why);
}

inline void cuda_check(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess) throw_call_failed(call, file, line, cudaGetErrorString(status));
}

#ifdef STEPCAST_BACKEND_NCCL
inline void nccl_check(ncclResult_t status, const char* call, const char* file, int line) {
  if (status != ncclSuccess) throw_call_failed(call, file, line, ncclGetErrorString(status));
}
#endif

}  // namespace stepcast::backend

#define CUDA_CHECK(call) ::stepcast::backend::cuda_check((call), #call, __FILE__, __LINE__)
#define NCCL_CHECK(call) ::stepcast::backend::nccl_check((call), #call, __FILE__, __LINE__)
