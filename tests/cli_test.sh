#!/usr/bin/env bash
# End-to-end checks of the planner CLI: exit codes, one clear line on stderr
# for bad input, no half-written output files, JSON parses.
set -u
PLANNER="$1"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0

ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }

# expect_error DESCRIPTION REGEX ARGS... : non-zero exit, exactly one stderr line matching REGEX
expect_error() {
  local desc="$1" regex="$2"
  shift 2
  "$PLANNER" "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  local lines
  lines=$(wc -l <"$TMP/err")
  if [[ $rc -eq 0 ]]; then bad "$desc: exit 0"; return; fi
  if [[ $rc -ge 128 ]]; then bad "$desc: crashed (rc $rc)"; return; fi
  if [[ $lines -ne 1 ]]; then bad "$desc: $lines stderr lines: $(cat "$TMP/err")"; return; fi
  if ! grep -Eq -- "$regex" "$TMP/err"; then bad "$desc: stderr '$(cat "$TMP/err")' !~ /$regex/"; return; fi
  ok
}

expect_error "unknown model" "unknown model 'gpt-9'.*llama-2-7b" recommend --model gpt-9 --gpus 2
expect_error "unknown hardware" "unknown hardware 'tpu'.*h200-sxm" recommend --model 6b --gpus 2 --hardware tpu
expect_error "zero gpus" "--gpus 0" recommend --model 6b --gpus 0
expect_error "negative seq" "--seq -5" explain --model 6b --seq -5
expect_error "stage 5" "--stage 5 is not a ZeRO stage" explain --model 6b --stage 5
expect_error "param offload below stage 3" "needs --stage 3" explain --model 6b --stage 2 --offload-params cpu
expect_error "param offload alone" "needs --offload-optimizer cpu" explain --model 6b --stage 3 --offload-params cpu
expect_error "offload at stage 0" "needs --stage 1, 2 or 3" explain --model 6b --stage 0 --offload-optimizer cpu
expect_error "bad precision" "precision" explain --model 6b --precision fp8
expect_error "bad optimizer list" "adamw9" recommend --model 6b --optimizers adamw,adamw9
expect_error "negative memory" "--gpu-mem-gib -3" recommend --model 6b --gpu-mem-gib -3
expect_error "global batch" "--global-batch 64 is not a multiple of the 3" recommend --model 6b --gpus 3 --global-batch 64
# Left at its default the global batch is 64 rounded up to a multiple of the ranks: 3 x 2 = 6 ranks, 66.
"$PLANNER" recommend --model 6b --gpus 3 --nodes 2 --top 1 --json >"$TMP/gb.json" 2>/dev/null &&
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); r=d['request']['global_batch']; p=d['plans'][0]['config']; assert r==66 and p['micro_batch']*p['gas']*6==66, (r, p['micro_batch'], p['gas'])" "$TMP/gb.json" && ok || bad "default global batch rounded up to the ranks"
expect_error "unknown flag" "error" recommend --model 6b --frobnicate
expect_error "non-number" "error" recommend --model 6b --gpus two

# Malformed files name the file, key and value.
printf 'name = "x"\nmodel_type = "llama"\nsource = "t"\nhidden_size = "big"\n' >"$TMP/bad.toml"
expect_error "bad card" "bad.toml: key 'hidden_size' must be an integer, got \"big\"" explain --model "$TMP/bad.toml"
printf '{"model_type": "llama", "hidden_size": 4096,' >"$TMP/config.json"
expect_error "truncated config.json" "config.json: malformed JSON" explain --model "$TMP/config.json"
mkdir -p "$TMP/hw"
sed 's/cpu_cores_per_gpu = { value = 16/cpu_cores_per_gpu = { value = -16/' \
  "$(dirname "$0")/../data/hardware/h200-sxm.toml" >"$TMP/hw/neg.toml"
expect_error "bad profile" "neg.toml: key 'host.cpu_cores_per_gpu.value' = -16" explain --model 6b --hardware "$TMP/hw/neg.toml"

# Nothing fits: non-zero, a suggestion, and no DeepSpeed file written.
expect_error "nothing fits" "nothing fits.*would fit on" recommend --model llama-2-70b --gpus 1 --deepspeed-config "$TMP/ds70.json"
[[ -e "$TMP/ds70.json" ]] && bad "nothing fits wrote a config" || ok

# Unwritable output: error, and no stray temporary file.
expect_error "unwritable" "cannot write" recommend --model 6b --gpus 2 --deepspeed-config "$TMP/nope/ds.json"
[[ -z "$(ls -A "$TMP" | grep tmp)" ]] && ok || bad "temporary file left behind"

# Happy paths.
if "$PLANNER" recommend --model 6b --gpus 2 --deepspeed-config "$TMP/ds.json" --accelerate-config "$TMP/acc.yaml" >"$TMP/out" 2>"$TMP/err"; then ok; else bad "recommend 6b failed: $(cat "$TMP/err")"; fi
grep -q "Why the others lose" "$TMP/out" && ok || bad "no why-lose section"
grep -q "GAS time" "$TMP/out" && ok || bad "no GAS time column"
python3 -c "import json,sys; d=json.load(open('$TMP/ds.json')); assert d['train_batch_size']==64, d" && ok || bad "DeepSpeed JSON"
grep -q "distributed_type: DEEPSPEED" "$TMP/acc.yaml" && ok || bad "Accelerate YAML"
"$PLANNER" recommend --model 6b --gpus 2 --json >"$TMP/rec.json" && ok || bad "recommend --json"
python3 - "$TMP/rec.json" <<'PY' && ok || bad "recommend JSON contract"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["model"]["params"] == 6050882784
p = d["plans"][0]
for k in ["zero_stage", "offload_optimizer", "offload_params", "optimizer", "precision", "micro_batch", "gas", "seq_len", "gpus", "nodes", "activation_checkpointing"]:
    assert k in p["config"], k
