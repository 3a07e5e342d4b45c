// Backend correctness on the CPU, multi-rank with Gloo: the ZeRO stages equal
// plain data parallel on full tensors, the CPU AdamW equals
// torch::optim::AdamW, the loss falls on real text, a resumed checkpoint
// continues the same loss curve, and faults end the run cleanly.
#include <torch/torch.h>
#define DOCTEST_CONFIG_IMPLEMENT
#include "doctest_after_glog.h"

#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>

#include "backend/optim/cpu_adamw.h"
#include "backend/optim/cpu_cores.h"

#include "backend/engine/layout.h"
#include "backend/optim/quant8.h"
#include "calibrate/micro_record.h"
#include "calibrate/run_record.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace stepcast;
using namespace stepcast::backend;

namespace {

std::string g_train = "train";  // set from the command line (see main below)
std::string g_device = "cpu";   // --train-device=cuda runs the same tests on GPUs (ctest label gpu)
int g_nproc = 2;                // --nproc=N: ranks of the multi-rank tests
double g_tol = 1e-5;            // stage-vs-stage tolerance; GPU kernels reduce in other orders: 1e-4

std::string ranks() { return " --nproc " + std::to_string(g_nproc); }

fs::path tmpdir() {
  static fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("stepcast_backend_test_" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

// Runs train with `args`; returns its exit code.
int train(const std::string& args, std::string* stderr_text = nullptr) {
  const fs::path err = tmpdir() / "stderr.txt";
  const std::string cmd = g_train + " --device " + g_device + " --quiet --data " + (test::data_dir() / "text" / "kjv_genesis_exodus.txt").string() +
                          " " + args + " 2>" + err.string();
  const int status = std::system(cmd.c_str());
  if (stderr_text) {
    std::ifstream in(err);
    std::ostringstream s;
    s << in.rdbuf();
    *stderr_text = s.str();
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

torch::Tensor load_params(const fs::path& p) {
  torch::Tensor t;
  torch::load(t, p.string());
  return t;
}

std::vector<double> losses(const fs::path& jsonl) {
  std::vector<double> out;
  std::ifstream in(jsonl);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return out;
}

// max |a - b| / max |b|, printing the worst element on failure (llm.c style).
double rel_error(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  const auto diff = (a - b).abs();
  return diff.max().item<double>() / scale;
}

const char* kBase = "--model test-llama-tiny --precision fp32 --seq 32 --micro-batch 2 --steps 3 --lr 1e-3";

}  // namespace

TEST_CASE("the backend's parameter count equals the planner's for every catalog model it runs") {
  for (const auto& e : list_model_catalog(test::data_dir())) {
    const ModelSpec m = load_model_card(e.path);
    if (m.model_type == "gpt2" || m.model_type == "opt" || m.tied_embeddings) continue;
    CAPTURE(m.name);
    CHECK(total_numel(build_layout(m, 2)) == m.total_params());
  }
}

TEST_CASE("CPU AdamW equals torch::optim::AdamW, on every SIMD path") {
  std::vector<SimdLevel> levels = {SimdLevel::kScalar};
  if (cpu_simd_level() == SimdLevel::kAvx2 || cpu_simd_level() == SimdLevel::kAvx512) levels.push_back(SimdLevel::kAvx2);
  if (cpu_simd_level() == SimdLevel::kAvx512) levels.push_back(SimdLevel::kAvx512);
  for (SimdLevel level : levels) {
    CAPTURE(simd_name(level));
    torch::manual_seed(7);
    const int64_t n = 100003;  // not a multiple of any vector width or thread chunk
    auto param = torch::randn({n});
    auto ref_param = param.clone().requires_grad_(true);
    torch::optim::AdamW ref({ref_param}, torch::optim::AdamWOptions(2e-3).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));
    auto master = param.clone(), m = torch::zeros({n}), v = torch::zeros({n});
    auto out = torch::empty({n}, torch::kBFloat16);
    auto out32 = torch::empty({n});
    for (int step = 1; step <= 5; ++step) {
      auto grad = torch::randn({n}) * 3.0;
      ref_param.mutable_grad() = grad.clone();
      ref.step();
      kernels::AdamWArgs a;
      a.lr = 2e-3f;
      a.beta1 = 0.9f;
      a.beta2 = 0.95f;
      a.eps = 1e-8f;
      a.weight_decay = 0.1f;
      a.step = step;
      // The engine passes summed gradients with a 1/(ranks x GAS) scale: do the same.
      auto summed = (grad * 4.0).contiguous();
      a.grad_scale = 0.25f;
      cpu_adamw(master.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), summed.data_ptr(),
                kernels::DType::kFloat32, step % 2 ? out.data_ptr() : out32.data_ptr(),
                step % 2 ? kernels::DType::kBFloat16 : kernels::DType::kFloat32, n, a, level);
    }
    // fp32 arithmetic in a slightly different order: relative error far under 1e-5.
    CHECK(rel_error(master, ref_param.detach()) < 1e-5);
    // The bf16 copy (written on the last, odd step) is LibTorch's round-to-nearest-even cast.
    CHECK(torch::equal(out, master.to(torch::kBFloat16)));
  }
}

TEST_CASE("ranks split the host's physical cores: contiguous shares, one thread per core first") {
  // Two packages of 4 cores with 2 logical CPUs each, numbered as Linux does on such hosts:
  // CPUs 0-7 are the first thread of cores 0-3 (package 0) and 0-3 (package 1), 8-15 their siblings.
  std::vector<LogicalCpu> host;
  for (int id = 0; id < 16; ++id) host.push_back({id, (id % 8) / 4, id % 4});
  CHECK(rank_cpus(host, 0, 1) == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15});
  // Two ranks: one package each, the first thread of each core first.
  CHECK(rank_cpus(host, 0, 2) == std::vector<int>{0, 1, 2, 3, 8, 9, 10, 11});
  CHECK(rank_cpus(host, 1, 2) == std::vector<int>{4, 5, 6, 7, 12, 13, 14, 15});
  CHECK(physical_cores(host, rank_cpus(host, 1, 2)) == 4);
  // Three ranks on 8 cores: cores [8r/3, 8(r+1)/3) = [0,2), [2,5), [5,8).
  CHECK(rank_cpus(host, 0, 3) == std::vector<int>{0, 1, 8, 9});
  CHECK(rank_cpus(host, 1, 3) == std::vector<int>{2, 3, 4, 10, 11, 12});
  CHECK(rank_cpus(host, 2, 3) == std::vector<int>{5, 6, 7, 13, 14, 15});
  // A container limited to CPUs 2, 3, 10 (core 2's two threads, core 3's first): 2 cores.
  const std::vector<LogicalCpu> limited{host[2], host[3], host[10]};
  CHECK(rank_cpus(limited, 0, 1) == std::vector<int>{2, 3, 10});
  CHECK(rank_cpus(limited, 0, 2) == std::vector<int>{2, 10});
  CHECK(rank_cpus(limited, 1, 2) == std::vector<int>{3});
  // More ranks than cores: each still gets one (core r mod P when its share is empty).
  CHECK(rank_cpus(limited, 2, 4) == std::vector<int>{2, 10});  // cores [1, 1): core 2 mod 2
  CHECK(rank_cpus(limited, 3, 4) == std::vector<int>{3});      // cores [1, 2)
  CHECK_THROWS(rank_cpus(host, 2, 2));
  CHECK_THROWS(rank_cpus({}, 0, 1));
  CHECK(cpu_list_string({8, 0, 1, 2, 3, 10}) == "0-3,8,10");
  CHECK(cpu_list_string({5}) == "5");
}

TEST_CASE("the CPU optimizer's threads run on their cores, and their errors reach the caller") {
  const std::vector<int> mine = rank_cpus(allowed_cpus(), 0, 1);
  REQUIRE(!mine.empty());
  const int threads = static_cast<int>(mine.size()) + 1;  // one more than the cores: it wraps to the first
  for (int round = 0; round < 3; ++round) {
    std::vector<int> ran_on(threads, -1);
    run_on_cores(threads, [&](int t) {
      // Busy for a moment, so that the kernel would have moved an unbound thread.
      volatile double x = 0;
      for (int i = 0; i < 200000; ++i) x = x + i;
      ran_on[t] = sched_getcpu();
    });
    for (int t = 0; t < threads; ++t) {
      CAPTURE(t);
      if (cpus_bound()) CHECK(ran_on[t] == mine[t % mine.size()]);
      else CHECK(ran_on[t] >= 0);
    }
  }
  CHECK_THROWS_WITH(run_on_cores(2, [](int t) {
                      if (t == 1) throw std::runtime_error("thread 1 failed");
                    }),
                    "thread 1 failed");
  int sum = 0;
  std::mutex mu;
  run_on_cores(4, [&](int t) {
    std::lock_guard<std::mutex> lock(mu);
    sum += t + 1;
  });
  CHECK(sum == 1 + 2 + 3 + 4);
}

TEST_CASE("8-bit quantisation: the paper's dynamic map, nearest point, error bound") {
  // Dettmers et al. 2022, dynamic tree quantisation: with b magnitude bits the
  // points span 10^-(b-1) .. 1, each decade i holding 2^i evenly spaced points.
  for (int bits : {7, 8}) {
    CAPTURE(bits);
    const quant8::Map& map = bits == 7 ? quant8::signed_magnitudes() : quant8::unsigned_map();
    const int size = 1 << bits;
    std::vector<float> point(static_cast<size_t>(size));
    for (int c = 0; c < size; ++c) point[static_cast<size_t>(c)] = quant8::decode_magnitude(map, static_cast<uint8_t>(c));
    CHECK(point[0] == 0.0f);
    CHECK(point[1] == doctest::Approx(std::pow(10.0, -(bits - 1))).epsilon(1e-6));
    CHECK(point[static_cast<size_t>(size - 1)] == doctest::Approx(1.0).epsilon(1e-6));
    for (int c = 1; c < size; ++c) CHECK(point[static_cast<size_t>(c)] > point[static_cast<size_t>(c - 1)]);
    // encode is the nearest point (brute-force reference), and in the top decade the error is at
    // most half its spacing: 0.9 / 2^(bits-1) / 2 (0.00703 for the signed map, 0.00352 unsigned).
    const double half_top_spacing = 0.45 / std::ldexp(1.0, bits - 1);
    int not_nearest = 0;
    double worst_top = 0;
    for (int k = 0; k <= 200000; ++k) {
      const float y = k < 100000 ? static_cast<float>(k) / 100000.0f : std::pow(10.0f, -static_cast<float>(k - 100000) / 12500.0f);
      const uint8_t c = quant8::encode_magnitude(map, y);
      float best = 2.0f;
      for (float p : point) best = std::min(best, std::fabs(p - y));
      if (std::fabs(point[c] - y) > best * (1.0f + 1e-6f) + 1e-12f) ++not_nearest;
      if (y >= 0.1f) worst_top = std::max(worst_top, static_cast<double>(std::fabs(point[c] - y)));
    }
    CHECK(not_nearest == 0);
    CHECK(worst_top <= half_top_spacing * (1 + 1e-6));
    CHECK(worst_top > 0.9 * half_top_spacing);  // the bound is tight: the grid is what we think it is
  }
  // Signs round-trip; a positive second moment never becomes 0, zero stays 0.
  CHECK(quant8::decode_signed(quant8::encode_signed(-0.5f)) == -quant8::decode_signed(quant8::encode_signed(0.5f)));
  CHECK(quant8::decode_unsigned(quant8::encode_unsigned(1e-12f)) > 0.0f);
  CHECK(quant8::encode_unsigned(0.0f) == 0);
  CHECK(quant8::encode_signed(0.0f) == 0);
}

namespace {

// The SIMD bodies of the 8-bit kernel this CPU runs: AVX2 and AVX-512.
std::vector<SimdLevel> simd_bodies_8bit() {
  std::vector<SimdLevel> out;
  if (cpu_simd_level() != SimdLevel::kScalar) out.push_back(SimdLevel::kAvx2);
  if (cpu_simd_level() == SimdLevel::kAvx512) out.push_back(SimdLevel::kAvx512);
  return out;
}

// The hyper-parameters of the 8-bit tests below, at a given step.
kernels::AdamWArgs drift_args(int step) {
  kernels::AdamWArgs a;
  a.lr = 1e-3f;
  a.weight_decay = 0.01f;
  a.step = step;
  return a;
}

}  // namespace

TEST_CASE("split master weights: exact for every float; the 8-bit update with them equals the fp32-master one") {
  // Join(split(x)) == x bit for bit. Cases: ties (low half 0x8000) of both signs, the largest
  // finite float (whose upper half rounds to inf), inf, a NaN, denormals, 0 and -0, then 1 M
  // random bit patterns.
  std::vector<uint32_t> bits = {0x3f808000u, 0xbf808000u, 0x3f807fffu, 0x3f818000u, 0x7f7fffffu, 0x7f800000u,
                                0x7fc00001u, 0x00000001u, 0x80007fffu, 0x00000000u, 0x80000000u, 0xffff8000u};
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < (1 << 20); ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    bits.push_back(static_cast<uint32_t>(state >> 32));
  }
  int64_t inexact = 0, not_rne = 0;
  for (uint32_t u : bits) {
    float x;
    std::memcpy(&x, &u, sizeof x);
    uint16_t hi;
    int16_t lo;
    split_master(x, hi, lo);
    const float y = join_master(hi, lo);
    uint32_t v;
    std::memcpy(&v, &y, sizeof v);
    inexact += v != u;
    // hi is round-to-nearest-even but at exact ties (low half 0x8000 with an even upper half),
    // where it rounds away from zero; NaNs aside (their bf16 is a quiet NaN).
    if (!std::isnan(x) && hi != float_to_bf16(x) && !((u & 0xffffu) == 0x8000u && ((u >> 16) & 1u) == 0)) ++not_rne;
  }
  CHECK(inexact == 0);
  CHECK(not_rne == 0);

