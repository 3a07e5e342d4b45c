// The measuring tools end to end on the backend: planner validate and
// calibrate measure.
#include <torch/torch.h>
#define DOCTEST_CONFIG_IMPLEMENT
#include "doctest_after_glog.h"

#include "backend/comm/launcher.h"
#include "backend_test_util.h"
#include "common/host_cpu.h"
#include "common/text_file.h"

using namespace stepcast;
using namespace stepcast::backend;
using namespace stepcast::test;

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
  // The runs were appended for a refit: 3 steps per plan, the first a warm-up.
  std::vector<nlohmann::json> steps;
  {
    std::ifstream r(runs);
    std::string line;
    while (std::getline(r, line)) steps.push_back(nlohmann::json::parse(line));
  }
  REQUIRE(steps.size() == 6);
  // Recomputed here from the appended records: each plan's measured step is the median
  // (the mean of the two) of its two timed steps, its tokens/s the global batch's tokens
  // over it, and the regret is 1 - top / best.
  std::vector<double> tokens_per_s;
  for (size_t p = 0; p < 2; ++p) {
    CAPTURE(p);
    const auto& v = j["validated"][p];
    const auto& c = v["config"];
    const nlohmann::json* timed[2] = {&steps[3 * p + 1], &steps[3 * p + 2]};
    CHECK(steps[3 * p]["warmup"].get<bool>());
    for (const auto* t : timed) {
      CHECK_FALSE((*t)["warmup"].get<bool>());
      CHECK((*t)["config"]["micro_batch"] == c["micro_batch"]);
      CHECK((*t)["config"]["gas"] == c["gas"]);
      CHECK((*t)["config"]["zero_stage"] == c["zero_stage"]);
    }
    const double median_s = 0.5 * ((*timed[0])["time_s"]["step"].get<double>() + (*timed[1])["time_s"]["step"].get<double>());
    const double step_s = v["measured"]["step_s"].get<double>();
    CHECK(step_s == doctest::Approx(median_s).epsilon(1e-12));
    const double tokens = c["global_batch"].get<double>() * c["seq_len"].get<double>();
    CHECK(v["measured"]["tokens_per_s"].get<double>() == doctest::Approx(tokens / median_s).epsilon(1e-12));
    CHECK(v["step_error_pct"].get<double>() ==
          doctest::Approx(100.0 * (v["time_s"]["step"].get<double>() / median_s - 1)).epsilon(1e-9));
    tokens_per_s.push_back(tokens / median_s);
  }
  const double best = std::max(tokens_per_s[0], tokens_per_s[1]);
  CHECK(j["top_plan_regret"].get<double>() == doctest::Approx(1.0 - tokens_per_s[0] / best).epsilon(1e-12));
  CHECK_FALSE(j["top_plan_failed"].get<bool>());
  // Two plans: Kendall's tau is +1 when the measured order agrees with the predicted one, -1 when not.
  const double dp = j["validated"][0]["throughput"]["tokens_per_s"].get<double>() -
                    j["validated"][1]["throughput"]["tokens_per_s"].get<double>();
  const double dm = tokens_per_s[0] - tokens_per_s[1];
  CHECK(j["kendall_tau"].get<double>() == (dp * dm > 0 ? 1.0 : dp * dm < 0 ? -1.0 : 0.0));
}