assert p["fits"] is True
assert abs(p["time_s"]["step"] - p["time_s"]["opt"] - (p["time_s"]["gas"] or 0)) < 1e-9
PY
"$PLANNER" explain --model 6b --gpus 2 --stage 3 --offload-optimizer cpu --micro-batch 4 --gas 8 --checkpointing on --json >"$TMP/exp.json" && ok || bad "explain --json"
python3 -c "import json; d=json.load(open('$TMP/exp.json')); assert len(d['plans'])==1 and d['plans'][0]['config']['offload_optimizer']=='cpu'" && ok || bad "explain JSON"
expect_error "bad offload pipeline" '--offload-pipeline "sometimes" is not valid' explain --model 6b --gpus 2 --stage 2 --offload-optimizer cpu --offload-pipeline sometimes
# An offload plan written for DeepSpeed says what DeepSpeed's serial CPU Adam will run at,
# the same number `explain --offload-pipeline off` predicts, and below the plan's.
"$PLANNER" explain --model 6b --gpus 2 --stage 2 --offload-optimizer cpu --micro-batch 4 --gas 4 \
  --deepspeed-config "$TMP/ds_off.json" --json >"$TMP/ds_off.out" && ok || bad "explain offload --deepspeed-config"
"$PLANNER" explain --model 6b --gpus 2 --stage 2 --offload-optimizer cpu --micro-batch 4 --gas 4 \
  --offload-pipeline off --json >"$TMP/serial.json" && ok || bad "explain --offload-pipeline off"
python3 - "$TMP/ds_off.out" "$TMP/serial.json" <<'PY' && ok || bad "DeepSpeed note"
import json, re, sys
plan = json.load(open(sys.argv[1]))
serial = json.load(open(sys.argv[2]))["plans"][0]
assert serial["config"]["offload_pipeline"] is False
note = [n for n in plan["notes"] if n.startswith("under DeepSpeed")]
assert len(note) == 1, plan["notes"]
tps = float(re.search(r"predicted (\d+) tokens/s", note[0]).group(1))
assert abs(tps - serial["throughput"]["tokens_per_s"]) <= 1, (tps, serial["throughput"])
assert tps < plan["plans"][0]["throughput"]["tokens_per_s"]
PY
"$PLANNER" explain --model 6b --gpus 2 --stage 2 --micro-batch 4 --gas 4 --deepspeed-config "$TMP/ds_no.json" >"$TMP/ds_no.out" && ok || bad "explain no offload"
if grep -q "under DeepSpeed" "$TMP/ds_no.out"; then bad "DeepSpeed note without offload"; else ok; fi
expect_error "bad engine" '--engine "megatron" is not valid' recommend --model 6b --gpus 2 --engine megatron
# Ranked for DeepSpeed: offload plans are serial with fp32 CPU states; for Stepcast, pipelined.
"$PLANNER" recommend --model llama-2-7b --gpus 2 --engine deepspeed --top 200 --json >"$TMP/ds_rank.json" && ok || bad "recommend --engine deepspeed"
"$PLANNER" recommend --model llama-2-7b --gpus 2 --top 200 --json >"$TMP/sc_rank.json" && ok || bad "recommend --engine stepcast"
python3 - "$TMP/ds_rank.json" "$TMP/sc_rank.json" <<'PY' && ok || bad "engine ranking"
import json, sys
ds, sc = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert ds["request"]["engine"] == "deepspeed" and sc["request"]["engine"] == "stepcast"
assert all(p["config"].get("engine") == "deepspeed" for p in ds["plans"])
off = lambda j: [p for p in j["plans"] if p["config"]["offload_optimizer"] == "cpu"]
assert off(ds) and off(sc)
assert all(not p["config"]["offload_pipeline"] and p["config"]["optimizer"] == "adamw" for p in off(ds))
# The same job on the Stepcast backend, for the peer engine's user, in --json as in the text: its
# best plan and the ratio of its tokens/s to the top plan's; the text's notes are in "notes".
b = ds["stepcast_backend"]
assert b["plan"]["config"].get("engine", "stepcast") == "stepcast"
assert abs(b["ratio_to_top_plan"] - b["tokens_per_s"] / ds["plans"][0]["throughput"]["tokens_per_s"]) < 1e-12
assert abs(b["tokens_per_s"] - sc["plans"][0]["throughput"]["tokens_per_s"]) <= 1e-9 * b["tokens_per_s"]
assert any("on the Stepcast backend the same job" in n for n in ds["notes"])
assert "stepcast_backend" not in sc
assert all(p["config"]["offload_pipeline"] for p in off(sc))
assert any(p["config"]["optimizer"] == "adamw8bit" for p in off(sc))
# The same offload configuration is slower under DeepSpeed's serial order.
key = lambda p: json.dumps({k: v for k, v in p["config"].items() if k not in ("offload_pipeline", "offload_overlap_forward", "engine")}, sort_keys=True)
scd = {key(p): p["throughput"]["tokens_per_s"] for p in off(sc)}
common = [p for p in off(ds) if key(p) in scd]
assert common and all(p["throughput"]["tokens_per_s"] < scd[key(p)] for p in common)
PY
# Offload pipeline "full" (the default): plans say so, never rank slower than "on", and "on" plans list it as a lever.
expect_error "bad validate pipeline" '--offload-pipeline "off" is not valid for validate' validate --model 6b --gpus 2 --offload-pipeline off
expect_error "bad recommend pipeline" '--offload-pipeline "off" is not valid for recommend' recommend --model 6b --gpus 2 --offload-pipeline off
"$PLANNER" recommend --model llama-2-7b --gpus 2 --top 200 --offload-pipeline on --json >"$TMP/on_rank.json" && ok || bad "recommend --offload-pipeline on"
python3 - "$TMP/sc_rank.json" "$TMP/on_rank.json" <<'PY' && ok || bad "pipeline full ranking"
import json, sys
full, on = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert full["request"]["offload_pipeline"] == "full" and on["request"]["offload_pipeline"] == "on"
off = lambda j: [p for p in j["plans"] if p["config"]["offload_optimizer"] == "cpu"]
assert off(full) and all(p["config"]["offload_overlap_forward"] for p in off(full))
assert all(not p["config"]["offload_overlap_forward"] for p in on["plans"])
key = lambda p: json.dumps({k: v for k, v in p["config"].items() if k not in ("offload_overlap_forward", "offload_uploads_in_backward")}, sort_keys=True)
ond = {key(p): p["throughput"]["tokens_per_s"] for p in off(on)}
common = [p for p in off(full) if key(p) in ond]
assert common and all(p["throughput"]["tokens_per_s"] >= ond[key(p)] - 1e-6 for p in common)
assert any(p["throughput"]["tokens_per_s"] > ond[key(p)] for p in common)
PY
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert any('overlapping the next forward (--offload-pipeline full)' in l['lever'] and l['gain_frac'] >= 0 for l in j['offload_levers']['levers'])" "$TMP/on_rank.json" && ok || bad "lever: pipeline full"
"$PLANNER" recommend --model llama-2-7b --gpus 2 --offload-pipeline full --no-offload --deepspeed-config "$TMP/ds_full_none.json" >/dev/null && ok || bad "recommend full, no offload"
"$PLANNER" explain --model llama-2-7b --gpus 2 --stage 2 --offload-optimizer cpu --optimizer adamw8bit --micro-batch 8 --gas 4 --offload-pipeline full --deepspeed-config "$TMP/ds_full.json" >"$TMP/ds_full.out" && ok || bad "explain full with a DeepSpeed config"
grep -q "under DeepSpeed" "$TMP/ds_full.out" && ok || bad "DeepSpeed note for a full-pipeline plan"
"$PLANNER" models --json | python3 -c "import json,sys; assert len(json.load(sys.stdin)) >= 12" && ok || bad "models --json"
"$PLANNER" hardware --json | python3 -c "import json,sys; assert len(json.load(sys.stdin)) >= 7" && ok || bad "hardware --json"
"$PLANNER" --help >/dev/null && ok || bad "--help"