  // The 8-bit update with split master weights is the same arithmetic: after 20 steps the
  // master weights, codes and absmax are bit-identical to the fp32-master kernel's, on every
  // SIMD path, and hi is the bf16 copy (equal to the fp32 kernel's copy but at ties).
  torch::manual_seed(7);
  const int64_t n = 3 * quant8::kBlock + 777;
  const auto init = torch::randn({n}) * 0.02;
  std::vector<SimdLevel> levels{SimdLevel::kScalar};
  if (cpu_simd_level() != SimdLevel::kScalar) levels.push_back(SimdLevel::kAvx2);
  if (cpu_simd_level() == SimdLevel::kAvx512) levels.push_back(SimdLevel::kAvx512);
  for (SimdLevel level : levels) {
    {
      CAPTURE(simd_name(level));
      auto master = init.clone();
      auto hi = torch::empty({n}, torch::kInt16), lo = torch::empty({n}, torch::kInt16);
      auto* h = reinterpret_cast<uint16_t*>(hi.data_ptr());
      auto* l = reinterpret_cast<int16_t*>(lo.data_ptr());
      for (int64_t i = 0; i < n; ++i) split_master(master.data_ptr<float>()[i], h[i], l[i]);
      torch::Tensor q[2][2], a[2][2];
      for (int k = 0; k < 2; ++k)
        for (int j = 0; j < 2; ++j) {
          q[k][j] = torch::zeros({n}, torch::kByte);
          a[k][j] = torch::zeros({quant8::num_blocks(n)});
        }
      auto out = torch::empty({n}, torch::kBFloat16);
      torch::manual_seed(11);
      for (int step = 1; step <= 20; ++step) {
        auto grad = (torch::randn({n}) * 1e-3 + 2e-4).to(torch::kBFloat16);
        const kernels::AdamWArgs args = drift_args(step);
        cpu_adamw8bit(master.data_ptr<float>(), q[0][0].data_ptr<uint8_t>(), q[0][1].data_ptr<uint8_t>(),
                      a[0][0].data_ptr<float>(), a[0][1].data_ptr<float>(), grad.data_ptr(), kernels::DType::kBFloat16,
                      out.data_ptr(), kernels::DType::kBFloat16, n, args, level);
        cpu_adamw8bit_split(h, l, q[1][0].data_ptr<uint8_t>(), q[1][1].data_ptr<uint8_t>(), a[1][0].data_ptr<float>(),
                            a[1][1].data_ptr<float>(), grad.data_ptr(), kernels::DType::kBFloat16, n, args, level);
      }
      int64_t master_diff = 0, copy_diff = 0;
      const auto* o = reinterpret_cast<const uint16_t*>(out.data_ptr());
      for (int64_t i = 0; i < n; ++i) {
        const float x = master.data_ptr<float>()[i];
        const float y = join_master(h[i], l[i]);
        master_diff += std::memcmp(&x, &y, sizeof x) != 0;
        copy_diff += h[i] != o[i];
      }
      CHECK(master_diff == 0);
      CHECK(torch::equal(q[0][0], q[1][0]));
      CHECK(torch::equal(q[0][1], q[1][1]));
      CHECK(torch::equal(a[0][0], a[1][0]));
      CHECK(torch::equal(a[0][1], a[1][1]));
      CHECK(copy_diff <= 2);  // ties: ~n / 2^17 expected
      CHECK((master - init).abs().max().item<double>() > 1e-3);  // it did train
    }
  }
}

