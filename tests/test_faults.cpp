// Fault tests of `train` and `calibrate measure` on the CPU (Gloo, 2 ranks): checkpoints
// that are mixed, swapped, corrupted, truncated, interrupted or written to a full disk;
// the launcher killed; a peer that never arrives; Ctrl-C between configurations; a torn
// JSONL line. Each case expects an exit status (common/errors.h) and one stderr line
// naming the culprit.
#include <torch/torch.h>
#define DOCTEST_CONFIG_IMPLEMENT
#include "doctest_after_glog.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include "backend_test_util.h"
#include "backend/comm/launcher.h"
#include "common/errors.h"
#include "common/text_file.h"

using namespace stepcast;
using namespace stepcast::test;

extern char** environ;

namespace {

// Two ranks on the CPU; on the GPU machine as many as the test was given GPUs (--nproc=N).
std::string run_flags() { return std::string(kBase) + ranks() + " --stage 2 --offload-optimizer cpu"; }

int lines_of(const std::string& text) { return static_cast<int>(std::count(text.begin(), text.end(), '\n')); }

// Saves a checkpoint of `steps` steps into `root` (resuming from it when it exists).
void make_checkpoint(const fs::path& root, int steps, bool resume = false) {
  REQUIRE(train(run_flags() + " --steps " + std::to_string(steps) + (resume ? " --resume " + root.string() : "") +
                " --save " + root.string()) == 0);
}

fs::path step_folder(const fs::path& root) {
  std::ifstream in(root / "latest");
  std::string name;
  in >> name;
  return root / name;
}

void copy_tree(const fs::path& from, const fs::path& to) {
  remove_tree(to);
  fs::copy(from, to, fs::copy_options::recursive);
}

// The checkpoint's step as a resumed run reports it: the first step it records is one more.
int64_t resumed_first_step(const fs::path& root) {
  const fs::path log = tmpdir() / "resumed_step.jsonl";
  fs::remove(log);
  REQUIRE(train(run_flags() + " --steps 1 --resume " + root.string() + " --json-out " + log.string()) == 0);
  std::ifstream in(log);
  std::string line;
  std::getline(in, line);
  return nlohmann::json::parse(line).at("step").get<int64_t>();
}

// Starts `argv` (no shell) and returns its pid.
pid_t start(const std::vector<std::string>& argv, const fs::path& err) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  std::vector<char*> a;
  for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  pid_t pid = 0;
  REQUIRE(posix_spawn(&pid, a[0], &fa, nullptr, a.data(), environ) == 0);
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

std::vector<std::string> words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// The children of `pid` (from /proc), and whether a process is still running (a zombie is not).
std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string text;
    std::getline(stat, text);
    const size_t close = text.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(text.substr(close + 2));
    char state;
    pid_t ppid;
    rest >> state >> ppid;
    if (ppid == pid) out.push_back(std::stoi(name));
  }
  return out;
}

bool running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return false;
  const size_t close = text.rfind(')');
  return close != std::string::npos && text.size() > close + 2 && text[close + 2] != 'Z';
}

std::string slurp(const fs::path& p) { return fs::exists(p) ? read_text_file(p) : std::string(); }

// A JSONL file left by an interrupted loop: whole lines only, each a record. Returns their count.
int whole_records(const fs::path& p) {
  const std::string text = slurp(p);
  CHECK(!text.empty());
  CHECK((!text.empty() && text.back() == '\n'));
  std::istringstream in(text);
  int records = 0;
  for (std::string line; std::getline(in, line); ++records) CHECK(nlohmann::json::parse(line).is_object());
  return records;
}

}  // namespace

TEST_CASE("a checkpoint is a unit: folder per step, manifest with checksums, latest, older saves removed") {
  const fs::path root = tmpdir() / "unit";
  remove_tree(root);
  make_checkpoint(root, 2);
  make_checkpoint(root, 2, /*resume=*/true);
  CHECK(step_folder(root).filename() == "step-00000004");
  int entries = 0;
  for (const auto& e : fs::directory_iterator(root)) {
    ++entries;
    CHECK(e.path().filename().string()[0] != '.');  // no partial folder left
  }
  CHECK(entries == 2);  // latest and step-00000004: step 2 went once step 4 was complete
  const auto m = nlohmann::json::parse(slurp(step_folder(root) / "manifest.json"));
  CHECK(m["step"] == 4);
  CHECK(m["world_size"] == 2);
  CHECK(m["shards"].size() == 2);
  CHECK(m["shards"][1]["bytes"].get<uint64_t>() == fs::file_size(step_folder(root) / "rank1.pt"));
  CHECK(resumed_first_step(root) == 5);
  // A step folder is a checkpoint too.
  CHECK(resumed_first_step(step_folder(root)) == 5);
}