# --deepspeed-config A --accelerate-config B: both or neither. B unwritable leaves A as it was;
# the same path for both is refused, one line, nothing written.
printf 'keep me' >"$TMP/pair_ds.json"
expect_error "pair: second unwritable" "nope/acc.yaml: cannot write" recommend --model 6b --gpus 2 \
  --deepspeed-config "$TMP/pair_ds.json" --accelerate-config "$TMP/nope/acc.yaml"
[[ "$(cat "$TMP/pair_ds.json")" == "keep me" ]] && ok || bad "pair: the DeepSpeed config was replaced although the Accelerate one failed"
expect_error "pair: same path" "named for two outputs" recommend --model 6b --gpus 2 \
  --deepspeed-config "$TMP/pair_ds.json" --accelerate-config "$TMP/pair_ds.json"
[[ "$(cat "$TMP/pair_ds.json")" == "keep me" ]] && ok || bad "pair: same path overwrote the file"
ls -a "$TMP" | grep -q '\.tmp\.' && bad "pair: a temporary file was left" || ok

# compare: a pod smaller than the profile's server is named as what holds a row back. The
# A100 40GB profile's server has 16 cores and 128 GB per GPU; with a pod of 2 vCPUs and 24 GiB
# per GPU, llama-2-7b's CPU-offload plans lose their CPU AdamW's cores (2 GPUs) or do not fit
# at all (1 GPU).
SRC="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$TMP/dd/hardware"
cp -r "$SRC/data/models" "$TMP/dd/models"
cp "$SRC/data/hardware/h200-sxm.toml" "$TMP/dd/hardware/"
sed -e 's/^vcpus_per_gpu = .*/vcpus_per_gpu = 2/' -e 's/^memory_gib_per_gpu = .*/memory_gib_per_gpu = 24/' \
  "$SRC/data/hardware/a100-40gb-sxm.toml" >"$TMP/dd/hardware/a100-40gb-sxm.toml"
if "$PLANNER" compare --model 7b --train-tokens 1e9 --hardware a100-40gb-sxm --max-gpus 2 --data-dir "$TMP/dd" >"$TMP/cmp" 2>&1 &&
   grep -q "^! a100-40gb-sxm x2 is pod-limited: on the profile's server host (32 cores, 238.4 GiB) .* the lambda pod has 4 vCPUs and 48.0 GiB$" "$TMP/cmp" &&
   grep -q "^note: a100-40gb-sxm x1 is pod-limited: .*(nothing fits the pod)" "$TMP/cmp"; then ok; else bad "compare: small pod not flagged: $(cat "$TMP/cmp")"; fi
# ... and the real Lambda pod (15.5 vCPUs, 225 GiB per GPU) is not.
# compare: a GPU count the global batch does not divide over is left out, and said: 128 GPUs hold
# 64 sequences no whole number to a rank; 128 is the least batch that admits them.
"$PLANNER" compare --model 13b --train-tokens 1e9 --hardware h100-sxm --max-gpus 128 --json >"$TMP/cmp128.json" 2>/dev/null &&
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert any('left out 128 GPUs' in n and '--global-batch 128 admits' in n for n in d['notes']), d['notes']; assert max(r['gpus'] for r in d['rows'])==64" "$TMP/cmp128.json" && ok || bad "compare: 128 GPUs over 64 sequences not named"
"$PLANNER" compare --model 13b --train-tokens 1e9 --hardware h100-sxm --max-gpus 128 --global-batch 128 --json 2>/dev/null |
  python3 -c "import json,sys; d=json.load(sys.stdin); assert max(r['gpus'] for r in d['rows'])==128 and not any('left out' in n for n in d['notes']), d['notes']" && ok || bad "compare: --global-batch 128 does not admit 128 GPUs"