TEST_CASE("calibrate measure runs the micro-benchmarks and a list, appends JSONL, and resumes") {
  const std::string calibrate = (fs::path(g_train).parent_path().parent_path() / "calibrate" / "calibrate").string();
  const fs::path list = tmpdir() / "list.txt", out = tmpdir() / "measure";
  remove_tree(out);
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
  std::set<std::string> want = {"gemm", "attention", "elementwise", "cpu_optimizer"};
  if (g_nproc > 1) want.insert({"all_reduce", "reduce_scatter", "all_gather"});
  if (g_device == "cuda") want.insert({"h2d", "d2h", "gpu_optimizer"});
  for (const auto& k : want) {
    CAPTURE(k);
    CHECK(kinds.count(k) == 1);
  }
  // Every step record carries the host's time to issue a small op on its device (env.host_op_us):
  // positive, and far below a millisecond on any host that trains.
  {
    std::ifstream in(out / "runs.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line);
      REQUIRE(j["env"].contains("host_op_us"));
      const double us = j["env"]["host_op_us"].get<double>();
      CHECK(us > 0.0);
      CHECK(us < 1000.0);
      // The step's share of the host's CPU ticks stolen by the hypervisor and busy (proc(5)), and
      // the CPUs' clock at the start.
      REQUIRE(j.contains("host_cpu"));
      CHECK(j["host_cpu"]["steal_frac"].get<double>() >= 0.0);
      CHECK(j["host_cpu"]["steal_frac"].get<double>() <= 1.0);
      // A tiny step may last less than a tick (10 ms), so busy may be 0 here; the shares are of the
      // ticks that passed, and both 0 when none did.
      const double busy = j["host_cpu"]["busy_frac"].get<double>(), steal = j["host_cpu"]["steal_frac"].get<double>();
      const double ticks = j["host_cpu"]["ticks"].get<double>();
      CHECK(busy >= 0.0);
      CHECK(busy + steal <= 1.0 + 1e-12);
      CHECK(ticks >= 0.0);
      if (ticks == 0.0) CHECK(busy + steal == 0.0);
      CHECK(j["env"]["cpu_mhz"].get<double>() >= 0.0);
      // And the caching allocator's retries so far: none on the CPU.
      REQUIRE(j.contains("allocator"));
      CHECK(j["allocator"]["alloc_retries_total"].get<double>() == 0.0);
    }
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

TEST_CASE("calibrate measure keeps a run that failed part-way out of runs.jsonl, and does not resume past it") {
  // The second configuration's rank 0 dies in its third step (after writing two step records):
  // those records go to failed.jsonl, runs.jsonl holds the first configuration only, the exit
  // status says a run failed, and a second call runs the failed configuration again.
  const std::string calibrate = (fs::path(g_train).parent_path().parent_path() / "calibrate" / "calibrate").string();
  const fs::path dir = tmpdir() / "partial";
  remove_tree(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "list.txt") << "test-llama-tiny 1 --stage 0 --precision fp32 --seq 32 --micro-batch 2\n"
                                  << "test-llama-tiny 1 --stage 1 --precision fp32 --seq 32 --micro-batch 2 "
                                     "--inject-fault-rank 0 --inject-fault-step 3\n";
  const std::string log = (dir / "log.txt").string();
  const auto measure = [&] {
    return spawn_and_wait({calibrate, "measure", "--list", (dir / "list.txt").string(), "--out", (dir / "out").string(),
                           "--steps", "4", "--no-micro", "--train", g_train, "--device", g_device},
                          log, log)
        .exit_status;
  };
  CHECK(measure() != 0);
  const auto runs = calibrate::load_runs({dir / "out" / "runs.jsonl"}, test::data_dir());
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].config.zero_stage == 0);
  const auto failed = calibrate::load_runs({dir / "out" / "failed.jsonl"}, test::data_dir());
  REQUIRE(failed.size() == 1);
  CHECK(failed[0].config.zero_stage == 1);
  CHECK(failed[0].steps == 1);  // step 1 is warm-up, step 2 measured
  // Rerun: the good configuration is skipped, the failed one runs (and fails) again.
  CHECK(measure() != 0);
  CHECK(calibrate::load_runs({dir / "out" / "runs.jsonl"}, test::data_dir()).size() == 1);
  CHECK(calibrate::load_runs({dir / "out" / "failed.jsonl"}, test::data_dir())[0].steps == 2);
  CHECK(read_text_file(log).find("1 skipped") != std::string::npos);
}

int main(int argc, char** argv) { return stepcast::test::run_tests(argc, argv); }

TEST_CASE("calibrate measure passes flags as arguments, never through a shell") {
  // A --device value with shell syntax reaches train as one argument (which rejects it), and a
  // folder with a space in its name works: no command line is ever built from strings.
  const std::string calibrate = (fs::path(g_train).parent_path().parent_path() / "calibrate" / "calibrate").string();
  const fs::path dir = tmpdir() / "shell test", planted = tmpdir() / "planted";
  remove_tree(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "list.txt") << "test-llama-tiny 1 --stage 0 --precision fp32 --seq 32 --micro-batch 2\n";
  const std::string log = (dir / "log.txt").string();
  const SpawnResult bad = spawn_and_wait({calibrate, "measure", "--list", (dir / "list.txt").string(), "--out",
                                          (dir / "out").string(), "--steps", "2", "--no-micro", "--train", g_train,
                                          "--device", "cpu; touch " + planted.string() + " #"},
                                         log, log);
  CHECK(bad.exit_status != 0);
  CHECK_FALSE(fs::exists(planted));
  const SpawnResult good = spawn_and_wait({calibrate, "measure", "--list", (dir / "list.txt").string(), "--out",
                                           (dir / "out").string(), "--steps", "2", "--no-micro", "--train", g_train,
                                           "--device", g_device},
                                          log, log);
  CHECK(good.exit_status == 0);
  CHECK(calibrate::load_runs({dir / "out" / "runs.jsonl"}, test::data_dir()).size() == 1);
}