TEST_CASE("mixed, swapped, corrupted, truncated or mismatched checkpoints are refused with one line") {
  if (g_nproc < 2) return;  // the cases are about two ranks' files
  const fs::path a = tmpdir() / "ck_a", b = tmpdir() / "ck_b", t = tmpdir() / "ck_t";
  remove_tree(a);
  remove_tree(b);
  make_checkpoint(a, 2);
  make_checkpoint(b, 3);
  std::string err;
  struct Case {
    const char* name;
    std::function<void(const fs::path& step)> damage;
    std::string flags;
    int exit_status;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"a shard of another step (mixed)",
       [&](const fs::path& s) { fs::copy_file(step_folder(b) / "rank1.pt", s / "rank1.pt", fs::copy_options::overwrite_existing); },
       "", kExitBadInput, "rank1.pt: "},
      {"swapped rank files",
       [](const fs::path& s) {
         fs::rename(s / "rank0.pt", s / "x");
         fs::rename(s / "rank1.pt", s / "rank0.pt");
         fs::rename(s / "x", s / "rank1.pt");
       },
       "", kExitBadInput, "CRC-32C"},
      {"one flipped byte",
       [](const fs::path& s) {
         std::fstream f(s / "rank1.pt", std::ios::in | std::ios::out | std::ios::binary);
         f.seekp(static_cast<std::streamoff>(fs::file_size(s / "rank1.pt") / 2));
         f.put('\x5a');
       },
       "", kExitBadInput, "rank1.pt: CRC-32C"},
      {"truncated shard", [](const fs::path& s) { fs::resize_file(s / "rank0.pt", 1000); }, "", kExitBadInput,
       "rank0.pt: 1000 bytes, the manifest says"},
      {"missing shard", [](const fs::path& s) { fs::remove(s / "rank1.pt"); }, "", kExitBadInput, "rank1.pt: missing"},
      {"no manifest (interrupted before it was written)", [](const fs::path& s) { fs::remove(s / "manifest.json"); }, "",
       kExitBadInput, "has no manifest.json"},
      {"manifest of another step", [&](const fs::path& s) {
         fs::copy_file(step_folder(b) / "manifest.json", s / "manifest.json", fs::copy_options::overwrite_existing);
       }, "", kExitBadInput, "CRC-32C"},
      {"malformed manifest", [](const fs::path& s) { std::ofstream(s / "manifest.json") << "{\"format\": "; }, "",
       kExitBadInput, "manifest.json: malformed JSON"},
      {"latest names nothing", [](const fs::path& s) { std::ofstream(s.parent_path() / "latest") << "../../etc\n"; }, "",
       kExitBadInput, "is not a step folder name"},
      {"another world size", [](const fs::path&) {}, " --nproc 1", kExitBadInput,
       "world_size " + std::to_string(g_nproc) + ", this run has 1"},
      {"another stage", [](const fs::path&) {}, " --stage 3", kExitBadInput, "state.zero_stage 2, this run has 3"},
      {"another optimizer", [](const fs::path&) {}, " --optimizer adamw8bit", kExitBadInput,
       "state.optimizer \"adamw\", this run has \"adamw8bit\""},
      {"another model", [](const fs::path&) {}, " --model test-gptj-tiny", kExitBadInput, "model \"test-llama-tiny\""},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    copy_tree(a, t);
    c.damage(step_folder(t));
    CHECK(train(run_flags() + " --steps 1 --resume " + t.string() + c.flags, &err) == c.exit_status);
    CHECK(err.find(c.message) != std::string::npos);
    CHECK(lines_of(err) == 1);
    if (err.find(c.message) == std::string::npos || lines_of(err) != 1) MESSAGE(err);
  }
  // Not a checkpoint at all: a file, a folder without one, nothing.
  for (const auto& [path, message] : std::vector<std::pair<fs::path, std::string>>{
           {a / "latest", "this is a file"}, {tmpdir(), "not a checkpoint"}, {tmpdir() / "nothing", "no such checkpoint"}}) {
    CHECK(train(run_flags() + " --steps 1 --resume " + path.string(), &err) == kExitBadInput);
    CHECK(err.find(message) != std::string::npos);
    CHECK(lines_of(err) == 1);
  }
  // The undamaged one resumes.
  CHECK(resumed_first_step(a) == 3);
}