"$PLANNER" compare --model 6b --train-tokens 1e9 --hardware a100-40gb-sxm --max-gpus 2 >"$TMP/cmp" 2>&1
grep -q "pod-limited" "$TMP/cmp" && bad "compare: the real Lambda pod was flagged: $(cat "$TMP/cmp")" || ok

# Attention "auto": the backend runs flash everywhere; DeepSpeed and FSDP2 run transformers' GPT-J
# eagerly (no SDPA path there), llama with SDPA; an explicit flash for a peer's GPT-J is refused.
attn() { "$PLANNER" explain "$@" --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["plans"][0]["config"]["attention"])'; }
[[ "$(attn --model 6b)" == flash ]] && ok || bad "attention auto: the backend's gpt-j is not flash"
[[ "$(attn --model 6b --engine deepspeed)" == math ]] && ok || bad "attention auto: DeepSpeed's gpt-j is not math"
[[ "$(attn --model 7b --engine deepspeed)" == flash ]] && ok || bad "attention auto: DeepSpeed's llama is not flash"
[[ "$(attn --model 6b --engine deepspeed --attention math)" == math ]] && ok || bad "attention math not kept"
expect_error "peer flash on gpt-j" "no SDPA attention for gpt-j-6b .*math attention" explain --model 6b --engine deepspeed --attention flash
"$PLANNER" recommend --model 7b --precision fp16 --engine deepspeed 2>&1 | grep -q "on the Stepcast backend the same job.s best plan (.*, in bf16)" && ok || bad "an fp16 DeepSpeed job is not compared with the backend in bf16"
if "$PLANNER" recommend --model 6b --gpus 2 --engine deepspeed --json 2>/dev/null |
   python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(0 if all(p["config"]["attention"] == "math" for p in d["plans"]) else 1)'; then
  ok; else bad "recommend --engine deepspeed: gpt-j plans are not all math attention"; fi

# calibrate report without --runs or --holdout-frac labels the runs by the split the profile's fit
# recorded: the FSDP2 section was fitted on all of its runs (holdout_frac 0), so none is "held".
# (Not in builds without calibrate, such as the sanitizer build of scripts/test.sh.)
CALIBRATE="$(dirname "$PLANNER")/../calibrate/calibrate"
if [[ ! -x "$CALIBRATE" ]]; then
  echo "skipped: calibrate report checks ($CALIBRATE not built)"
else
  if "$CALIBRATE" report --hardware h200-sxm --engine fsdp2 --json 2>/dev/null |
     python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(0 if d["holdout_frac"] == 0 and d["runs"] and not any(r["holdout"] for r in d["runs"]) else 1)'; then
    ok; else bad "calibrate report --engine fsdp2: runs labelled by a split the fit did not use"; fi
  if "$CALIBRATE" report --hardware h200-sxm --engine fsdp2 --holdout-frac 0.5 --json 2>/dev/null |
     python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(0 if d["holdout_frac"] == 0.5 else 1)'; then
    ok; else bad "calibrate report --holdout-frac 0.5 not used"; fi
  # cv.loco.runs: one row per configuration, its error from its own measured and predicted step,
  # largest |error| first, and their mean is the summary's mean.
  if "$CALIBRATE" report --hardware h200-sxm --engine fsdp2 --json 2>/dev/null |
     python3 -c '
import json, sys
l = json.load(sys.stdin)["cv"]["loco"]; rows = l["runs"]
errs = [abs(r["step_error_pct"]) for r in rows]
ok = (len(rows) == l["configurations"] > 0 and len({r["key"] for r in rows}) == len(rows)
      and all(abs(r["step_error_pct"] - 100 * (r["predicted_step_s"] / r["measured_step_s"] - 1)) < 1e-9 for r in rows)
      and errs == sorted(errs, reverse=True)
      and abs(sum(errs) / len(errs) - l["step_time_mean_abs_pct_error"]) < 1e-9
      and abs(errs[0] - l["step_time_max_abs_pct_error"]) < 1e-9)
sys.exit(0 if ok else 1)'; then
    ok; else bad "calibrate report: cv.loco.runs disagrees with the LOCO summary"; fi
  # A micro-benchmark file: DeepSpeed's report predicts its staged copies (and nothing else) at
  # the DeepSpeed section's rates; ours every bench but them; FSDP2's none.
  MICRO="$(dirname "$PLANNER")/../../data/runs/h100-sxm/2026-12-07_session50_micro_optimizer_offload.jsonl"
  if "$CALIBRATE" report --hardware h100-sxm --engine deepspeed --runs "$MICRO" --no-cv --json 2>/dev/null |
     python3 -c 'import json,sys; b=json.load(sys.stdin)["micro"]["by_bench"]; sys.exit(0 if sorted(b) == ["d2h_staged", "h2d_staged"] else 1)' &&
     "$CALIBRATE" report --hardware h100-sxm --runs "$MICRO" --no-cv --json 2>/dev/null |
     python3 -c 'import json,sys; b=json.load(sys.stdin)["micro"]["by_bench"]; sys.exit(0 if b and not {"d2h_staged", "h2d_staged"} & set(b) else 1)' &&
     ! "$CALIBRATE" report --hardware h100-sxm --engine fsdp2 --runs "$MICRO" --no-cv --json >/dev/null 2>&1; then
    ok; else bad "calibrate report: the staged copies belong to DeepSpeed's report alone"; fi
  # --no-cv: the same runs, predictions and labels, without the cross-validation or the
  # coefficients' bootstrap.
  if "$CALIBRATE" report --hardware h200-sxm --engine fsdp2 --no-cv --json 2>/dev/null >"$TMP/nocv.json" &&
     "$CALIBRATE" report --hardware h200-sxm --engine fsdp2 --json 2>/dev/null |
     python3 -c '