TEST_CASE("emulated nodes: each rank's environment, by hand") {
  const auto env_of = [](int rank, int nproc, int nodes, const std::string& visible) {
    std::map<std::string, std::string> m;
    for (const auto& [k, v] : rank_environment(rank, nproc, nodes, visible).variables) m[k] = v;
    return m;
  };
  // The node index the launcher passes as --emulated-node: rank / (nproc / nodes).
  CHECK(rank_environment(3, 4, 2, "").node == 1);
  CHECK(rank_environment(1, 4, 2, "").node == 0);
  CHECK(rank_environment(1, 2, 1, "").node == 0);
  // One node: torchrun's variables only.
  auto e = env_of(1, 2, 1, "");
  CHECK(e == std::map<std::string, std::string>{{"RANK", "1"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "2"}});
  // Four ranks as two nodes of two: rank 3 is node 1's second rank, on the host's GPUs 2 and 3.
  e = env_of(3, 4, 2, "");
  CHECK(e["RANK"] == "3");
  CHECK(e["LOCAL_RANK"] == "1");
  CHECK(e["LOCAL_WORLD_SIZE"] == "2");
  CHECK(e["WORLD_SIZE"] == "4");
  CHECK(e["CUDA_VISIBLE_DEVICES"] == "2,3");
  CHECK(e["NCCL_HOSTID"] == "stepcast-emulated-node-1");
  CHECK(e.count("NCCL_P2P_DISABLE") == 0);  // its two GPUs still talk over NVLink
  // Two ranks as two nodes of one, from the launcher's visible GPUs 5 and 7: rank 1 takes 7, and
  // with one GPU per node no pair of ranks shares a node, so peer-to-peer and shared memory are off.
  e = env_of(1, 2, 2, "5,7");
  CHECK(e["LOCAL_RANK"] == "0");
  CHECK(e["LOCAL_WORLD_SIZE"] == "1");
  CHECK(e["CUDA_VISIBLE_DEVICES"] == "7");
  CHECK(e["NCCL_HOSTID"] == "stepcast-emulated-node-1");
  CHECK(e["NCCL_P2P_DISABLE"] == "1");
  CHECK(e["NCCL_SHM_DISABLE"] == "1");
  CHECK(env_of(0, 2, 2, "5,7")["NCCL_HOSTID"] == "stepcast-emulated-node-0");
}