TEST_CASE("a rank killed while saving: the previous checkpoint stays; the next save removes the partial one") {
  const fs::path root = tmpdir() / "killed";
  remove_tree(root);
  make_checkpoint(root, 2);
  std::string err;
  for (int rank : {1, 0}) {
    CAPTURE(rank);
    const int rc = train(run_flags() + " --steps 2 --resume " + root.string() + " --save " + root.string() +
                             " --inject-fault-in save --inject-fault-rank " + std::to_string(rank),
                         &err);
    CHECK(rc != 0);
    CHECK(err.find("injected fault while saving step 4") != std::string::npos);
    CHECK(step_folder(root).filename() == "step-00000002");
    CHECK(resumed_first_step(root) == 3);
  }
  // Rank 0, which cleans up after a failed save, died: its partial folder stays until the next save.
  CHECK(fs::exists(root / ".step-00000004.partial"));
  make_checkpoint(root, 1, /*resume=*/true);
  CHECK(!fs::exists(root / ".step-00000004.partial"));
  CHECK(step_folder(root).filename() == "step-00000003");
}

TEST_CASE("a full disk (a file-size limit) fails the save with one line; the previous checkpoint resumes") {
  const fs::path root = tmpdir() / "full";
  remove_tree(root);
  make_checkpoint(root, 2);
  const uintmax_t shard = fs::file_size(step_folder(root) / "rank0.pt");
  // bash's ulimit -f counts 1024-byte blocks: half a shard fits.
  const fs::path err_file = tmpdir() / "full.err";
  const std::string cmd = "bash -c 'ulimit -f " + std::to_string(shard / 2048) + "; exec " + g_train + " --device " +
                          g_device + " --quiet " + run_flags() + " --steps 2 --resume " + root.string() + " --save " +
                          root.string() + "' 2>" + err_file.string();
  const int status = std::system(cmd.c_str());
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == kExitIo);
  const std::string err = slurp(err_file);
  CHECK(lines_of(err) == 1);
  CHECK(err.find("cannot write the checkpoint shard: File too large") != std::string::npos);
  CHECK(err.find("still names step-00000002") != std::string::npos);
  CHECK(!fs::exists(root / ".step-00000004.partial"));
  CHECK(resumed_first_step(root) == 3);
  // A save folder under a file: one line, exit 5.
  std::string err2;
  CHECK(train(run_flags() + " --steps 1 --save " + (root / "latest" / "x").string(), &err2) == kExitIo);
  CHECK(err2.find("cannot save a checkpoint there: Not a directory") != std::string::npos);
}

TEST_CASE("the ranks die with their launcher: SIGKILL, SIGTERM, SIGINT") {
  if (g_nproc < 2) return;  // one rank runs in the launcher's own process
  for (int sig : {SIGKILL, SIGTERM, SIGINT}) {
    CAPTURE(sig);
    std::vector<std::string> argv = words(g_train + " --device " + g_device + " --quiet " + kBase + ranks());
    argv.insert(argv.end(), {"--steps", "100000"});
    const pid_t launcher = start(argv, tmpdir() / "launcher.err");
    std::vector<pid_t> ranks;
    for (int i = 0; i < 200 && static_cast<int>(ranks.size()) < g_nproc; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ranks = children_of(launcher);
    }
    REQUIRE(static_cast<int>(ranks.size()) == g_nproc);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // training
    ::kill(launcher, sig);
    int status = 0;
    ::waitpid(launcher, &status, 0);
    if (sig == SIGKILL) CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));
    else CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 128 + sig));
    bool gone = false;
    for (int i = 0; i < 100 && !gone; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      gone = std::none_of(ranks.begin(), ranks.end(), running);
    }
    CHECK(gone);
    for (pid_t r : ranks)
      if (running(r)) ::kill(r, SIGKILL);
  }
}

TEST_CASE("a peer that never arrives: one line naming the rendezvous, within the timeout") {
  // Rank 0 of a world of 2, alone (as if the other host never started).
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path err_file = tmpdir() / "alone.err";
  const std::string cmd = "RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_PORT=" + std::to_string(stepcast::backend::free_port()) + " " + g_train +
                          " --device " + g_device + " --quiet " + kBase + " --timeout-s 3 2>" + err_file.string();
  const int status = std::system(cmd.c_str());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(WEXITSTATUS(status) == kExitIo);
  const std::string err = slurp(err_file);
  CHECK(lines_of(err) == 1);
  CHECK(err.find("1 of 2 ranks arrived") != std::string::npos);
  CHECK(seconds < 3 + 10);  // the timeout once (plus start-up), not twice
}