import json, sys
full = json.load(sys.stdin); quick = json.load(open(sys.argv[1]))
ok = ("cv" in full and "coefficients" in full and "cv" not in quick and "coefficients" not in quick
      and quick["runs"] == full["runs"] and quick["fit"] == full["fit"])
sys.exit(0 if ok else 1)' "$TMP/nocv.json"; then
    ok; else bad "calibrate report --no-cv: not the full report less cv and coefficients"; fi
  # calibrate predict: one row per run-list line (comments skipped), each the plan planner explain
  # gives for that line (the same step time and memory), under the build's commit.
  list="$(mktemp)"
  printf '# a comment\npythia-2.8b 1 --stage 2 --micro-batch 2 --gas 2\n\ngpt-j-6b 1 --stage 3 --micro-batch 1 --gas 4\n' > "$list"
  want="$("$PLANNER" explain --model gpt-j-6b --gpus 1 --engine deepspeed --stage 3 --micro-batch 1 --gas 4 --json 2>/dev/null |
          python3 -c 'import json,sys; p=json.load(sys.stdin)["plans"][0]; print(p["time_s"]["step"], p["gpu_memory_bytes"]["total"])')"
  if "$CALIBRATE" predict --list "$list" --engine deepspeed --json 2>/dev/null |
     python3 -c 'import json,sys; d=json.load(sys.stdin); r=d["predictions"]; w=[float(x) for x in sys.argv[1].split()]
ok = len(r) == 2 and r[1]["line"].startswith("gpt-j-6b 1 --stage 3") and abs(r[1]["step_s"] - w[0]) <= 1e-9 * w[0] \
     and abs(r[1]["gpu_memory_bytes"] - w[1]) <= 1e-9 * w[1] and r[0]["step_interval_95_s"][0] < r[0]["step_s"] < r[0]["step_interval_95_s"][1] \
     and d["git_commit"] != ""
sys.exit(0 if ok else 1)' "$want"; then
    ok; else bad "calibrate predict: rows differ from planner explain"; fi
  # A line that emulates two nodes on one host (train --emulate-nodes 2) is, to the planner, two
  # nodes of one GPU: the inter-node link, not NVLink.
  printf 'llama-2-7b 2 --stage 2 --micro-batch 8 --gas 4 --checkpointing on --emulate-nodes 2\n' > "$list"
  want="$("$PLANNER" explain --model llama-2-7b --gpus 1 --nodes 2 --stage 2 --micro-batch 8 --gas 4 --checkpointing on --json 2>/dev/null |
          python3 -c 'import json,sys; p=json.load(sys.stdin)["plans"][0]; print(p["time_s"]["step"], p["config"]["nodes"])')"
  if "$CALIBRATE" predict --list "$list" --json 2>/dev/null |
     python3 -c 'import json,sys; r=json.load(sys.stdin)["predictions"]; w=sys.argv[1].split()
sys.exit(0 if len(r) == 1 and w[1] == "2" and abs(r[0]["step_s"] - float(w[0])) <= 1e-9 * float(w[0]) else 1)' "$want"; then
    ok; else bad "calibrate predict: an --emulate-nodes line is not predicted as that many nodes"; fi
  rm -f "$list"
fi

# The memory interval: around the prediction in --json; where its upper edge passes the card
# but the prediction fits with its 5 % headroom (a model outside the calibrated ones widens it
# past 1 / 0.95), explain says the plan may run out of memory; with room for the edge, not.
mem="$("$PLANNER" explain --model mpt-7b --gpus 1 --micro-batch 2 --seq 8192 --json 2>/dev/null |
       python3 -c 'import json,sys; g=json.load(sys.stdin)["plans"][0]["gpu_memory_bytes"]; lo,hi=g["total_interval_95"]
gib=2.0**30; assert lo < g["total"] < hi and g["required"] == g["total"] and hi > g["total"] / 0.95
print((g["required"] / 0.95 + hi) / 2 / gib, hi / gib + 1)')"
if [[ -n "$mem" ]]; then
  read -r tight roomy <<<"$mem"
  out="$("$PLANNER" explain --model mpt-7b --gpus 1 --micro-batch 2 --seq 8192 --gpu-mem-gib "$tight" 2>&1)"
  if grep -q "may run out of GPU memory" <<<"$out" && ! grep -q "does not fit" <<<"$out"; then
    ok; else bad "explain: no memory warning at --gpu-mem-gib $tight"; fi
  out="$("$PLANNER" explain --model mpt-7b --gpus 1 --micro-batch 2 --seq 8192 --gpu-mem-gib "$roomy" 2>&1)"
  if grep -q "may run out of GPU memory" <<<"$out"; then bad "explain: memory warning at --gpu-mem-gib $roomy"; else ok; fi
else
  bad "explain --json: no memory interval around the prediction"
fi

# Expandable segments: a bad value is one line naming the flag; the plan carries the setting and
# needs less memory above its peak allocated than with the default allocator; a peer's DeepSpeed
# config is written with a note to set the variable, and recommend --json says what it changes.
expect_error "bad --gpu-allocator" '--gpu-allocator "huge" is not valid \(valid: default, expandable\)' \
  explain --model 2.8b --gpus 1 --gpu-allocator huge
