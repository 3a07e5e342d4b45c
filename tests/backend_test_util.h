// Shared by the backend test programs: the command-line settings (--train=PATH,
// --train-device=cpu|cuda, --nproc=N, --tol=X), a scratch folder, launching
// `train`, and reading what it wrote.
#pragma once

#include <torch/torch.h>
#include "doctest_after_glog.h"

#include <ftw.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
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
#include "common/atomic_file.h"
#include "common/process.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace stepcast::test {
using namespace stepcast::backend;

inline std::string g_train = "train";  // set from the command line (run_tests)
inline std::string g_device = "cpu";   // --train-device=cuda runs the same tests on GPUs (ctest label gpu)
inline int g_nproc = 2;                // --nproc=N: ranks of the multi-rank tests
inline double g_tol = 1e-5;            // stage-vs-stage tolerance; GPU kernels reduce in other orders: 1e-4

inline std::string ranks() { return " --nproc " + std::to_string(g_nproc); }

inline fs::path tmpdir() {
  static fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("stepcast_backend_test_" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

// Runs train with `args`; returns its exit code.
inline int train(const std::string& args, std::string* stderr_text = nullptr) {
  const fs::path err = tmpdir() / "stderr.txt";
  const std::string cmd = g_train + " --device " + g_device + " --quiet --data " + (test::data_dir() / "text" / "kjv_genesis_exodus.txt").string() +
                          " " + args + " 2>" + err.string();
  const int status = std::system(cmd.c_str());
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  std::ifstream in(err);
  std::ostringstream s;
  s << in.rdbuf();
  if (stderr_text) *stderr_text = s.str();
  // A run that was meant to succeed and did not: its stderr goes to the test's output.
  else if (rc != 0) std::fprintf(stderr, "train %s exited %d:\n%s\n", args.c_str(), rc, s.str().c_str());
  return rc;
}

inline torch::Tensor load_params(const fs::path& p) {
  torch::Tensor t;
  torch::load(t, p.string());
  return t;
}

inline std::vector<double> losses(const fs::path& jsonl) {
  std::vector<double> out;
  std::ifstream in(jsonl);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return out;
}

// max |a - b| / max |b|, printing the worst element on failure (llm.c style).
inline double rel_error(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  const auto diff = (a - b).abs();
  return diff.max().item<double>() / scale;
}

inline const char* kBase = "--model test-llama-tiny --precision fp32 --seq 32 --micro-batch 2 --steps 3 --lr 1e-3";

using stepcast::remove_tree;  // common/atomic_file.h: not std::filesystem::remove_all (see there)

// The test program's main: reads the settings, runs doctest, removes the scratch folder.
inline int run_tests(int argc, char** argv) {
  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--train=", 0) == 0) g_train = a.substr(8);
    if (a.rfind("--train-device=", 0) == 0) g_device = a.substr(15);
    if (a.rfind("--nproc=", 0) == 0) g_nproc = std::stoi(a.substr(8));
    if (a.rfind("--tol=", 0) == 0) g_tol = std::stod(a.substr(6));
  }
  const int rc = ctx.run();
  remove_tree(tmpdir());
  return rc;
}

}  // namespace stepcast::test
