// The backend's kernels and host machinery in process: the CPU AdamW against
// torch::optim::AdamW, the 8-bit maps and SIMD bodies against the scalar code
// and the paper's map, split master weights, the optimizer's cores and threads.
#include <torch/torch.h>
#define DOCTEST_CONFIG_IMPLEMENT
#include "doctest_after_glog.h"

#include "backend/engine/nf4_tensor.h"
#include "backend/engine/transformer.h"
#include "backend/optim/nf4.h"
#include "backend_test_util.h"

using namespace stepcast;
using namespace stepcast::backend;
using namespace stepcast::test;

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

int main(int argc, char** argv) { return stepcast::test::run_tests(argc, argv); }

TEST_CASE("NF4: the normal quantiles, QLoRA's published levels, and block-wise absmax quantisation by hand") {
  // Phi^-1 at known points: 0.5 -> 0; Phi(1) = 0.841344746068543 -> 1; 0.975 -> 1.959963984540054.
  CHECK(nf4::normal_quantile(0.5) == doctest::Approx(0.0).epsilon(1e-14));
  CHECK(nf4::normal_quantile(0.841344746068543) == doctest::Approx(1.0).epsilon(1e-12));
  CHECK(nf4::normal_quantile(0.975) == doctest::Approx(1.959963984540054).epsilon(1e-12));
  CHECK(nf4::normal_quantile(0.025) == doctest::Approx(-1.959963984540054).epsilon(1e-12));
  // The NF4 data type as QLoRA publishes it (Dettmers et al. 2023, appendix E; the same values
  // are bitsandbytes' NF4 code): the construction in nf4.h must give them. Float32 rounding of
  // the reference's probabilities moves them by < 1e-6.
  const double published[16] = {-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                                -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                                0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
                                0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0};
  for (int i = 0; i < 16; ++i) {
    CAPTURE(i);
    CHECK(std::abs(nf4::levels()[static_cast<size_t>(i)] - published[i]) < 1e-6);
  }
  CHECK(nf4::levels()[7] == 0.0f);
  // Nearest level: the midpoint between levels 8 and 9 (0.0796, 0.1609) is 0.12026.
  CHECK(nf4::encode(0.0f) == 7);
  CHECK(nf4::encode(1.0f) == 15);
  CHECK(nf4::encode(-1.0f) == 0);
  CHECK(nf4::encode(0.12f) == 8);
  CHECK(nf4::encode(0.121f) == 9);
  CHECK(nf4::encode(7.0f) == 15);
  CHECK(nf4::encode(std::nanf("")) == 7);

  // Two blocks of 64 and a tail of 3, against a dequantisation by hand: each value becomes the
  // nearest level x its block's absmax; 0 stays 0, the absmax is exact, and no value moves by
  // more than half the widest gap (levels 14 -> 15: (1 - 0.7230) / 2) x absmax.
  std::vector<float> x(131);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)) * (i < 64 ? 2.0 : 0.5));
  x[5] = 0.0f;
  x[70] = -3.0f;  // the second block's absmax, negative
  const nf4::Quantized q = nf4::quantize(x.data(), static_cast<int64_t>(x.size()));
  REQUIRE(q.absmax.size() == 3);
  REQUIRE(q.packed.size() == 66);
  CHECK(q.absmax[1] == 3.0f);
  std::vector<float> y(x.size());
  nf4::dequantize(q, y.data());
  for (size_t i = 0; i < x.size(); ++i) {
    CAPTURE(i);
    const float m = q.absmax[i / 64];
    float best = 0.0f, best_err = 1e30f;
    for (float l : nf4::levels())
      if (std::abs(l * m - x[i]) < best_err) best_err = std::abs(l * m - x[i]), best = l * m;
    CHECK(y[i] == doctest::Approx(best).epsilon(1e-6));
    CHECK(std::abs(y[i] - x[i]) <= 0.5f * (1.0f - 0.7229568f) * m + 1e-6f);
  }
  CHECK(y[5] == 0.0f);
  CHECK(y[70] == -3.0f);
  // Packing: element 0 in the low nibble of byte 0, element 1 in its high nibble.
  CHECK((q.packed[0] & 0x0F) == nf4::encode(x[0] / q.absmax[0]));
  CHECK((q.packed[0] >> 4) == nf4::encode(x[1] / q.absmax[0]));
}