"$PLANNER" explain --model 2.8b --gpus 1 --engine deepspeed --stage 2 --micro-batch 3 --gas 2 --json >"$TMP/def.json" 2>/dev/null
"$PLANNER" explain --model 2.8b --gpus 1 --engine deepspeed --stage 2 --micro-batch 3 --gas 2 --gpu-allocator expandable \
  --json >"$TMP/expd.json" 2>/dev/null
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))["plans"][0]; e = json.load(open(sys.argv[2]))["plans"][0]
assert e["config"]["gpu_allocator"] == "expandable" and "gpu_allocator" not in d["config"]
dm, em = d["gpu_memory_bytes"], e["gpu_memory_bytes"]
assert em["peak_allocated"] == dm["peak_allocated"] and em["total"] < dm["total"], (dm, em)' "$TMP/def.json" "$TMP/expd.json" \
  && ok || bad "explain --gpu-allocator expandable"
out="$("$PLANNER" explain --model 2.8b --gpus 1 --engine deepspeed --stage 2 --micro-batch 3 --gas 2 \
  --gpu-allocator expandable --deepspeed-config "$TMP/ds_exp.json" 2>&1)"
grep -q "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" <<<"$out" && ok || bad "explain: expandable launch note"
"$PLANNER" recommend --model 2.8b --gpus 1 --engine fsdp2 --hardware h100-sxm --json 2>/dev/null |
  python3 -c 'import json,sys; e=json.load(sys.stdin)["expandable_segments"]; assert e["fitting"] >= 1 and "gain_frac" in e' \
  && ok || bad "recommend --json: expandable_segments"

# --from-deepspeed: a user's DeepSpeed JSON sets what it holds (here stage 2, pinned CPU offload,
# micro-batch 3 of "train_micro_batch_size_per_gpu", GAS from train_batch_size 6 / (3 x 1 GPU) = 2,
# bf16) and leaves "auto" to the flags; the plan equals the one the flags give; a flag that
# contradicts a key, or another engine, is one line naming the file, the key and both values.
cat >"$TMP/user_ds.json" <<'JSON'
{"bf16": {"enabled": true}, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
 "train_micro_batch_size_per_gpu": 3, "train_batch_size": 6, "gradient_accumulation_steps": "auto",
 "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true}}}
JSON
"$PLANNER" explain --model 2.8b --gpus 1 --from-deepspeed "$TMP/user_ds.json" --json >"$TMP/from_ds.json" 2>/dev/null
"$PLANNER" explain --model 2.8b --gpus 1 --engine deepspeed --stage 2 --offload-optimizer cpu --micro-batch 3 --gas 2 \
  --json >"$TMP/by_flags.json" 2>/dev/null
python3 -c '
import json, sys
a = json.load(open(sys.argv[1]))["plans"][0]; b = json.load(open(sys.argv[2]))["plans"][0]
assert a["config"] == b["config"] and a["config"]["engine"] == "deepspeed" and a["config"]["gas"] == 2, (a["config"], b["config"])
assert a["time_s"]["step"] == b["time_s"]["step"]' "$TMP/from_ds.json" "$TMP/by_flags.json" \
  && ok || bad "explain --from-deepspeed: the plan the flags give"
expect_error "--from-deepspeed against --stage" "user_ds.json: key 'zero_optimization.stage' = 2, but --stage 3" \
  explain --model 2.8b --gpus 1 --from-deepspeed "$TMP/user_ds.json" --stage 3
expect_error "--from-deepspeed with --engine fsdp2" "describes a DeepSpeed job, but --engine fsdp2" \
  explain --model 2.8b --gpus 1 --from-deepspeed "$TMP/user_ds.json" --engine fsdp2
expect_error "--from-deepspeed batch arithmetic" "key 'train_batch_size' = 6 is not micro-batch 3 x GAS 2 x 2 GPUs" \
  explain --model 2.8b --gpus 2 --from-deepspeed "$TMP/user_ds.json" --gas 2
expect_error "--from-deepspeed missing file" "nope.json" explain --model 2.8b --from-deepspeed "$TMP/nope.json"

# diagnose: the founding report's one-GPU ZeRO-2 row by the flags (its micro-batch, 51.642 / 4 =
# 12.9105 s, and the step after it, 25.455 - 12.9105 = 12.5445 s, derived by hand); runs whose CPU
# optimizer was given a known thread count, read back from their records (the truth is the count
# the run was given, in its env: OMP_NUM_THREADS=1 on the H200, 2 on the H100, train --cpu-threads 2);
# the model's own prediction at a known speed, recovered through the CLI; bad input.
FOUNDING=(--model pythia-2.8b --hardware a40 --engine deepspeed --precision fp16 --attention math --stage 2
  --offload-optimizer cpu --micro-batch 8 --gas 5 --checkpointing on --cpu-cores 8)
"$PLANNER" diagnose "${FOUNDING[@]}" --gas-s 51.642 --opt-s 25.455 --json >"$TMP/diag.json" 2>"$TMP/err" &&
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert abs(d["derived"]["micro_batch_measured_s"] - 12.9105) < 1e-6, d["derived"]
assert abs(d["derived"]["after_last_micro_batch_measured_s"] - 12.5445) < 1e-6, d["derived"]
assert d["single_resources"][0]["resources"][0]["resource"] == "cpu_optimizer", d["single_resources"][0]
assert not d["within_noise"] and d["machine_as_diagnosed"]["fitting"] > 0' "$TMP/diag.json" \
  && ok || bad "diagnose: founding report row $(cat "$TMP/err")"
"$PLANNER" diagnose "${FOUNDING[@]}" --gas-s 51.642 --opt-s 25.455 >"$TMP/diag.txt" 2>&1 &&
  grep -q "^One resource at a time" "$TMP/diag.txt" && grep -q "^explanation: CPU optimizer x" "$TMP/diag.txt" &&
  grep -q "^GPU (compute and memory) .* TFLOP/s dense fp16" "$TMP/diag.txt" && ok ||
  bad "diagnose: text output $(head -5 "$TMP/diag.txt")"
threads_of() {  # RUNS KEY_PATTERN LO HI: the diagnosed CPU optimizer threads per rank lie in [LO, HI]
  if ! "$PLANNER" diagnose --run "$1" --json >"$TMP/t.json" 2>"$TMP/err"; then  # several: pick by pattern
    local key
    key=$(tr ';(' '\n\n' <"$TMP/err" | grep -F -- "$2" | sed 's/^ *//;s/)$//')
    "$PLANNER" diagnose --run "$1" --key "$key" --json >"$TMP/t.json" 2>"$TMP/err"
  fi
  python3 -c '
import json, sys
e = json.load(open(sys.argv[3]))["explanation"]
lo, hi = float(sys.argv[1]), float(sys.argv[2])
assert e.get("cpu_threads_per_rank") and lo <= e["cpu_threads_per_rank"] <= hi, e' "$3" "$4" "$TMP/t.json"
}
threads_of "$SRC/data/runs/h200-sxm/2026-12-01_peers_deepspeed_1gpu_omp1.jsonl" "s2 off=cpu" 0.5 2 \
  && ok || bad "diagnose --run: OMP_NUM_THREADS=1 not found $(cat "$TMP/err")"
threads_of "$SRC/data/runs/h100-sxm/2026-12-06_diagnose_slow_cpu_deepspeed_1gpu.jsonl" " s2 " 1.5 3 \
  && ok || bad "diagnose --run: DeepSpeed at OMP_NUM_THREADS=2 not found $(cat "$TMP/err")"
threads_of "$SRC/data/runs/h100-sxm/2026-12-06_diagnose_slow_cpu_stepcast_1gpu.jsonl" " s2 " 1.5 3 \
  && ok || bad "diagnose --run: train --cpu-threads 2 not found $(cat "$TMP/err")"
# DeepSpeed's offload with its host buffers not pinned (the record's config says so): the run is
# keyed apart from its pinned twin and predicted with its pageable copies, 22.2 GB a step for
# pythia-2.8b at GAS 2 (5.55 GB down on the first micro-batch; 5.55 up and 11.1 down as fp32 on
# the last), so at least 22.2 GB / 15.16 GB/s - 0.81 s of pinned copies = 0.65 s slower.
for pin in pinned unpinned; do
  "$PLANNER" diagnose --run "$SRC/data/runs/h100-sxm/2026-12-06_unpinned_offload_s2_${pin}_1gpu.jsonl" --json \
    >"$TMP/diag_$pin.json" 2>"$TMP/err"
done
python3 -c '
import json, sys
step = lambda d: [p for p in d["runs"][0]["phases"] if p["phase"] == "step"][0]["predicted_s"]
a = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2]))
assert " pin=off" in b["runs"][0]["label"] and " pin=off" not in a["runs"][0]["label"], (a["runs"][0]["label"], b["runs"][0]["label"])
assert step(b) - step(a) >= 0.65, (step(a), step(b))' "$TMP/diag_pinned.json" "$TMP/diag_unpinned.json" \
  && ok || bad "diagnose --run: unpinned offload step $(cat "$TMP/err")"
