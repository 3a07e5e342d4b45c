// NCCL collectives on the runtime's communication stream, bootstrapped
// through the c10d store (rank 0 publishes the unique id).
#include <nccl.h>

#include <cstring>
#include <stdexcept>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "common/errors.h"
#include "backend/cuda/check.h"
#include "backend/comm/collectives.h"

namespace stepcast::backend {

namespace {

ncclDataType_t nccl_type(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat: return ncclFloat32;
    case torch::kBFloat16: return ncclBfloat16;
    case torch::kHalf: return ncclFloat16;
    case torch::kByte: return ncclUint8;  // QLoRA's 4-bit codes, gathered at stage 3
    default: throw InternalError("NCCL: unsupported dtype");
  }
}

class NcclCollectives final : public Collectives {
 public:
  NcclCollectives(const c10::intrusive_ptr<c10d::Store>& store, const Rendezvous& rv, Runtime& runtime)
      : rank_(rv.rank), world_(rv.world), runtime_(runtime) {
    ncclUniqueId id;
    if (rank_ == 0) {
      NCCL_CHECK(ncclGetUniqueId(&id));
      std::vector<uint8_t> bytes(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof(id));
      store->set("nccl_id", bytes);
    } else {
      auto bytes = store->get("nccl_id");
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    NCCL_CHECK(ncclCommInitRank(&comm_, world_, id, rank_));
  }
  ~NcclCollectives() override { ncclCommDestroy(comm_); }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  std::string name() const override {
    int v = 0;
    ncclGetVersion(&v);
    return "nccl " + std::to_string(v);
  }
  cudaStream_t stream() { return static_cast<cudaStream_t>(runtime_.comm_stream()); }
  void all_reduce_sum(torch::Tensor& t) override {
    NCCL_CHECK(ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t), ncclSum, comm_, stream()));
  }
  void reduce_scatter_sum(torch::Tensor& full, torch::Tensor& shard) override {
    NCCL_CHECK(ncclReduceScatter(full.data_ptr(), shard.data_ptr(), static_cast<size_t>(shard.numel()), nccl_type(full),
                                 ncclSum, comm_, stream()));
  }
  void all_gather(const torch::Tensor& shard, torch::Tensor& full) override {
    NCCL_CHECK(ncclAllGather(shard.data_ptr(), full.data_ptr(), static_cast<size_t>(shard.numel()), nccl_type(full),
                             comm_, stream()));
  }
  void broadcast(torch::Tensor& t, int root) override {
    NCCL_CHECK(ncclBroadcast(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t), root, comm_, stream()));
  }
  void barrier() override {
    auto t = torch::zeros({1}, torch::dtype(torch::kFloat).device(runtime_.device()));
    runtime_.comm_waits_for_compute();
    all_reduce_sum(t);
    runtime_.synchronize();
  }

 private:
  int rank_, world_;
  Runtime& runtime_;
  ncclComm_t comm_{};
};

}  // namespace

std::unique_ptr<Collectives> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, const Rendezvous& rv,
                                       Runtime& runtime) {
  return std::make_unique<NcclCollectives>(store, rv, runtime);
}

}  // namespace stepcast::backend