TEST_CASE("8-bit AdamW: every SIMD path agrees with the scalar one and tracks fp32 AdamW") {
  torch::manual_seed(7);
  const int64_t n = 3 * quant8::kBlock + 777;  // a partial last block
  const auto init = torch::randn({n}) * 0.02;
  auto run8 = [&](SimdLevel level, torch::Tensor& qm_out) {
    auto master = init.clone();
    auto qm = torch::zeros({n}, torch::kByte), qv = torch::zeros({n}, torch::kByte);
    auto am = torch::zeros({quant8::num_blocks(n)}), av = torch::zeros({quant8::num_blocks(n)});
    auto out = torch::empty({n}, torch::kBFloat16);
    torch::manual_seed(11);
    for (int step = 1; step <= 20; ++step) {
      auto grad = (torch::randn({n}) * 1e-3 + 2e-4).to(torch::kBFloat16);
      const kernels::AdamWArgs a = drift_args(step);
      cpu_adamw8bit(master.data_ptr<float>(), qm.data_ptr<uint8_t>(), qv.data_ptr<uint8_t>(), am.data_ptr<float>(),
                    av.data_ptr<float>(), grad.data_ptr(), kernels::DType::kBFloat16, out.data_ptr(),
                    kernels::DType::kBFloat16, n, a, level);
    }
    CHECK(torch::equal(out, master.to(torch::kBFloat16)));
    qm_out = qm;
    return master;
  };
  torch::Tensor q_scalar, q_simd;
  const torch::Tensor scalar = run8(SimdLevel::kScalar, q_scalar);
  for (const SimdLevel level : simd_bodies_8bit()) {
    CAPTURE(simd_name(level));
    const torch::Tensor simd = run8(level, q_simd);
    // FMA vs separate multiply-add in the moment updates: codes may differ by one step, rarely.
    const auto code_diff = (q_simd.to(torch::kInt) - q_scalar.to(torch::kInt)).abs();
    CHECK(code_diff.gt(1).sum().item<int64_t>() <= n / 1000);  // beyond one step only across a sign flip near 0
    // The trajectories agree to 1e-4 of the distance travelled (2-norm; measured ~1e-5: the
    // 14-bit reciprocal estimates of the AVX-512 body). A single element may differ more: its
    // state codes can flip by one step where the two encoders' roundings disagree at a tie,
    // which moves that step's update by a fraction of lr (1e-3; the largest travel is ~2e-2).
    // Bound: 1 % of the largest travel, i.e. a fifth of one step's lr (measured 0.11 %).
    const double norm_error = ((simd - scalar).norm() / (scalar - init).norm()).item<double>();
    MESSAGE("trajectory error, 2-norm: " << norm_error << ", worst element: " << rel_error(simd - init, scalar - init));
    CHECK(norm_error < 1e-4);
    CHECK(rel_error(simd - init, scalar - init) < 0.01);
  }
  // fp32 AdamW on the same gradients: the 8-bit trajectory stays close (Dettmers et al. report
  // 8-bit Adam matching 32-bit); here: the difference is under 5 % of the distance travelled.
  auto master = init.clone(), m = torch::zeros({n}), v = torch::zeros({n});
  torch::manual_seed(11);
  for (int step = 1; step <= 20; ++step) {
    auto grad = (torch::randn({n}) * 1e-3 + 2e-4).to(torch::kBFloat16);
    const kernels::AdamWArgs a = drift_args(step);
    cpu_adamw(master.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), grad.data_ptr(),
              kernels::DType::kBFloat16, nullptr, kernels::DType::kBFloat16, n, a);
  }
  const double travelled = (master - init).norm().item<double>();
  const double apart = (scalar - master).norm().item<double>();
  CHECK(travelled > 1e-3);
  CHECK(apart < 0.05 * travelled);
}

