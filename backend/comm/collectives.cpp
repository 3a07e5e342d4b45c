#include "backend/comm/collectives.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <thread>

#include "common/errors.h"

#ifdef STEPCAST_HAVE_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

namespace stepcast::backend {

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

}  // namespace

Rendezvous rendezvous_from_env(int timeout_s) {
  Rendezvous rv;
  rv.rank = env_int("RANK", 0);
  rv.world = env_int("WORLD_SIZE", 1);
  rv.local_rank = env_int("LOCAL_RANK", 0);
  rv.local_world = env_int("LOCAL_WORLD_SIZE", rv.world);
  if (const char* a = std::getenv("MASTER_ADDR")) rv.master_addr = a;
  rv.master_port = env_int("MASTER_PORT", 29500);
  rv.timeout_s = timeout_s;
  return rv;
}

c10::intrusive_ptr<c10d::Store> make_store(const Rendezvous& rv) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(rv.master_port);
  opts.isServer = rv.rank == 0;
  opts.numWorkers = rv.world;
  opts.waitWorkers = false;  // connect() counts the arrivals itself, to say how many came
  opts.timeout = std::chrono::seconds(rv.timeout_s);
  auto tcp = c10::make_intrusive<c10d::TCPStore>(rv.master_addr, opts);
  return c10::make_intrusive<c10d::PrefixStore>("stepcast", tcp);
}

namespace {

class SingleCollectives final : public Collectives {
 public:
  int rank() const override { return 0; }
  int world() const override { return 1; }
  std::string name() const override { return "none"; }
  void all_reduce_sum(torch::Tensor&) override {}
  void reduce_scatter_sum(torch::Tensor& full, torch::Tensor& shard) override {
    if (shard.data_ptr() != full.data_ptr()) shard.copy_(full);
  }
  void all_gather(const torch::Tensor& shard, torch::Tensor& full) override {
    at::AutoDispatchBelowADInplaceOrView guard;  // see GlooCollectives::all_gather
    if (shard.data_ptr() != full.data_ptr()) full.copy_(shard);
  }
  void broadcast(torch::Tensor&, int) override {}
  void barrier() override {}
};

#ifdef STEPCAST_HAVE_GLOO
class GlooCollectives final : public Collectives {
 public:
  GlooCollectives(const c10::intrusive_ptr<c10d::Store>& store, const Rendezvous& rv) : rank_(rv.rank), world_(rv.world) {
    auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(rv.timeout_s));
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rv.rank, rv.world, opts);
  }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  std::string name() const override { return "gloo"; }
  void all_reduce_sum(torch::Tensor& t) override {
    // Gloo in LibTorch 1.13 has no bf16: reduce in fp32 (which is also what
    // an fp32 reduction of bf16 gradients would give on the GPU).
    std::vector<torch::Tensor> v{t.scalar_type() == torch::kBFloat16 ? t.to(torch::kFloat) : t};
    pg_->allreduce(v)->wait();
    if (v[0].data_ptr() != t.data_ptr()) {
      at::AutoDispatchBelowADInplaceOrView guard;
      t.copy_(v[0]);
    }
  }
  void reduce_scatter_sum(torch::Tensor& full, torch::Tensor& shard) override {
    // Gloo has no reduce-scatter in 1.13: all-reduce, keep the local shard.
    all_reduce_sum(full);
    shard.copy_(full.narrow(0, rank_ * shard.numel(), shard.numel()));
  }
  void all_gather(const torch::Tensor& shard, torch::Tensor& full) override {
    const int64_t n = shard.numel();
    const auto wire = shard.scalar_type() == torch::kBFloat16 ? torch::kFloat : shard.scalar_type();
    std::vector<std::vector<torch::Tensor>> out(1);
    for (int r = 0; r < world_; ++r) out[0].push_back(torch::empty({n}, torch::dtype(wire)));
    std::vector<torch::Tensor> in{shard.to(wire).contiguous().clone()};
    pg_->allgather(out, in)->wait();
    // Written like NCCL writes: without bumping the version counter that
    // autograd checks, since stage 3 refills parameters its graph has saved.
    at::AutoDispatchBelowADInplaceOrView guard;
    for (int r = 0; r < world_; ++r) full.narrow(0, r * n, n).copy_(out[0][static_cast<size_t>(r)]);
  }
  void broadcast(torch::Tensor& t, int root) override {
    std::vector<torch::Tensor> v{t.scalar_type() == torch::kBFloat16 ? t.to(torch::kFloat) : t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    pg_->broadcast(v, o)->wait();
    if (v[0].data_ptr() != t.data_ptr()) t.copy_(v[0]);
  }
  void barrier() override { pg_->barrier()->wait(); }

 private:
  int rank_, world_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
};
#endif

}  // namespace

std::unique_ptr<Collectives> make_single() { return std::make_unique<SingleCollectives>(); }

std::unique_ptr<Collectives> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, const Rendezvous& rv) {
#ifdef STEPCAST_HAVE_GLOO
  return std::make_unique<GlooCollectives>(store, rv);
#else
  (void)store;
  (void)rv;
  throw InputError("this LibTorch has no Gloo process group: run on the GPU (NCCL) or with --nproc 1");
#endif
}

#ifndef STEPCAST_BACKEND_NCCL
std::unique_ptr<Collectives> make_nccl(const c10::intrusive_ptr<c10d::Store>&, const Rendezvous&, Runtime&) {
  throw InputError("this build of train has no NCCL support");
}
#endif

Connection connect(const Rendezvous& rv, Runtime& runtime) {
  Connection c;
  if (rv.world == 1) {
    c.comm = make_single();
    return c;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(rv.timeout_s);
  c.store = make_store(rv);
  // Every rank checks in and waits for the others, within the one timeout.
  const std::string key = "arrived";
  int64_t arrived = c.store->add(key, 1);
  while (arrived < rv.world) {
    if (std::chrono::steady_clock::now() > deadline)
      throw IoError("rank " + std::to_string(rv.rank) + ": " + std::to_string(arrived) + " of " +
                    std::to_string(rv.world) + " ranks arrived at " + rv.master_addr + ":" +
                    std::to_string(rv.master_port) + " within the timeout of " + std::to_string(rv.timeout_s) +
                    " s (--timeout-s)");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    arrived = c.store->add(key, 0);
  }
  c.comm = runtime.is_cuda() ? make_nccl(c.store, rv, runtime) : make_gloo(c.store, rv);
  return c;
}

}  // namespace stepcast::backend
