// The ZeRO engine through `train`, multi-rank with Gloo on the CPU (NCCL on the
// GPU machine): stages 0-3 with and without offload equal plain data parallel
// on full tensors, the loss falls on real text, a resumed checkpoint continues
// the same loss curve, and faults end the run cleanly.
#include <torch/torch.h>
#define DOCTEST_CONFIG_IMPLEMENT
#include "doctest_after_glog.h"

#include "backend_test_util.h"

using namespace stepcast;
using namespace stepcast::backend;
using namespace stepcast::test;

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
    // With adapters (NeoX: one on query_key_value; GPT-J: q, k and v each), LoRA and QLoRA alike.
    for (const char* peft : {"lora", "qlora"}) {
      CAPTURE(std::string(peft));
      const std::string p = common + " --lr 1e-2 --peft " + peft + " --lora-rank 4";
      REQUIRE(train(p + " --stage 0 --dump-params " + a.string()) == 0);
      REQUIRE(train(p + " --stage 3 --offload-optimizer cpu --checkpointing on --dump-params " + b.string()) == 0);
      CHECK(rel_error(load_params(b), load_params(a)) < g_tol);
    }
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

TEST_CASE("LoRA and QLoRA: stages 1-3, with and without CPU offload, equal stage 0 (2 ranks); the adapters move") {
  // Only the adapters are trained, reduced, partitioned and dumped; the frozen base (QLoRA: in
  // NF4) is replicated at stages 0-2 and gathered at stage 3, so every stage must give stage 0's
  // adapters.
  for (std::string peft : {"lora", "qlora"}) {
    CAPTURE(peft);
    const std::string common = std::string(kBase) + ranks() + " --gas 2 --lr 1e-2 --peft " + peft +
                               " --lora-rank 4 --lora-alpha 8";
    const fs::path init = tmpdir() / "lora_init.pt", ref = tmpdir() / "lora_stage0.pt";
    REQUIRE(train(common + " --stage 0 --lr 0 --dump-params " + init.string()) == 0);
    REQUIRE(train(common + " --stage 0 --dump-params " + ref.string()) == 0);
    const torch::Tensor reference = load_params(ref);
    // 2 layers of rank-4 adapters on test-llama-tiny (h 64, q 64, kv 32, i 160), as Hugging Face PEFT
    // counts them on q, k, v, o, gate, up and down: 4 x [(64 + 64) + 2 (64 + 32) + (64 + 64) +
    // 2 (64 + 160) + (160 + 64)] per layer.
    CHECK(reference.numel() == 2 * 4 * (128 + 192 + 128 + 448 + 224));
    CHECK(rel_error(reference, load_params(init)) > 1e-3);
    for (int stage = 1; stage <= 3; ++stage)
      for (const char* offload : {"none", "cpu"}) {
        CAPTURE(stage);
        CAPTURE(offload);
        const fs::path out = tmpdir() / "lora_params.pt";
        REQUIRE(train(common + " --stage " + std::to_string(stage) + " --offload-optimizer " + offload +
                      " --dump-params " + out.string()) == 0);
        // With GAS 2, stages 2-3 add the micro-batches' gradients after reducing each, stages 0-1
        // before the one reduce: the sums round differently, and Adam's step divides the adapters'
        // small first gradients by their own scale, which magnifies it in the element whose
        // gradient is nearest zero (measured on the CPU: LoRA 1.9e-6; QLoRA 2.4e-5, one element
        // of 8960, where every other is within 3e-6). A micro-batch or a rank left out of the sum
        // moves the adapters by about the learning rate (1e-2 against 0.14: 7e-2). With one
        // micro-batch the order is the same and every stage must give stage 0's adapters bit for
        // bit (below).
        CHECK(rel_error(load_params(out), reference) < std::max(g_tol, 1e-4));
      }
    const std::string one = std::string(kBase) + ranks() + " --gas 1 --lr 1e-2 --peft " + peft +
                            " --lora-rank 4 --lora-alpha 8";
    const fs::path ref1 = tmpdir() / "lora_gas1_stage0.pt", out1 = tmpdir() / "lora_gas1.pt";
    REQUIRE(train(one + " --stage 0 --dump-params " + ref1.string()) == 0);
    for (int stage = 1; stage <= 3; ++stage) {
      CAPTURE(stage);
      REQUIRE(train(one + " --stage " + std::to_string(stage) + " --dump-params " + out1.string()) == 0);
      CHECK(torch::equal(load_params(out1), load_params(ref1)));
    }
  }
}

TEST_CASE("LoRA dropout: checkpointing recomputes the forward's masks, so the adapters equal a run without") {
  const std::string common = std::string(kBase) + ranks() + " --gas 2 --stage 2 --peft lora --lora-rank 4 --lora-dropout 0.3";
  const fs::path a = tmpdir() / "drop_nockpt.pt", b = tmpdir() / "drop_ckpt.pt", c = tmpdir() / "nodrop.pt";
  REQUIRE(train(common + " --dump-params " + a.string()) == 0);
  REQUIRE(train(common + " --checkpointing on --dump-params " + b.string()) == 0);
  REQUIRE(train(std::string(kBase) + ranks() + " --gas 2 --stage 2 --peft lora --lora-rank 4 --dump-params " + c.string()) == 0);
  CHECK(rel_error(load_params(b), load_params(a)) < g_tol);
  CHECK(rel_error(load_params(c), load_params(a)) > 1e-3);  // and the dropout did something
}

TEST_CASE("the loss falls on real text with LoRA and QLoRA adapters (bf16, stage 3, 2 ranks)") {
  for (std::string peft : {"lora", "qlora"}) {
    CAPTURE(peft);
    const fs::path log = tmpdir() / "lora_loss.jsonl";
    fs::remove(log);
    REQUIRE(train(std::string("--model test-llama-tiny --precision bf16 --seq 64 --micro-batch 4 --gas 2 --steps 40 ") +
                  "--lr 1e-2 --stage 3 --peft " + peft + " --lora-rank 16 --lora-alpha 32 --json-out " + log.string() +
                  ranks()) == 0);
    const auto l = losses(log);
    REQUIRE(l.size() == 40);
    CHECK(l.front() == doctest::Approx(std::log(256.0)).epsilon(0.05));
    double tail = 0;
    for (size_t i = 35; i < 40; ++i) tail += l[i] / 5;
    MESSAGE(std::string(peft) << ": loss " << l.front() << " -> " << tail);
    // Less than full fine-tuning's fall (1.5 nats above): the frozen random head sees a final
    // norm whose weights stay 1, so its logits stay within about +-0.2 (N(0, 0.02) weights
    // x sqrt(64)) and the loss cannot go far below ln 256; the adapters still take 0.3 off.
    CHECK(tail < l.front() - 0.3);
  }
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
    remove_tree(ck);
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
  remove_tree(ck);
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
  CHECK(err.find("state.split_master true, this run has false") != std::string::npos);
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
  CHECK(err.find("injected fault at step 2") != std::string::npos);
  // The other rank learns of it in its next collective and exits on its own, or the
  // launcher stops it: either way within seconds.

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

int main(int argc, char** argv) { return stepcast::test::run_tests(argc, argv); }