TEST_CASE("emulated nodes: two nodes of one rank train as one node of two, and the records say so") {
  if (g_nproc < 2 || g_nproc % 2 != 0) return;
  const std::string base = g_train + " --model test-llama-tiny --device " + g_device +
                           " --stage 2 --precision fp32 --seq 32 --micro-batch 2 --gas 2 --steps 3 --quiet" + ranks();
  const fs::path one = tmpdir() / "one_node.jsonl", two = tmpdir() / "two_nodes.jsonl";
  fs::remove(one);
  fs::remove(two);
  REQUIRE(std::system((base + " --json-out " + one.string()).c_str()) == 0);
  REQUIRE(std::system((base + " --emulate-nodes 2 --json-out " + two.string()).c_str()) == 0);
  const auto records = [](const fs::path& p) {
    std::vector<nlohmann::json> v;
    std::ifstream in(p);
    std::string line;
    while (std::getline(in, line)) v.push_back(nlohmann::json::parse(line));
    return v;
  };
  const auto a = records(one), b = records(two);
  REQUIRE(a.size() == 3);
  REQUIRE(b.size() == 3);
  for (size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    // The same ranks, data and collectives: the same losses.
    CHECK(b[i]["loss"].get<double>() == a[i]["loss"].get<double>());
    CHECK(a[i]["config"]["nodes"] == 1);
    CHECK(a[i]["config"]["gpus"] == g_nproc);
    CHECK_FALSE(a[i]["env"].contains("emulated_nodes"));
    CHECK(b[i]["config"]["nodes"] == 2);
    CHECK(b[i]["config"]["gpus"] == g_nproc / 2);
    CHECK(b[i]["env"]["emulated_nodes"] == 2);
    CHECK(b[i]["env"]["world_size"] == g_nproc);
  }
  // Its collectives micro-benchmarks record the nodes, and calibrate reads them.
  const std::string microbench = (fs::path(g_train).parent_path() / "microbench").string();
  const fs::path micro = tmpdir() / "two_nodes_micro.jsonl";
  fs::remove(micro);
  REQUIRE(std::system((microbench + " --out " + micro.string() + " --suite collectives --quick --repeats 1 --device " +
                       g_device + ranks() + " --emulate-nodes 2 2>/dev/null").c_str()) == 0);
  const auto rs = calibrate::load_micro({micro});
  REQUIRE_FALSE(rs.empty());
  for (const auto& r : rs) CHECK(r.nodes == 2);
  // calibrate link reads them into a profile of this link, which the planner reads back.
  const fs::path bin = fs::path(g_train).parent_path().parent_path();
  const fs::path linked = tmpdir() / "emulated-link.toml";
  fs::remove(linked);
  REQUIRE(std::system(((bin / "calibrate" / "calibrate").string() + " link --runs " + micro.string() +
                       " --hardware h200-sxm --out " + linked.string() + " > /dev/null")
                          .c_str()) == 0);
  const HardwareProfile hw = load_hardware_profile(linked);
  CHECK(hw.name == "emulated-link");
  CHECK(hw.links.inter_node_bytes_per_s > 0);
  CHECK(hw.links.inter_node_bytes_per_s != test::hardware("h200-sxm").links.inter_node_bytes_per_s);
  CHECK(std::system(((bin / "planner" / "planner").string() + " explain --model test-llama-tiny --gpus 1 --nodes 2 "
                     "--stage 2 --hardware " + linked.string() + " > /dev/null")
                        .c_str()) == 0);
  // --emulate-nodes must divide the ranks: one line, exit 2.
  CHECK(WEXITSTATUS(std::system((base + " --emulate-nodes 3 2>/dev/null").c_str())) == 2);
}