TEST_CASE("8-bit AdamW: the SIMD encoders give the scalar encoder's codes (the nearest points)") {
  // With beta1 = beta2 = 0, lr = 0 and fp32 gradients the new moments are m = g and
  // v = g * g exactly. Each block starts with the gradient s (or -s), its absmax, and the
  // scalar encoder (checked against a brute-force nearest point above) encodes y = x *
  // (1 / absmax) for each moment x. The y: every point of both maps, every midpoint between
  // neighbours and every level switch, each with its 4 neighbouring floats; 0, denormals and
  // values under 2^-31; then log-uniform ones over 10^-9 .. 1. The blocks' scales s: 1, 0
  // (every code 0), ones whose second-moment absmax s^2 is at or just under the AVX-512
  // encoder's smallest (2^-95, under which it hands the block to the scalar encoder), and
  // random ones over 2^-48 .. 2^58 with random mantissas: the AVX-512 encoder encodes x, not
  // y, through lookups by x's exponent that it rebuilds per block from the absmax.
  // A SIMD code may differ from the scalar one only by one step and only at a tie: the
  // AVX-512 encoder computes x (inv_step / absmax) + offset in one rounding, with offset (up
  // to 2^8) and the product rounded to float, which moves the result by up to ~4 x 2^-16 of a
  // step from the scalar encoder's (which rounds y first); so where y is within 2^-13 of a
  // step from the midpoint of the two points.
  std::vector<float> y;
  for (const quant8::Map* map : {&quant8::signed_magnitudes(), &quant8::unsigned_map()}) {
    const int size = 1 << map->bits;
    std::vector<float> centres;
    for (int c = 0; c < size; ++c) {
      const float p = quant8::decode_magnitude(*map, static_cast<uint8_t>(c));
      centres.push_back(p);
      if (c + 1 < size) centres.push_back(0.5f * (p + quant8::decode_magnitude(*map, static_cast<uint8_t>(c + 1))));
    }
    for (float c : centres) {
      float lo = c, hi = c;
      y.push_back(c);
      for (int k = 0; k < 4; ++k) {
        lo = std::nextafter(lo, 0.0f);
        hi = std::nextafter(hi, 2.0f);
        y.push_back(lo);
        if (hi <= 1.0f) y.push_back(hi);
      }
    }
  }
  for (float v : {0.0f, 1e-45f, 1e-40f, 0x1p-40f, 0x1p-32f, 0x1p-31f, 0x1p-30f, 1e-9f}) y.push_back(v);
  const size_t fixed = y.size();
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> exponent(-9.0f, 0.0f);
  while (y.size() < fixed + 600000) y.push_back(std::pow(10.0f, exponent(rng)));
  // Blocks of kBlock values, each starting with its scale s; the signed moments take
  // alternating signs, the second moments take sqrt(y) s as gradient (its square is y s^2
  // to rounding; the check below uses the kernel's own v = g * g).
  const int64_t per_block = quant8::kBlock - 1;
  const int64_t blocks = static_cast<int64_t>((y.size() + per_block - 1) / per_block);
  const int64_t n = blocks * quant8::kBlock;
  std::vector<float> scale(static_cast<size_t>(blocks));
  std::uniform_int_distribution<int> binade(-48, 58);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  for (int64_t b = 0; b < blocks; ++b) {
    float& s = scale[static_cast<size_t>(b)];
    s = b % 4 == 0 ? 1.0f : std::ldexp(mantissa(rng), binade(rng));
    if (b == 1) s = 0.0f;
    if (b == 2) s = 0x1p-47f;          // s^2 = 2^-94
    if (b == 3) s = 0x1p-48f;          // s^2 = 2^-96: the scalar encoder
    if (b == 5) s = 0x1.6a09e6p-48f;   // s^2 = 2^-95 to rounding (sqrt(2) x 2^-48)
  }
  int64_t scalar_blocks = 0;
  for (float s : scale) scalar_blocks += s > 0 && s * s < 0x1p-95f;
  REQUIRE(scalar_blocks >= 1);
  for (int which = 0; which < 2; ++which) {  // 0: first moment, 1: second moment
    CAPTURE(which);
    auto grad = torch::zeros({n});
    float* g = grad.data_ptr<float>();
    for (int64_t b = 0; b < blocks; ++b) {
      const float s = scale[static_cast<size_t>(b)];
      g[b * quant8::kBlock] = (b & 1) ? -s : s;
      for (int64_t j = 0; j < per_block; ++j) {
        const size_t k = static_cast<size_t>(b * per_block + j);
        const float v = k < y.size() ? y[k] : 0.5f;
        g[b * quant8::kBlock + 1 + j] = which == 0 ? ((k & 1) ? -v : v) * s : std::sqrt(v) * s;
      }
    }
    kernels::AdamWArgs a;
    a.beta1 = 0.0f;
    a.beta2 = 0.0f;
    a.lr = 0.0f;
    auto codes = [&](SimdLevel level) {
      auto master = torch::zeros({n}), qm = torch::zeros({n}, torch::kByte), qv = torch::zeros({n}, torch::kByte);
      auto am = torch::zeros({blocks}), av = torch::zeros({blocks});
      cpu_adamw8bit(master.data_ptr<float>(), qm.data_ptr<uint8_t>(), qv.data_ptr<uint8_t>(), am.data_ptr<float>(),
                    av.data_ptr<float>(), g, kernels::DType::kFloat32, nullptr, kernels::DType::kBFloat16, n, a, level);
      for (int64_t b = 0; b < blocks; ++b) {
        const float s = scale[static_cast<size_t>(b)];
        CHECK(am.data_ptr<float>()[b] == s);
        CHECK(av.data_ptr<float>()[b] == s * s);
      }
      return which == 0 ? qm : qv;
    };
    const torch::Tensor scalar = codes(SimdLevel::kScalar);
    const uint8_t* s = scalar.data_ptr<uint8_t>();
    const quant8::Map& map = which == 0 ? quant8::signed_magnitudes() : quant8::unsigned_map();
    for (const SimdLevel level : simd_bodies_8bit()) {
      CAPTURE(simd_name(level));
      const torch::Tensor simd = codes(level);
      const uint8_t* q = simd.data_ptr<uint8_t>();
      int64_t ties = 0, wrong = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (q[i] == s[i]) continue;
        const float first = g[i / quant8::kBlock * quant8::kBlock];  // the block's scale s (or -s)
        const float absmax = which == 0 ? std::fabs(first) : first * first;
        const float x = which == 0 ? std::fabs(g[i]) : g[i] * g[i];
        const float yi = x * (1.0f / absmax);  // as the scalar encoder's y
        const int a_mag = which == 0 ? (q[i] & 0x7F) : q[i], b_mag = which == 0 ? (s[i] & 0x7F) : s[i];
        const float pa = quant8::decode_magnitude(map, static_cast<uint8_t>(a_mag));
        const float pb = quant8::decode_magnitude(map, static_cast<uint8_t>(b_mag));
        const bool tie = std::abs(a_mag - b_mag) == 1 && (which == 1 || (q[i] & 0x80) == (s[i] & 0x80)) &&
                         std::fabs(yi - 0.5f * (pa + pb)) <= std::ldexp(std::fabs(pa - pb), -13);
        (tie ? ties : wrong) += 1;
        if (!tie && wrong <= 5)
          MESSAGE("block absmax " << absmax << ", y = " << yi << ": code " << int(q[i]) << ", scalar " << int(s[i]));
      }
      MESSAGE(simd_name(level) << ": " << ties << " ties decided the other way of " << n);
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("ZeRO stages 1-3, with and without CPU offload, equal plain data parallel (2 ranks, Gloo)") {
  for (int gas : {1, 4}) {
    const std::string common = std::string(kBase) + ranks() + " --gas " + std::to_string(gas);
    const fs::path ref = tmpdir() / ("stage0_gas" + std::to_string(gas) + ".pt");
    REQUIRE(train(common + " --stage 0 --dump-params " + ref.string()) == 0);
    const torch::Tensor reference = load_params(ref);
    for (int stage = 1; stage <= 3; ++stage) {
      for (const char* offload : {"none", "cpu"}) {
        for (bool param_offload : {false, true}) {
          if (param_offload && (stage != 3 || std::string(offload) == "none")) continue;
          CAPTURE(gas);
          CAPTURE(stage);
          CAPTURE(offload);
          CAPTURE(param_offload);
          const fs::path out = tmpdir() / "params.pt";
          const std::string args = common + " --stage " + std::to_string(stage) + " --offload-optimizer " + offload +
                                   (param_offload ? " --offload-params cpu" : "") + " --dump-params " + out.string();
          REQUIRE(train(args) == 0);
          // fp32; the stages sum the same gradients in another order (per
          // micro-batch reduction vs local accumulation): within 1e-5 relative.
          CHECK(rel_error(load_params(out), reference) < g_tol);
          // And training moved the parameters by far more than that.
        }
      }
    }
  }
}

TEST_CASE("the other families: GPT-NeoX and GPT-J, stage 3 + offload equals stage 0") {
  for (const char* model : {"test-neox-tiny", "test-gptj-tiny"}) {
    CAPTURE(model);
    const std::string common = std::string("--model ") + model + " --precision fp32 --seq 32 --micro-batch 2 --gas 2 --steps 2" + ranks();
    const fs::path a = tmpdir() / "fam0.pt", b = tmpdir() / "fam3.pt";
    REQUIRE(train(common + " --stage 0 --dump-params " + a.string()) == 0);
    REQUIRE(train(common + " --stage 3 --offload-optimizer cpu --checkpointing on --dump-params " + b.string()) == 0);
    CHECK(rel_error(load_params(b), load_params(a)) < g_tol);
  }
}

namespace {

// Runs `common` with the default pipeline and with `--offload-pipeline <mode>`: the same CPU
// kernels on the same gradient shards, only at other times, so the parameters must be
// identical. The run's first JSONL record must carry config[json_key] == json_value, and
// its run key `key_marker` (the records keep the orders apart).
void check_same_as_pipelined(const std::string& common, const std::string& mode, const char* json_key,
                             bool json_value, const std::string& key_marker) {
  const fs::path a = tmpdir() / "piped.pt", b = tmpdir() / ("piped_" + mode + ".pt");
  REQUIRE(train(common + " --dump-params " + a.string()) == 0);
  const fs::path log = tmpdir() / (mode + ".jsonl");
  fs::remove(log);
  REQUIRE(train(common + " --offload-pipeline " + mode + " --dump-params " + b.string() + " --json-out " +
                log.string()) == 0);
  CHECK(torch::equal(load_params(a), load_params(b)));
  std::ifstream in(log);
  std::string line;
  REQUIRE(std::getline(in, line));
  CHECK(nlohmann::json::parse(line)["config"][json_key] == json_value);
  const auto runs = calibrate::load_runs({log}, test::data_dir());
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].key.find(key_marker) != std::string::npos);
}

}  // namespace