TEST_CASE("NF4 on tensors: quantize_into and dequantize equal the scalar reference (optim/nf4.h)") {
  torch::manual_seed(11);
  const int64_t n = 64 * 40;
  torch::Tensor x = torch::randn({n}) * 0.02;
  x.narrow(0, 64, 64).zero_();  // a block of zeros: absmax 0, every code the zero level
  torch::Tensor codes = torch::empty({n / 2}, torch::kByte), absmax = torch::empty({n / nf4::kBlock});
  nf4::quantize_into(x, codes, absmax);
  const nf4::Quantized ref = nf4::quantize(x.data_ptr<float>(), n);
  for (int64_t i = 0; i < n / 2; ++i) {
    CAPTURE(i);
    REQUIRE(codes[i].item<uint8_t>() == ref.packed[static_cast<size_t>(i)]);
  }
  for (int64_t b = 0; b < n / nf4::kBlock; ++b) CHECK(absmax[b].item<float>() == ref.absmax[static_cast<size_t>(b)]);
  std::vector<float> deq(static_cast<size_t>(n));
  nf4::dequantize(ref, deq.data());
  const torch::Tensor mine = nf4::dequantize(codes, absmax, torch::kFloat);
  CHECK(torch::equal(mine, torch::from_blob(deq.data(), {n}, torch::kFloat)));
  if (torch::cuda::is_available()) {
    // The CUDA kernel: the same values (a product of two floats, rounded once).
    const torch::Tensor on_gpu = nf4::dequantize(codes.cuda(), absmax.cuda(), torch::kFloat).cpu();
    CHECK(torch::equal(on_gpu, mine));
    const torch::Tensor bf16 = nf4::dequantize(codes.cuda(), absmax.cuda(), torch::kBFloat16).cpu();
    CHECK(torch::equal(bf16, mine.to(torch::kBFloat16)));
  }
}

TEST_CASE("NF4 linear: forward and input gradient equal a dense product with the dequantised weight") {
  torch::manual_seed(12);
  const int64_t out = 96, in = 128;
  torch::Tensor w = torch::randn({out * in}) * 0.05;
  torch::Tensor codes = torch::empty({out * in / 2}, torch::kByte), absmax = torch::empty({out * in / 64});
  nf4::quantize_into(w, codes, absmax);
  const torch::Tensor dense = nf4::dequantize(codes, absmax, torch::kFloat).view({out, in});
  torch::Tensor x = torch::randn({3, 5, in}).requires_grad_(true);
  torch::Tensor x2 = x.detach().clone().requires_grad_(true);
  torch::Tensor g = torch::randn({3, 5, out});
  torch::Tensor y = nf4::linear(x, codes, absmax, out, in);
  torch::Tensor y2 = torch::matmul(x2, dense.t());
  CHECK(torch::allclose(y, y2, 1e-6, 1e-6));
  (y * g).sum().backward();
  (y2 * g).sum().backward();
  CHECK(torch::allclose(x.grad(), x2.grad(), 1e-6, 1e-6));
  CHECK(!codes.requires_grad());
}

namespace {

// A layer unit of test-llama-tiny: the base weights in one flat buffer (fp64), random.
struct TinyLayer {
  ModelSpec spec = resolve_model("test-llama-tiny", test::data_dir());
  UnitLayout base = build_layout(spec, 1).at(1);
  torch::Tensor flat;
  TinyLayer() {
    torch::manual_seed(13);
    flat = torch::randn({base.padded_numel}, torch::kDouble) * 0.1;
    for (const ParamSlot& p : base.params)
      if (p.name.find("norm") != std::string::npos) flat.narrow(0, p.offset, p.numel).fill_(1.0);
  }
};

}  // namespace