TEST_CASE("Ctrl-C stops calibrate measure between configurations; runs.jsonl stays whole; a rerun resumes") {
  const fs::path calibrate = fs::path(g_train).parent_path().parent_path() / "calibrate" / "calibrate";
  const fs::path list = tmpdir() / "list.txt", out = tmpdir() / "measure";
  remove_tree(out);
  {
    std::ofstream l(list);
    for (int mb : {1, 2, 3, 4})
      l << "test-llama-tiny 1 --precision fp32 --seq 32 --stage 0 --micro-batch " << mb << "\n";
  }
  const std::vector<std::string> argv{calibrate.string(), "measure", "--list", list.string(), "--out", out.string(),
                                      "--train", g_train, "--device", g_device, "--no-micro", "--steps", "3"};
  const pid_t pid = start(argv, tmpdir() / "measure.err");
  // Wait for the first configuration's records, then interrupt (the process alone: its
  // child gets the signal forwarded, as a terminal's Ctrl-C would deliver it to both).
  const fs::path runs = out / "runs.jsonl";
  for (int i = 0; i < 600 && !(fs::exists(runs) && fs::file_size(runs) > 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(fs::exists(runs));
  ::kill(pid, SIGINT);
  int status = 0;
  ::waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == kExitInterrupted);
  const std::string err = slurp(tmpdir() / "measure.err");
  CHECK(err.find("interrupted") != std::string::npos);
  CHECK(err.find("rerun to resume") != std::string::npos);
  // Whole lines only, each a record; fewer than all four configurations.
  const int records = whole_records(runs);
  CHECK(records >= 3);
  CHECK(records < 12);
  // The rerun measures only what is missing.
  std::string rerun_err;
  const std::string cmd = calibrate.string() + " measure --list " + list.string() + " --out " + out.string() +
                          " --train " + g_train + " --device " + g_device + " --no-micro --steps 3 2>" +
                          (tmpdir() / "rerun.err").string();
  CHECK(std::system(cmd.c_str()) == 0);
  const std::string rerun = slurp(tmpdir() / "rerun.err");
  CHECK(rerun.find("skipped (already measured)") != std::string::npos);
  CHECK(rerun.find(" 0 skipped") == std::string::npos);
  std::istringstream all(slurp(runs));
  int total = 0;
  for (std::string line; std::getline(all, line);) ++total;
  CHECK(total == 12);
}

TEST_CASE("Ctrl-C stops planner validate between plans; --append keeps the completed runs") {
  const fs::path planner = fs::path(g_train).parent_path().parent_path() / "planner" / "planner";
  const fs::path log = tmpdir() / "validate.jsonl";
  fs::remove(log);
  const std::vector<std::string> argv{planner.string(), "validate", "--model", "test-llama-tiny", "--gpus", "1",
                                      "--seq", "32", "--precision", "fp32", "--top", "4", "--steps", "3",
                                      "--train", g_train, "--device", g_device, "--append", log.string()};
  const pid_t pid = start(argv, tmpdir() / "validate.err");
  for (int i = 0; i < 600 && !(fs::exists(log) && fs::file_size(log) > 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(fs::exists(log));
  ::kill(pid, SIGINT);
  int status = 0;
  ::waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == kExitInterrupted);
  CHECK(slurp(tmpdir() / "validate.err").find("holds the completed ones") != std::string::npos);
  const int records = whole_records(log);
  CHECK(records >= 3);
  CHECK(records < 12);
}

TEST_CASE("a torn last line (a writer killed mid-append) is skipped with a warning; one in the middle is an error") {
  const fs::path calibrate = fs::path(g_train).parent_path().parent_path() / "calibrate" / "calibrate";
  const fs::path log = tmpdir() / "torn.jsonl";
  fs::remove(log);
  REQUIRE(train(std::string(kBase) + " --steps 4 --json-out " + log.string()) == 0);
  const std::string whole = slurp(log);
  std::ofstream(log, std::ios::app) << whole.substr(0, whole.find('\n') / 2);  // half a record, no newline
  const std::string report = calibrate.string() + " report --hardware h200-sxm --runs " + log.string() + " >/dev/null 2>" +
                             (tmpdir() / "torn.err").string();
  CHECK(std::system(report.c_str()) == 0);
  const std::string err = slurp(tmpdir() / "torn.err");
  CHECK(err.find("torn.jsonl:5: the last line is incomplete") != std::string::npos);
  // The same half line followed by whole ones is not a torn tail: refused, naming the line.
  std::ofstream(log, std::ios::app) << "\n" << whole;
  CHECK(WEXITSTATUS(std::system(report.c_str())) == kExitBadInput);
  CHECK(slurp(tmpdir() / "torn.err").find("torn.jsonl:5: malformed JSON") != std::string::npos);
}

int main(int argc, char** argv) { return stepcast::test::run_tests(argc, argv); }
