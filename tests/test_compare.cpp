// planner compare: run-cost arithmetic, the Pareto front, deadline and budget picks, GPU
// layouts, --price parsing, and the prices the hardware profiles carry.
#include <doctest/doctest.h>

#include <cmath>
#include <set>

#include "common/errors.h"
#include "planner/compare.h"
#include "test_util.h"

using namespace stepcast;

namespace {

CompareRow row(const char* kind, double cost_usd, double wall_h) {
  CompareRow r;
  r.hardware = kind;
  r.cost_usd = cost_usd;
  r.wall_s = wall_h * 3600.0;
  return r;
}

}  // namespace

TEST_CASE("run cost: wall-clock, GPU-hours and dollars by hand") {
  // 1e9 tokens at 10 000 tokens/s: 1e5 s = 27.78 h; on 8 GPUs 222.2 GPU-hours; at $2.50 per
  // GPU-hour $555.56.
  const RunCost c = run_cost(1e9, 1e4, 8, 2.5);
  CHECK(c.wall_s == doctest::Approx(1e5));
  CHECK(c.gpu_hours == doctest::Approx(1e5 / 3600.0 * 8));
  CHECK(c.cost_usd == doctest::Approx(555.5556).epsilon(1e-6));
  // No throughput (nothing fits): nothing is priced.
  CHECK(run_cost(1e9, 0, 8, 2.5).cost_usd == 0);
}

TEST_CASE("the Pareto front of cost against time on a hand-built set") {
  // A ($100, 10 h) and D (the same) dominate neither each other; B ($50, 20 h) is the cheapest;
  // E ($200, 5 h) the fastest. C ($80, 30 h) loses to B on both; F ($150, 12 h) to A on both;
  // G ($50, 25 h) ties B on cost and is slower.
  std::vector<CompareRow> rows{row("A", 100, 10), row("B", 50, 20), row("C", 80, 30), row("D", 100, 10),
                               row("E", 200, 5),  row("F", 150, 12), row("G", 50, 25)};
  mark_pareto_front(rows);
  std::set<std::string> front;
  for (const auto& r : rows)
    if (r.on_front) front.insert(r.hardware);
  CHECK(front == std::set<std::string>{"A", "B", "D", "E"});

  // Cheapest within 11 h: A and D ($100, 10 h) qualify with E ($200); the first of the tie wins.
  auto c = cheapest_within(rows, 11 * 3600.0);
  REQUIRE(c);
  CHECK(rows[*c].hardware == "A");
  // No deadline: the cheapest overall, B ($50) before G ($50, slower).
  c = cheapest_within(rows, 0);
  REQUIRE(c);
  CHECK(rows[*c].hardware == "B");
  // Fastest within $120: A, B, C, D, G qualify; A (10 h) is the first of the fastest.
  auto f = fastest_within(rows, 120);
  REQUIRE(f);
  CHECK(rows[*f].hardware == "A");
  CHECK(rows[*fastest_within(rows, 0)].hardware == "E");
  // Impossible asks: nothing in 4 h, nothing for $40.
  CHECK_FALSE(cheapest_within(rows, 4 * 3600.0));
  CHECK_FALSE(fastest_within(rows, 40));
}

TEST_CASE("GPU layouts: powers of two in a node, then whole nodes") {
  using L = std::vector<std::pair<int, int>>;
  CHECK(gpu_layouts(8, 32) == L{{1, 1}, {2, 1}, {4, 1}, {8, 1}, {8, 2}, {8, 4}});
  CHECK(gpu_layouts(8, 6) == L{{1, 1}, {2, 1}, {4, 1}});
  CHECK(gpu_layouts(4, 8) == L{{1, 1}, {2, 1}, {4, 1}, {4, 2}});
  CHECK(gpu_layouts(1, 3) == L{{1, 1}, {1, 2}});
  CHECK(gpu_layouts(6, 12) == L{{1, 1}, {2, 1}, {4, 1}, {6, 1}, {6, 2}});
}

TEST_CASE("--price items") {
  const auto p = parse_price_overrides({"h100-sxm=2.99", "a40=0.5"});
  CHECK(p.at("h100-sxm") == doctest::Approx(2.99));
  CHECK(p.at("a40") == doctest::Approx(0.5));
  for (const char* bad : {"h100-sxm", "h100-sxm=", "=2", "h100-sxm=abc", "h100-sxm=-1", "h100-sxm=0", "h100-sxm=2x"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_price_overrides({bad}), InputError);
  }
}

TEST_CASE("the hardware profiles carry dated, sourced prices") {
  // Issue 19: at least one Kubernetes-native cloud and one other provider.
  std::set<std::string> providers;
  bool k8s = false;
  for (const char* kind : {"a40", "l40s", "a100-80gb-sxm", "a100-40gb-sxm", "h100-sxm", "h200-sxm", "rtx-a6000"}) {
    CAPTURE(kind);
    const HardwareProfile hw = test::hardware(kind);
    REQUIRE(!hw.prices.empty());
    CHECK(hw.price_per_gpu_hour == hw.prices.front().usd_per_gpu_hour);
    for (const PriceOffer& o : hw.prices) {
      providers.insert(o.provider);
      k8s |= o.kubernetes;
      CHECK(!o.source.empty());
      CHECK(o.date.size() == 10);
    }
  }
  CHECK(k8s);
  CHECK(providers.size() >= 2);
  // The A40's one price: RunPod's $0.00034 per second, x 3600 = $1.224 per hour.
  CHECK(test::hardware("a40").prices.front().usd_per_gpu_hour == doctest::Approx(0.00034 * 3600));
  // Lambda's 8 x H100 SXM: $23.92 per hour, 208 vCPUs, 1800 GiB; per GPU $2.99, 26 vCPUs, 225 GiB.
  const HardwareProfile h100 = test::hardware("h100-sxm");
  const auto lambda = std::find_if(h100.prices.begin(), h100.prices.end(), [](const PriceOffer& o) { return o.provider == "lambda"; });
  REQUIRE(lambda != h100.prices.end());
  CHECK(lambda->usd_per_gpu_hour == doctest::Approx(23.92 / 8));
  CHECK(lambda->vcpus_per_gpu == doctest::Approx(208.0 / 8));
  CHECK(lambda->memory_bytes_per_gpu == doctest::Approx(1800.0 / 8 * 1073741824.0));
}