TEST_CASE("serial CPU offload (DeepSpeed's order) updates exactly as the pipelined one") {
  const std::string common = std::string(kBase) + ranks() + " --gas 2 --stage 2 --offload-optimizer cpu";
  check_same_as_pipelined(common, "off", "offload_pipeline", false, " serial");
  std::string err;
  CHECK(train(common + " --offload-pipeline sometimes", &err) == 2);
  CHECK(err.find("--offload-pipeline \"sometimes\" is not valid (valid: off, on, full)") != std::string::npos);
}

TEST_CASE("offload pipeline full: the last updates overlap the next forward, with the same parameters") {
  // Only the uploads move into the next step's forward (forward order, on both ranks); the
  // dump after the last step must wait for its outstanding updates.
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    std::string common = std::string(kBase) + ranks() + " --gas 2 --offload-optimizer cpu --stage " +
                         std::to_string(stage);
    if (stage == 3) common += " --optimizer adamw8bit --offload-params cpu";
    check_same_as_pipelined(common, "full", "offload_overlap_forward", true, " overlap-fwd");
  }
  std::string err;
  CHECK(train(std::string(kBase) + " --offload-pipeline full", &err) == 2);  // no offload to overlap
  CHECK(err.find("needs the pipelined CPU optimizer offload") != std::string::npos);
}