# Round trip: explain on a machine whose CPU optimizer runs at 0.25 of the profile's speed, its
# GAS and OPT time (what a DeepSpeed record and the model share) given to diagnose, which names
# that resource and speed.
DS2=(--model pythia-2.8b --engine deepspeed --stage 2 --offload-optimizer cpu --micro-batch 4 --gas 2)
"$PLANNER" explain "${DS2[@]}" --speed cpu_optimizer=0.25 --json >"$TMP/slow.json" 2>/dev/null
read -r -a measured < <(python3 -c '
import json, sys
t = json.load(open(sys.argv[1]))["plans"][0]["time_s"]
print("--gas-s %.9g --opt-s %.9g" % (t["gas"], t["opt"]))' "$TMP/slow.json")
"$PLANNER" diagnose "${DS2[@]}" "${measured[@]}" --json 2>"$TMP/err" | python3 -c '
import json, sys
e = json.load(sys.stdin)["explanation"]["resources"]
assert len(e) == 1 and e[0]["resource"] == "cpu_optimizer" and abs(e[0]["speed_frac"] / 0.25 - 1) < 0.02, e' \
  && ok || bad "diagnose: explain --speed round trip $(cat "$TMP/err")"
out="$("$PLANNER" recommend --model 2.8b --gpus 1 --speed cpu_optimizer=0.1 2>&1)"
grep -q "note: machine speeds relative to the profile (--speed): cpu_optimizer x0.1" <<<"$out" && ok || bad "recommend --speed: no note"
expect_error "diagnose: no time" "no measured time" diagnose "${DS2[@]}"
expect_error "diagnose: negative time" "--step-s -1.* out of range" diagnose "${DS2[@]}" --step-s -1
expect_error "diagnose: no model" "--model is required" diagnose --step-s 1
expect_error "diagnose: --run and a configuration flag" "--stage is not taken with --run" \
  diagnose --run "$SRC/data/runs/h200-sxm/2026-12-01_peers_deepspeed_1gpu_omp1.jsonl" --stage 1
expect_error "diagnose: --run and a DeepSpeed JSON" "--from-deepspeed is not taken with --run" \
  diagnose --run "$SRC/data/runs/h200-sxm/2026-12-01_peers_deepspeed_1gpu_omp1.jsonl" --from-deepspeed "$TMP/user_ds.json"
expect_error "diagnose: --run and a measured flag" "--step-s is not taken with --run" \
  diagnose --run "$SRC/data/runs/h200-sxm/2026-12-01_peers_deepspeed_1gpu_omp1.jsonl" --step-s 1
# Several runs: the founding report's five rows together, each predicted from the other four.
"$PLANNER" diagnose --published "$SRC/data/published/founding_report.toml" --leave-one-out --json >"$TMP/pub.json" 2>"$TMP/err" &&
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert len(d["runs"]) == 5 and len(d["leave_one_out"]) == 5, d.keys()
assert d["hardware"]["name"] == "a40"
for l in d["leave_one_out"]:
    assert {p["phase"] for p in l["phases"]} == {"step", "gas", "opt"}, l["phases"]
    assert all(p["diagnosed_s"] > 0 and p["profile_s"] > 0 for p in l["phases"])
assert "machine_as_diagnosed" not in d' "$TMP/pub.json" && ok || bad "diagnose --published --leave-one-out $(cat "$TMP/err")"
"$PLANNER" diagnose --run "$SRC/data/runs/h100-sxm/2026-12-06_diagnose_slow_cpu_deepspeed_1gpu.jsonl" --all --json 2>"$TMP/err" |
  python3 -c 'import json,sys; d=json.load(sys.stdin); assert len(d["runs"]) == 3 and d["explanation"]["resources"]' \
  && ok || bad "diagnose --run --all $(cat "$TMP/err")"
expect_error "diagnose: --row matches nothing" 'no row named like "nope" gives a step' \
  diagnose --published "$SRC/data/published/founding_report.toml" --row nope
expect_error "diagnose: --published and --run" "diagnose one or the other" \
  diagnose --published "$SRC/data/published/founding_report.toml" --run "$SRC/data/runs/h200-sxm/2026-12-01_peers_deepspeed_1gpu_omp1.jsonl"
expect_error "diagnose: --all without --run" "--all takes every configuration" diagnose "${DS2[@]}" --step-s 1 --all
expect_error "diagnose: --row without --published" "--row names rows of --published" diagnose "${DS2[@]}" --step-s 1 --row x
expect_error "diagnose: --leave-one-out with one run" "--leave-one-out needs several runs" diagnose "${DS2[@]}" --step-s 1 --leave-one-out
expect_error "diagnose: published rows without phases" "llm_foundry.toml: no row gives a step, GAS or OPT time" \
  diagnose --published "$SRC/data/published/llm_foundry.toml"
expect_error "diagnose: several configurations" "holds 3 configurations: name one with --key" \
  diagnose --run "$SRC/data/runs/h100-sxm/2026-12-06_diagnose_slow_cpu_deepspeed_1gpu.jsonl"
expect_error "diagnose: a launcher config" "diagnose writes no launcher config" \
  diagnose "${DS2[@]}" --step-s 1 --deepspeed-config "$TMP/never.json"
[[ -e "$TMP/never.json" ]] && bad "diagnose wrote a launcher config" || ok
expect_error "bad --speed resource" '--speed "cpu=0.5" is not RESOURCE=X' explain --model 2.8b --speed cpu=0.5
expect_error "bad --speed factor" '--speed "gpu=0": the factor must be a number in \[1/64, 64\]' explain --model 2.8b --speed gpu=0
expect_error "bad --speed text" '--speed "gpu=fast"' recommend --model 2.8b --speed gpu=fast
expect_error "validate --speed" "validate measures this machine" validate --model 2.8b --speed gpu=0.5

# A sequence beyond the model's trained context (llama-2-7b's config.json: max_position_embeddings
# 4096, rotary): one note line and a JSON flag, not an error; at 4096 neither. MPT-7B (learned
# table of 2048 rows) is flagged too.
"$PLANNER" explain --model 7b --gpus 2 --seq 8192 --checkpointing on >"$TMP/ctx.txt" 2>&1
grep -q "^note: seq 8192 is beyond llama-2-7b's trained context (max_position_embeddings 4096).*rope_scaling" "$TMP/ctx.txt" && ok || bad "trained context note: $(head -3 "$TMP/ctx.txt")"
"$PLANNER" explain --model 7b --gpus 2 --seq 4096 --checkpointing on | grep -q "trained context" && bad "trained context note at 4096" || ok
"$PLANNER" explain --model 7b --gpus 2 --seq 8192 --checkpointing on --json | python3 -c "import json,sys; assert json.load(sys.stdin)['plans'][0]['beyond_trained_context'] is True" && ok || bad "trained context JSON at 8192"
"$PLANNER" explain --model 7b --gpus 2 --seq 4096 --checkpointing on --json | python3 -c "import json,sys; assert json.load(sys.stdin)['plans'][0]['beyond_trained_context'] is False" && ok || bad "trained context JSON at 4096"
"$PLANNER" explain --model mpt-7b --gpus 8 --seq 4096 --stage 3 --checkpointing on | grep -q "learned position table" && ok || bad "trained context note, learned table"
expect_error "negative train tokens" "--train-tokens -5.* must be positive" compare --model 7b --train-tokens -5

# FSDP2 with parameter offload on one GPU: the blocking uploads are named with their seconds; on
# two GPUs they are not.
"$PLANNER" explain --model 2.8b --gpus 1 --engine fsdp2 --stage 3 --offload-optimizer cpu --offload-params cpu --micro-batch 4 --hardware h100-sxm | grep -Eq "^note: FSDP2 on one GPU uploads each layer's parameters with a blocking copy .* [0-9]+\.[0-9]{3} s of this step" && ok || bad "FSDP2 one-GPU blocking uploads note"
"$PLANNER" explain --model 2.8b --gpus 2 --engine fsdp2 --stage 3 --offload-optimizer cpu --offload-params cpu --micro-batch 4 | grep -q "blocking copy" && bad "blocking uploads note on two GPUs" || ok

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