TEST_CASE("measured components: microbench on this host, calibrate fit writes them into a profile, the planner uses them") {
  const fs::path bin = fs::path(g_train).parent_path().parent_path();
  const std::string microbench = (fs::path(g_train).parent_path() / "microbench").string();
  const std::string calibrate = (bin / "calibrate" / "calibrate").string();
  const std::string planner = (bin / "planner" / "planner").string();
  const fs::path micro = tmpdir() / "host_micro.jsonl", profile = tmpdir() / "a40-this-host.toml";
  fs::remove(micro);
  fs::remove(profile);
  // The CPU optimizer at its full size (64 Mi parameters) on this host's threads.
  REQUIRE(std::system((microbench + " --out " + micro.string() + " --suite optimizer --repeats 3 --device cpu 2>/dev/null").c_str()) == 0);
  const fs::path fit_json = tmpdir() / "measured_fit.json";
  REQUIRE(std::system((calibrate + " fit --hardware a40 --runs " + micro.string() + " --out " + profile.string() + " --json > " +
                       fit_json.string() + " 2>/dev/null").c_str()) == 0);
  const nlohmann::json fit = nlohmann::json::parse(read_text_file(fit_json));
  CHECK(fit["reference"] == "h200-sxm");
  CHECK(fit["coefficients"].contains("cpu_core_bytes_per_s_per_lane"));
  CHECK_FALSE(fit["coefficients"].contains("pcie_eff_frac"));  // no copies timed on the CPU
  for (const auto& [name, c] : fit["coefficients"].items()) {
    CAPTURE(name);
    CHECK(c["rel"].get<double>() == doctest::Approx(c["here"].get<double>() / c["reference"].get<double>()));
  }
  // The planner reads the written profile, says what was measured, and its JSON carries it.
  const std::string explain = planner + " explain --model llama-2-7b --hardware " + profile.string() +
                              " --gpus 1 --stage 2 --offload-optimizer cpu --micro-batch 1 --gas 4 --seq 2048";
  const fs::path text_out = tmpdir() / "measured_explain.txt", json_out = tmpdir() / "measured_explain.json";
  REQUIRE(std::system((explain + " > " + text_out.string() + " 2>&1").c_str()) == 0);
  CHECK(read_text_file(text_out).find("measured on this hardware by microbench, as ratios to h200-sxm's components:") !=
        std::string::npos);
  REQUIRE(std::system((explain + " --json > " + json_out.string() + " 2>/dev/null").c_str()) == 0);
  const nlohmann::json e = nlohmann::json::parse(read_text_file(json_out));
  CHECK(e["hardware"]["measured_components"]["rel"]["cpu_core_bytes_per_s_per_lane"].get<double>() ==
        doctest::Approx(fit["coefficients"]["cpu_core_bytes_per_s_per_lane"]["rel"].get<double>()).epsilon(1e-8));
  // GEMMs timed on the CPU measure nothing of a GPU: one line naming the record, exit 2, no profile written.
  const fs::path gemm = tmpdir() / "cpu_gemm_micro.jsonl", untouched = tmpdir() / "not-written.toml";
  fs::remove(gemm);
  fs::remove(untouched);
  const fs::path compute = tmpdir() / "cpu_compute_micro.jsonl";
  fs::remove(compute);
  REQUIRE(std::system((microbench + " --out " + compute.string() + " --suite compute --quick --repeats 1 --device cpu 2>/dev/null").c_str()) == 0);
  // Its environment line and its GEMMs alone: a loaded machine may time a tiny attention kernel
  // at nothing, which the reader rejects first (its own bad_input case).
  {
    std::istringstream lines(read_text_file(compute));
    std::ofstream out(gemm);
    for (std::string line; std::getline(lines, line);)
      if (line.find("\"micro_env\"") != std::string::npos || line.find("\"bench\":\"gemm\"") != std::string::npos)
        out << line << "\n";
  }
  const fs::path err = tmpdir() / "measured_err.txt";
  CHECK(WEXITSTATUS(std::system((calibrate + " fit --hardware a40 --runs " + gemm.string() + " --out " + untouched.string() +
                                 " 2> " + err.string()).c_str())) == 2);
  const std::string err_text = read_text_file(err);
  CAPTURE(err_text);
  CHECK(err_text.find("was timed on device \"cpu\"") != std::string::npos);
  CHECK_FALSE(fs::exists(untouched));
}

TEST_CASE("host CPU ticks: /proc/stat's aggregate line, steal and busy shares between two samples, by hand") {
  // proc(5): cpu user nice system idle iowait irq softirq steal guest guest_nice.
  const std::string a = "cpu  100 0 50 800 10 0 0 40 7 0\ncpu0 50 0 25 400 5 0 0 20 0 0\nintr 1\n";
  const std::string b = "cpu  160 0 70 1000 20 0 0 90 9 0\ncpu0 80 0 35 500 10 0 0 45 0 0\n";
  const auto before = parse_proc_stat(a), after = parse_proc_stat(b);
  REQUIRE(before);
  REQUIRE(after);
  CHECK(before->total() == 1000.0);  // 100 + 50 + 800 + 10 + 40; guest is inside user
  // Between them: 60 user + 20 system + 200 idle + 10 iowait + 50 steal = 340 ticks; steal 50/340,
  // busy (340 - 210 idle/iowait - 50 steal) / 340 = 80/340.
  const CpuShare share = cpu_share(*before, *after);
  CHECK(share.steal_frac == doctest::Approx(50.0 / 340.0));
  CHECK(share.busy_frac == doctest::Approx(80.0 / 340.0));
  CHECK(share.ticks == 340.0);
  CHECK(cpu_share(*before, *before).steal_frac == 0.0);
  CHECK(cpu_share(*before, *before).ticks == 0.0);
  CHECK_FALSE(parse_proc_stat("cpu0 1 2 3\n"));
  CHECK_FALSE(parse_proc_stat("cpu  1 2 3\n"));  // too few fields
  CHECK(mean_cpu_mhz_of("processor : 0\ncpu MHz\t\t: 2100.000\nprocessor : 1\ncpu MHz\t\t: 2300.5\n") ==
        doctest::Approx(2200.25));
  CHECK(mean_cpu_mhz_of("processor : 0\n") == 0.0);
}