TEST_CASE("training moves the parameters far more than the tolerance above") {
  const fs::path a = tmpdir() / "init.pt", b = tmpdir() / "trained.pt";
  REQUIRE(train(std::string(kBase) + " --steps 1 --lr 0 --dump-params " + a.string()) == 0);
  REQUIRE(train(std::string(kBase) + " --gas 2 --dump-params " + b.string()) == 0);
  CHECK(rel_error(load_params(b), load_params(a)) > 1e-3);
}

TEST_CASE("activation checkpointing gives the same parameters") {
  const fs::path a = tmpdir() / "nockpt.pt", b = tmpdir() / "ckpt.pt";
  REQUIRE(train(std::string(kBase) + " --gas 2 --stage 2" + ranks() + " --dump-params " + a.string()) == 0);
  REQUIRE(train(std::string(kBase) + " --gas 2 --stage 2" + ranks() + " --checkpointing on --dump-params " + b.string()) == 0);
  CHECK(rel_error(load_params(b), load_params(a)) < g_tol);
}

TEST_CASE("the loss falls on real text (bf16, stage 2, CPU offload, 2 ranks)") {
  const fs::path log = tmpdir() / "loss.jsonl";
  fs::remove(log);
  REQUIRE(train("--model test-llama-tiny --precision bf16 --seq 64 --micro-batch 4 --gas 2 --steps 40 --lr 3e-3 "
                "--stage 2 --offload-optimizer cpu --json-out " + log.string() + ranks()) == 0);
  const auto l = losses(log);
  REQUIRE(l.size() == 40);
  // A random byte-level model starts near ln(256) = 5.55 nats.
  CHECK(l.front() == doctest::Approx(std::log(256.0)).epsilon(0.05));
  // English text has far less entropy: after 40 steps the loss must be well under it.
  double tail = 0;
  for (size_t i = 35; i < 40; ++i) tail += l[i] / 5;
  CHECK(tail < l.front() - 1.5);
}

TEST_CASE("8-bit AdamW: stage 2 with CPU offload equals stage 0 on the device; it trains like fp32 AdamW") {
  // Shards start on quantisation blocks, so every stage quantises the same blocks.
  const std::string common = std::string(kBase) + ranks() + " --gas 2 --optimizer adamw8bit";
  const fs::path a = tmpdir() / "q8_stage0.pt", b = tmpdir() / "q8_stage2.pt";
  REQUIRE(train(common + " --stage 0 --dump-params " + a.string()) == 0);
  REQUIRE(train(common + " --stage 2 --offload-optimizer cpu --dump-params " + b.string()) == 0);
  // The stages sum gradients in another order; where that rounding moves a moment across a
  // code's midpoint, the 8-bit states differ by one code and the parameter by up to one
  // update. Adam's update is at most lr (1 - b1) / sqrt(1 - b2) = 3.2 lr per step, so after
  // 3 steps (lr 1e-3) no parameter may differ by 2 x 3 x 3.2e-3; and such flips are rare.
  const torch::Tensor pa = load_params(a), pb = load_params(b);
  const auto diff = (pb - pa).abs();
  CHECK(diff.max().item<double>() < 2 * 3 * 3.2e-3);
  const double scale = pa.abs().max().item<double>();
  CHECK(diff.gt(g_tol * scale).to(torch::kDouble).mean().item<double>() < 0.01);
  // The same 40 steps on real text as the loss test above, with 8-bit and fp32 states: the
  // mean loss of the last 5 steps agrees within 0.05 nats (about 1 % of the starting loss).
  double tail[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    const fs::path log = tmpdir() / (k ? "loss8.jsonl" : "loss32.jsonl");
    fs::remove(log);
    REQUIRE(train(std::string("--model test-llama-tiny --precision bf16 --seq 64 --micro-batch 4 --gas 2 --steps 40 "
                              "--lr 3e-3 --stage 2 --offload-optimizer cpu --optimizer ") +
                  (k ? "adamw8bit" : "adamw") + " --json-out " + log.string() + ranks()) == 0);
    const auto l = losses(log);
    REQUIRE(l.size() == 40);
    for (size_t i = 35; i < 40; ++i) tail[k] += l[i] / 5;
  }
  CHECK(tail[1] == doctest::Approx(tail[0]).epsilon(0.01));
  CHECK(std::fabs(tail[1] - tail[0]) < 0.05);
}

TEST_CASE("a checkpoint saved and resumed continues the same loss curve") {
  for (int stage : {1, 3}) {
    CAPTURE(stage);
    // Stage 3 resumes 8-bit states (codes and absmax) as well, and overlaps its last updates
    // with the next forward: the save must wait for them.
    const std::string common = std::string(kBase) + ranks() + " --gas 2 --offload-optimizer cpu --stage " +
                               std::to_string(stage) +
                               (stage == 3 ? " --optimizer adamw8bit --offload-pipeline full" : "");
    const fs::path straight = tmpdir() / "straight.jsonl", resumed = tmpdir() / "resumed.jsonl";
    const fs::path ck = tmpdir() / ("ckpt" + std::to_string(stage));
    fs::remove(straight);
    fs::remove(resumed);
    fs::remove_all(ck);
    REQUIRE(train(common + " --steps 6 --json-out " + straight.string()) == 0);
    REQUIRE(train(common + " --steps 3 --save " + ck.string() + " --json-out " + resumed.string()) == 0);
    REQUIRE(train(common + " --steps 3 --resume " + ck.string() + " --json-out " + resumed.string()) == 0);
    const auto a = losses(straight), b = losses(resumed);
    REQUIRE(a.size() == 6);
    REQUIRE(b.size() == 6);
    for (size_t i = 0; i < 6; ++i) CHECK(b[i] == doctest::Approx(a[i]).epsilon(1e-6));
    // Checkpoint files were renamed into place: no temporary file is left.
    for (const auto& e : fs::directory_iterator(ck)) CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
  }
}

