#!/usr/bin/env bash
# planner compare --k8s-manifest: the manifest parses as YAML (PyYAML), every document passes the
# Kubernetes schema subset in tests/data/k8s/schema.json (jsonschema), and it says what the chosen
# plan says (GPUs per pod, pods, the plan train reads, the DeepSpeed JSON). A mutated manifest
# must fail the same check.
# Usage: k8s_manifest_test.sh PLANNER
set -euo pipefail
PLANNER="$1"
SRC="$(cd "$(dirname "$0")/.." && pwd)"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
PY=""
for p in python3 /usr/bin/python3; do
  if "$p" -c "import yaml, jsonschema" 2>/dev/null; then PY="$p"; break; fi
done
[[ -n "$PY" ]] || { echo "FAIL: no python3 with yaml and jsonschema (scripts/setup.sh installs python3-yaml, python3-jsonschema)"; exit 1; }

check() {  # check NAME COMPARE-ARGS... : writes the manifest and the JSON, then checks them
  local name="$1"
  shift
  "$PLANNER" compare "$@" --json --k8s-manifest "$TMP/$name.yaml" >"$TMP/$name.json"
  "$PY" - "$TMP/$name.yaml" "$TMP/$name.json" "$SRC/tests/data/k8s/schema.json" <<'PYEOF'
import json, sys, yaml, jsonschema
manifest, report, schema = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
docs = [d for d in yaml.safe_load_all(open(manifest)) if d is not None]
assert [d["kind"] for d in docs] == ["ConfigMap", "PyTorchJob"], [d["kind"] for d in docs]
for d in docs:
    jsonschema.validate(d, schema)
row = report["rows"][report["k8s_manifest"]["row"]]
cm, job = docs
specs = job["spec"]["pytorchReplicaSpecs"]
nodes = row["nodes"]
assert specs["Master"]["replicas"] == 1
assert (specs.get("Worker", {}).get("replicas", 0)) == nodes - 1, (specs.keys(), nodes)
for role, spec in specs.items():
    pod = spec["template"]["spec"]
    c = pod["containers"][0]
    assert c["name"] == "pytorch"  # the training operator's container name
    assert c["resources"]["limits"]["nvidia.com/gpu"] == str(row["gpus_per_node"])
    assert c["resources"]["requests"] == c["resources"]["limits"]
    if row["config"].get("engine", "stepcast") == "fsdp2":
        # Accelerate with our FSDP2 YAML: every rank of every pod, this pod's rank.
        assert c["command"] == ["accelerate"] and c["args"][:3] == ["launch", "--config_file", "/etc/stepcast/fsdp_config.yaml"]
        assert "--num_processes=%d" % (row["gpus_per_node"] * nodes) in c["args"]
        assert "--num_machines=%d" % nodes in c["args"] and "--machine_rank=$(RANK)" in c["args"]
    else:
        assert c["command"] == ["torchrun"]
        assert "--nproc-per-node=%d" % row["gpus_per_node"] in c["args"]
        assert "--nnodes=%d" % nodes in c["args"]
    if "--steps" in c["args"]:
        # One pass over the training tokens at the plan's own global batch (with --global-batch 0
        # the one its search chose), by hand: ceil(tokens / (micro-batch x GAS x ranks x sequence)).
        cfg = row["config"]
        want = -(-int(report["train_tokens"]) // (cfg["micro_batch"] * cfg["gas"] * cfg["world_size"] * cfg["seq_len"]))
        got = int(c["args"][c["args"].index("--steps") + 1])
        assert got == want, (got, want)
    mem_gi = int(c["resources"]["limits"]["memory"][:-2])
    shm_gi = int([v for v in pod["volumes"] if v["name"] == "dshm"][0]["emptyDir"]["sizeLimit"][:-2])
    assert mem_gi > shm_gi  # /dev/shm counts against the pod's memory
plan = json.loads(cm["data"]["plan.json"])
assert plan["plans"][0]["config"] == row["config"], (plan["plans"][0]["config"], row["config"])
if row["config"].get("engine", "stepcast") == "deepspeed":
    ds = json.loads(cm["data"]["ds_config.json"])
    assert ds["train_micro_batch_size_per_gpu"] == row["config"]["micro_batch"]
    assert ds["gradient_accumulation_steps"] == row["config"]["gas"]
if row["config"].get("engine", "stepcast") == "fsdp2":
    fsdp = yaml.safe_load(cm["data"]["fsdp_config.yaml"])
    assert fsdp["distributed_type"] == "FSDP" and fsdp["num_processes"] == row["gpus_per_node"] * nodes, fsdp
# The same check fails on a broken manifest: a misspelt field, a quantity with a space.
bad = json.loads(json.dumps(job))
bad["spec"]["pytorchReplicaSpecs"]["Master"]["replicass"] = 1
try:
    jsonschema.validate(bad, schema); raise SystemExit("FAIL: a misspelt field passed the schema")
except jsonschema.ValidationError:
    pass
bad = json.loads(json.dumps(job))
bad["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] = "8 GiB"
try:
    jsonschema.validate(bad, schema); raise SystemExit("FAIL: a malformed quantity passed the schema")
except jsonschema.ValidationError:
    pass
print("ok", manifest, row["hardware"], "x%d" % row["gpus"], row["plan"])
PYEOF
}

# The issue's example: 6b over every priced kind; the manifest of its cheapest plan.
check cheapest --model 6b --train-tokens 1e9
# Several pods: 70b on H100s, the fastest plan within a large budget (the most GPUs).
check nodes --model 70b --hardware h100-sxm --max-gpus 32 --train-tokens 1e9 --budget-usd 1e9
# A DeepSpeed plan: the ConfigMap carries the DeepSpeed JSON.
check deepspeed --model 7b --hardware a100-80gb-sxm --engine deepspeed --train-tokens 1e8 --max-gpus 8
# An FSDP2 plan: Accelerate launches the user's script with the FSDP2 YAML from the ConfigMap.
check fsdp2 --model 7b --hardware a100-80gb-sxm --engine fsdp2 --train-tokens 1e8 --max-gpus 8
# A free global batch (0): the steps come from the chosen plan's own micro-batch x GAS x ranks.
check free_batch --model 7b --hardware a100-40gb-sxm --max-gpus 16 --global-batch 0 --train-tokens 1e9
echo "k8s_manifest_test: all passed"