TEST_CASE("LoRA: a layer with adapters equals the layer with merged weights W + (alpha/r) B A, gradients too") {
  // Hu et al. 2021, eq. 3: h = W0 x + (alpha / r) B A x. The adapters' gradients follow from
  // the merged weight's G = dL/dW: dL/dB = (alpha/r) G A^T, dL/dA = (alpha/r) B^T G.
  for (LoraTargets targets : {LoraTargets::kAll, LoraTargets::kAttention, LoraTargets::kMlp}) {
    CAPTURE(lora_targets_name(targets));
    TinyLayer t;
    const int64_t r = 4;
    const double alpha = 8.0, s = alpha / r;
    const UnitLayout adapters = build_adapter_layout(t.spec, {t.base}, r, targets, 1).at(0);
    torch::Tensor aflat = torch::randn({adapters.padded_numel}, torch::kDouble) * 0.1;  // B nonzero too
    UnitParams frozen = make_views(t.base, t.flat, false);
    UnitParams p = make_views(adapters, aflat, true);
    p.frozen = &frozen;
    // The merged weights, trainable, for the reference.
    torch::Tensor merged = t.flat.clone();
    // Segment s of a fused weight (q, k, v; gate, up) gains s B_s A_s: B's rows of the segment
    // times A's s-th block of r rows. test-llama-tiny: q 64, k and v 32 rows; gate and up 160
    // (the card's heads x head_dim, kv heads x head_dim and intermediate_size, by hand).
    const auto segment_rows = [&](const std::string& stem) {
      const ModelSpec& m = t.spec;
      if (stem == "qkv") return std::vector<int64_t>{m.q_dim(), m.kv_dim(), m.kv_dim()};
      if (stem == "up") return std::vector<int64_t>{m.intermediate_size, m.intermediate_size};
      return std::vector<int64_t>{stem == "o" || stem == "down" ? m.hidden_size : 0};
    };
    // The model's projection list says the same.
    for (const LayerProjection& lp : layer_projections(t.spec)) CHECK(lp.part_rows == segment_rows(lp.stem));
    const auto delta = [&](const std::string& stem, const torch::Tensor& A, const torch::Tensor& B) {
      const std::vector<int64_t> rows = segment_rows(stem);
      std::vector<torch::Tensor> blocks;
      int64_t row = 0;
      for (size_t k = 0; k < rows.size(); ++k) {
        blocks.push_back(torch::matmul(B.narrow(0, row, rows[k]), A.narrow(0, static_cast<int64_t>(k) * r, r)));
        row += rows[k];
      }
      return torch::cat(blocks, 0) * s;
    };
    for (const ParamSlot& w : t.base.params) {
      if (!lora_targeted(t.spec, w.name, targets)) continue;
      const std::string stem = w.name.substr(0, w.name.size() - 7);
      const torch::Tensor dw = delta(stem, p[stem + ".lora_a"].detach(), p[stem + ".lora_b"].detach());
      REQUIRE(dw.numel() == w.numel);
      merged.narrow(0, w.offset, w.numel).add_(dw.view({-1}));
    }
    UnitParams m = make_views(t.base, merged, true);
    Transformer lora(t.spec, torch::kCPU, LoraSettings{s, 0.0}), plain(t.spec, torch::kCPU);
    torch::Tensor x = torch::randn({2, 7, t.spec.hidden_size}, torch::kDouble).requires_grad_(true);
    torch::Tensor x2 = x.detach().clone().requires_grad_(true);
    torch::Tensor g = torch::randn({2, 7, t.spec.hidden_size}, torch::kDouble);
    torch::Tensor y = lora.layer(p, x), y2 = plain.layer(m, x2);
    CHECK(torch::allclose(y, y2, 1e-12, 1e-12));
    (y * g).sum().backward();
    (y2 * g).sum().backward();
    CHECK(torch::allclose(x.grad(), x2.grad(), 1e-12, 1e-12));
    int adapted = 0;
    for (const ParamSlot& w : t.base.params) {
      const std::string stem = w.name.substr(0, w.name.size() - 7);
      if (!lora_targeted(t.spec, w.name, targets)) {
        CHECK(!adapters.params.empty());
        continue;
      }
      ++adapted;
      CAPTURE(stem);
      // Per segment: dL/dB_s = s G_s A_s^T, dL/dA_s = s B_s^T G_s, G_s the segment's rows of G.
      const torch::Tensor G = m[w.name].grad();
      const torch::Tensor A = p[stem + ".lora_a"].detach(), B = p[stem + ".lora_b"].detach();
      const std::vector<int64_t> rows = segment_rows(stem);
      int64_t row = 0;
      for (size_t k = 0; k < rows.size(); ++k) {
        const torch::Tensor Gs = G.narrow(0, row, rows[k]), As = A.narrow(0, static_cast<int64_t>(k) * r, r);
        const torch::Tensor Bs = B.narrow(0, row, rows[k]);
        CHECK(torch::allclose(p[stem + ".lora_b"].grad().narrow(0, row, rows[k]), s * torch::matmul(Gs, As.t()), 1e-12,
                              1e-12));
        CHECK(torch::allclose(p[stem + ".lora_a"].grad().narrow(0, static_cast<int64_t>(k) * r, r),
                              s * torch::matmul(Bs.t(), Gs), 1e-12, 1e-12));
        row += rows[k];
      }
    }
    CHECK(adapted == (targets == LoraTargets::kAll ? 4 : 2));
    // The frozen weights get no gradient.
    for (const torch::Tensor& f : frozen.tensors) CHECK(!f.grad().defined());
  }
}