TEST_CASE("split master weights in training (bf16, 8-bit, CPU offload): fp32-master updates; exact resume") {
  const std::string base = "--model test-llama-tiny --precision bf16 --seq 32 --micro-batch 2 --gas 2 --lr 1e-3" +
                           ranks() + " --optimizer adamw8bit --offload-optimizer cpu";
  const auto run = [&](const std::string& args, bool split, const fs::path& dump) {
    return train(args + " --dump-params " + dump.string() + (split ? " --split-master on" : " --split-master off"));
  };
  const fs::path init = tmpdir() / "split_init.pt", plain = tmpdir() / "split_off.pt", split = tmpdir() / "split_on.pt";
  // One step from the same bf16 working copy (stage 2 starts from round-to-nearest-even
  // copies either way): the update is the same arithmetic, so the master weights are identical.
  REQUIRE(run(base + " --stage 2 --steps 1", false, plain) == 0);
  REQUIRE(run(base + " --stage 2 --steps 1", true, split) == 0);
  CHECK(torch::equal(load_params(plain), load_params(split)));
  // Later steps run forwards on the split upper halves, which differ from round-to-nearest-even
  // copies at exact ties (about one parameter in 2^17 per step), and bf16 training with 8-bit
  // states amplifies any such nudge: a change of reduction order alone (stage 1 against stage 2,
  // both with fp32 master weights) leaves these runs 1.2 % of the distance travelled apart after
  // 4 steps. Split master weights must stay within 5 %.
  for (const std::string stage : {" --stage 2", " --stage 3 --offload-params cpu --offload-pipeline full"}) {
    CAPTURE(stage);
    REQUIRE(run(base + stage + " --steps 1 --lr 0", false, init) == 0);
    REQUIRE(run(base + stage + " --steps 4", false, plain) == 0);
    REQUIRE(run(base + stage + " --steps 4", true, split) == 0);
    const torch::Tensor p0 = load_params(init), a = load_params(plain), b = load_params(split);
    const double travelled = (a - p0).norm().item<double>(), apart = (b - a).norm().item<double>();
    MESSAGE("split vs fp32 master weights after 4 steps: " << apart / travelled << " of the distance travelled");
    CHECK(travelled > 0);
    CHECK(apart < 0.05 * travelled);
  }
  // A checkpoint holds the split halves: the resumed run continues the same loss curve.
  const std::string common = base + " --stage 3 --offload-params cpu --offload-pipeline full";
  const fs::path straight = tmpdir() / "split_straight.jsonl", resumed = tmpdir() / "split_resumed.jsonl";
  const fs::path ck = tmpdir() / "split_ckpt";
  fs::remove(straight);
  fs::remove(resumed);
  fs::remove_all(ck);
  const int rc1 = train(common + " --steps 6 --json-out " + straight.string());
  const int rc2 = train(common + " --steps 3 --save " + ck.string() + " --json-out " + resumed.string());
  const int rc3 = train(common + " --steps 3 --resume " + ck.string() + " --json-out " + resumed.string());
  REQUIRE(rc1 == 0);
  REQUIRE(rc2 == 0);
  REQUIRE(rc3 == 0);
  const auto a = losses(straight), b = losses(resumed);
  REQUIRE(a.size() == 6);
  REQUIRE(b.size() == 6);
  for (size_t i = 0; i < 6; ++i) CHECK(b[i] == doctest::Approx(a[i]).epsilon(1e-6));
  // Without split master weights the checkpoint does not fit: one line, exit 2.
  std::string err;
  const int rc4 = train(common + " --steps 1 --split-master off --resume " + ck.string(), &err);
  CHECK(rc4 == 2);
  CHECK(err.find("checkpoint holds") != std::string::npos);
}

TEST_CASE("faults: NaN loss stops with the step; a dead rank ends the run; bad input is one line") {
  std::string err;
  CHECK(train(std::string(kBase) + " --lr 1e30 --steps 5", &err) == 4);
  CHECK(err.find("at step") != std::string::npos);

  const auto t0 = std::chrono::steady_clock::now();
  const int rc = train(std::string(kBase) + " --nproc 2 --steps 50 --inject-fault-rank 1 --inject-fault-step 2", &err);
  // (with one GPU, both ranks share it: the fault comes before any collective)
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(rc != 0);
  CHECK(seconds < 60);
  CHECK(err.find("stopping the other") != std::string::npos);

  CHECK(train("--model test-llama-tiny --stage 2 --offload-params cpu", &err) == 2);
  CHECK(err.find("--offload-params cpu needs --stage 3") != std::string::npos);
  CHECK(train("--model gpt-9", &err) == 2);
  CHECK(err.find("unknown model") != std::string::npos);
  // The CPU optimizer's switches name the flag and the value.
  CHECK(train(std::string(kBase) + " --stage 2 --offload-optimizer cpu --steps 1 --cpu-simd sse9", &err) == 2);
  CHECK(err.find("--cpu-simd \"sse9\"") != std::string::npos);
  CHECK(train(std::string(kBase) + " --steps 1 --cpu-bind yes", &err) == 2);
  CHECK(err.find("--cpu-bind \"yes\"") != std::string::npos);
  CHECK(train(std::string(kBase) + " --steps 1 --split-master maybe", &err) == 2);
  CHECK(err.find("--split-master \"maybe\"") != std::string::npos);
}

TEST_CASE("train --plan runs the planner's plan") {
  // The planner's JSON (explain --json) names the configuration; train runs it.
  const fs::path plan = tmpdir() / "plan.json";
  const std::string planner = (fs::path(g_train).parent_path().parent_path() / "planner" / "planner").string();
  const std::string cmd = planner + " explain --model test-llama-tiny --gpus 1 --stage 3 --offload-optimizer cpu "
                          "--micro-batch 2 --gas 2 --seq 32 --precision fp32 --json > " + plan.string();
  REQUIRE(std::system(cmd.c_str()) == 0);
  const fs::path log = tmpdir() / "plan.jsonl";
  fs::remove(log);
  REQUIRE(train("--model test-llama-tiny --plan " + plan.string() + " --steps 2 --json-out " + log.string()) == 0);
  std::ifstream in(log);
  std::string line;
  REQUIRE(std::getline(in, line));
  const auto j = nlohmann::json::parse(line);
  CHECK(j["config"]["zero_stage"] == 3);
  CHECK(j["config"]["offload_optimizer"] == "cpu");
  CHECK(j["config"]["micro_batch"] == 2);
  CHECK(j["config"]["gas"] == 2);
  CHECK(j["config"]["seq_len"] == 32);
  std::string err;
  CHECK(train("--model test-llama-tiny --plan " + (tmpdir() / "missing.json").string(), &err) == 2);
  CHECK(err.find("missing.json") != std::string::npos);
}

TEST_CASE("planner validate runs the top plans and reports the regret") {
  const std::string planner = (fs::path(g_train).parent_path().parent_path() / "planner" / "planner").string();
  const fs::path out = tmpdir() / "validate.json", runs = tmpdir() / "validate_runs.jsonl";
  fs::remove(runs);
  const std::string cmd = planner + " validate --model test-llama-tiny --gpus 1 --seq 32 --global-batch 4 --top 2 --steps 3 " +
                          "--precision fp32 --device " + g_device + " --train " + g_train + " --append " + runs.string() +
                          " --json > " + out.string() + " 2>/dev/null";
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::ifstream in(out);
  const auto j = nlohmann::json::parse(in);
  REQUIRE(j["validated"].size() == 2);
  for (const auto& v : j["validated"]) CHECK(v["measured"]["step_s"].get<double>() > 0);
  const double regret = j["top_plan_regret"].get<double>();
  CHECK(regret >= 0.0);
  CHECK(regret < 1.0);
  // The runs were appended for a refit: 3 steps per plan.
  std::ifstream r(runs);
  int lines = 0;
  std::string line;
  while (std::getline(r, line)) ++lines;
  CHECK(lines == 6);
}

TEST_CASE("calibrate measure runs the micro-benchmarks and a list, appends JSONL, and resumes") {
  const std::string calibrate = (fs::path(g_train).parent_path().parent_path() / "calibrate" / "calibrate").string();
  const fs::path list = tmpdir() / "list.txt", out = tmpdir() / "measure";
  fs::remove_all(out);
  std::ofstream(list) << "# two configurations\n"
                      << "test-llama-tiny 1 --stage 0 --precision fp32 --seq 32 --micro-batch 2 --gas 2\n"
                      << "test-llama-tiny " << g_nproc
                      << " --stage 3 --offload-optimizer cpu --precision fp32 --seq 32 --micro-batch 2\n";
  const std::string cmd = calibrate + " measure --list " + list.string() + " --out " + out.string() + " --steps 3 --device " +
                          g_device + " --train " + g_train + " --micro-flags=--quick 2>" + (tmpdir() / "measure.err").string();
  REQUIRE(std::system(cmd.c_str()) == 0);
  auto count = [&] {
    std::ifstream in(out / "runs.jsonl");
    int n = 0;
    std::string line;
    while (std::getline(in, line)) ++n;
    return n;
  };
  CHECK(count() == 6);
  // The micro-benchmarks ran first, every kind this device has, on the list's ranks.
  const auto micro = calibrate::load_micro({out / "micro.jsonl"});
  std::set<std::string> kinds;
  for (const auto& r : micro) kinds.insert(calibrate::micro_bench_name(r.bench));
  std::set<std::string> want = {"gemm", "attention", "cpu_optimizer"};
  if (g_nproc > 1) want.insert({"all_reduce", "reduce_scatter", "all_gather"});
  if (g_device == "cuda") want.insert({"h2d", "d2h", "gpu_optimizer"});
  for (const auto& k : want) {
    CAPTURE(k);
    CHECK(kinds.count(k) == 1);
  }
  // The step runs are not micro-benchmarks, and the micro lines are not step runs.
  CHECK(calibrate::load_micro({out / "runs.jsonl"}).empty());
  CHECK(calibrate::load_runs({out / "micro.jsonl"}, test::data_dir()).empty());
  // Interrupted or not, a second call measures nothing twice.
  REQUIRE(std::system(cmd.c_str()) == 0);
  CHECK(count() == 6);
  CHECK(calibrate::load_micro({out / "micro.jsonl"}).size() == micro.size());
  std::ifstream err(tmpdir() / "measure.err");
  std::ostringstream e;
  e << err.rdbuf();
  CHECK(e.str().find("2 skipped") != std::string::npos);
  CHECK(e.str().find("micro-benchmarks already in") != std::string::npos);
}

namespace {

// On the GPU machine this process (which never touches the GPU itself) has
// crashed with SIGSEGV after doctest printed a passing summary, in the
// teardown of the CUDA/NCCL libraries it links. A listener records the run's
// outcome when the run ends; a SIGSEGV after that point exits with that
// outcome (and says so on stderr) instead of reporting a crash. A crash
// before the end of the run is still a crash.
volatile std::sig_atomic_t g_run_finished = 0;
volatile std::sig_atomic_t g_run_failed = 0;

struct RunOutcome : doctest::IReporter {
  explicit RunOutcome(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override {
    g_run_failed = stats.numTestCasesFailed > 0 || stats.numAssertsFailed > 0;
    g_run_finished = 1;
  }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};
DOCTEST_REGISTER_LISTENER("run_outcome", 1, RunOutcome);

extern "C" void segv_after_run(int sig) {
  if (g_run_finished) {
    static const char msg[] = "stepcast_backend_tests: SIGSEGV in library teardown after the run ended; exiting with the run's status\n";
    (void)!write(2, msg, sizeof msg - 1);
    std::_Exit(g_run_failed ? 1 : 0);
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

int main(int argc, char** argv) {
  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]).rfind("--train=", 0) == 0) g_train = std::string(argv[i]).substr(8);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--train-device=", 0) == 0) g_device = a.substr(15);
    if (a.rfind("--nproc=", 0) == 0) g_nproc = std::stoi(a.substr(8));
    if (a.rfind("--tol=", 0) == 0) g_tol = std::stod(a.substr(6));
  }
  // Installed before the run: doctest keeps it as the previous handler and puts it back when
  // its own crash handling ends (before the run's own teardown); and again after, to be sure.
  std::signal(SIGSEGV, segv_after_run);
  const int rc = ctx.run();
  std::signal(SIGSEGV, segv_after_run);
  fs::remove_all(tmpdir());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(rc);
}
