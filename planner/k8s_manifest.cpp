#include "planner/k8s_manifest.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/units.h"
#include "planner/deepspeed_config.h"

namespace stepcast {

std::string gpu_product_label(const std::string& gpu_name) {
  std::string out;
  for (char c : gpu_name) out += c == ' ' ? '-' : c;
  return out;
}

void size_pod(const Prediction& plan, double cores_per_gpu, ManifestRequest& req) {
  constexpr double kProcessBytes = 8 * kBytesPerGiB;  // the process, CUDA context and data loader
  if (req.shm_bytes <= 0) req.shm_bytes = 16 * kBytesPerGiB;
  const double need = plan.memory.host_node_total_bytes + req.shm_bytes + kProcessBytes;
  req.pod_memory_bytes = std::ceil(need / kBytesPerGiB) * kBytesPerGiB;
  req.pod_cpu_cores = std::max(1.0, std::floor(cores_per_gpu * plan.config.gpus_per_node));
}

namespace {

// A YAML double-quoted scalar: JSON's string escaping is valid YAML.
std::string q(const std::string& s) { return nlohmann::json(s).dump(); }

std::string gib(double bytes) { return std::to_string(static_cast<long long>(std::llround(bytes / kBytesPerGiB))) + "Gi"; }

// Appends `text` as a YAML literal block, each line indented by `indent` spaces.
void block(std::ostringstream& o, const std::string& text, int indent) {
  std::istringstream in(text);
  std::string line;
  const std::string pad(indent, ' ');
  while (std::getline(in, line)) o << pad << line << "\n";
}

void replica(std::ostringstream& o, const char* role, int replicas, const ManifestRequest& req,
             const std::string& command, const std::vector<std::string>& args, const std::string& config_map,
             int gpus_per_pod, const std::string& data_claim) {
  o << "    " << role << ":\n";
  o << "      replicas: " << replicas << "\n";
  o << "      restartPolicy: OnFailure\n";
  o << "      template:\n";
  o << "        metadata:\n";
  o << "          labels:\n";
  o << "            app.kubernetes.io/name: stepcast\n";
  o << "        spec:\n";
  o << "          affinity:\n";
  o << "            nodeAffinity:\n";
  o << "              requiredDuringSchedulingIgnoredDuringExecution:\n";
  o << "                nodeSelectorTerms:\n";
  o << "                - matchExpressions:\n";
  o << "                  - key: nvidia.com/gpu.product\n";
  o << "                    operator: In\n";
  o << "                    values: [" << q(req.gpu_product) << "]\n";
  o << "          containers:\n";
  o << "          - name: pytorch\n";
  o << "            image: " << q(req.image) << "\n";
  o << "            command: [" << q(command) << "]\n";
  o << "            args:\n";
  for (const std::string& a : args) o << "            - " << q(a) << "\n";
  o << "            env:\n";
  o << "            - name: NCCL_DEBUG\n";
  o << "              value: \"WARN\"\n";
  o << "            - name: TORCH_NCCL_ASYNC_ERROR_HANDLING\n";
  o << "              value: \"1\"\n";
  if (req.gpu_expandable_segments) {
    // The caching allocator the plan's memory was predicted for (--gpu-allocator expandable).
    o << "            - name: PYTORCH_CUDA_ALLOC_CONF\n";
    o << "              value: \"expandable_segments:True\"\n";
  }
  if (req.cpu_threads_per_rank > 0) {
    // The peer's CPU optimizer threads the plan was predicted with (torchrun would set 1).
    o << "            - name: OMP_NUM_THREADS\n";
    o << "              value: " << q(std::to_string(req.cpu_threads_per_rank)) << "\n";
  }
  o << "            resources:\n";
  for (const char* kind : {"requests", "limits"}) {
    o << "              " << kind << ":\n";
    o << "                cpu: " << q(std::to_string(static_cast<long long>(req.pod_cpu_cores))) << "\n";
    o << "                memory: " << q(gib(req.pod_memory_bytes)) << "\n";
    o << "                nvidia.com/gpu: " << q(std::to_string(gpus_per_pod)) << "\n";
  }
  o << "            volumeMounts:\n";
  o << "            - name: plan\n";
  o << "              mountPath: /etc/stepcast\n";
  o << "              readOnly: true\n";
  o << "            - name: dshm\n";
  o << "              mountPath: /dev/shm\n";
  o << "            - name: data\n";
  o << "              mountPath: /data\n";
  o << "          volumes:\n";
  o << "          - name: plan\n";
  o << "            configMap:\n";
  o << "              name: " << q(config_map) << "\n";
  o << "          - name: dshm\n";
  o << "            emptyDir:\n";
  o << "              medium: Memory\n";
  o << "              sizeLimit: " << q(gib(req.shm_bytes)) << "\n";
  o << "          - name: data\n";
  o << "            persistentVolumeClaim:\n";
  o << "              claimName: " << q(data_claim) << "\n";
}

}  // namespace

std::string k8s_manifest_yaml(const ModelSpec& model, const Prediction& plan, const ManifestRequest& req) {
  // A DNS-1123 label: lower-case letters, digits and '-', starting and ending alphanumeric.
  const auto alnum = [](char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9'); };
  const std::string& n = req.job_name;
  const bool label = !n.empty() && n.size() <= 50 && alnum(n.front()) && alnum(n.back()) &&
                     std::all_of(n.begin(), n.end(), [&](char ch) { return alnum(ch) || ch == '-'; });
  if (!label)
    throw InputError("--job-name \"" + req.job_name +
                     "\" is not a Kubernetes name (lower-case letters, digits and '-', at most 50 characters)");
  if (req.image.empty()) throw InputError("--image is empty");
  const TrainConfig& c = plan.config;
  const std::string config_map = req.job_name + "-plan";
  const std::string data_claim = req.data_claim.empty() ? req.job_name + "-data" : req.data_claim;
  if (req.steps < 1) throw InputError("the manifest's plan has no steps (--train-tokens)");
  const bool deepspeed = c.engine == Engine::kDeepSpeed, fsdp2 = c.engine == Engine::kFsdp2;
  // The launcher: torchrun with the pod's rank and rendezvous, or for FSDP2 accelerate launch.
  const std::string command = fsdp2 ? "accelerate" : "torchrun";
  std::vector<std::string> args;
  if (fsdp2) {
    // The user's training script under Accelerate with the FSDP2 YAML we write; the pod's rank and
    // rendezvous override the YAML's single-machine keys (accelerate launch's flags).
    args = {"launch",
            "--config_file",
            "/etc/stepcast/fsdp_config.yaml",
            "--num_processes=" + std::to_string(c.world_size()),
            "--num_machines=" + std::to_string(c.nodes),
            "--machine_rank=$(RANK)",
            "--main_process_ip=$(MASTER_ADDR)",
            "--main_process_port=$(MASTER_PORT)",
            "train.py"};
  } else {
    args = {"--nproc-per-node=" + std::to_string(c.gpus_per_node), "--nnodes=" + std::to_string(c.nodes),
            "--node-rank=$(RANK)", "--master-addr=$(MASTER_ADDR)", "--master-port=$(MASTER_PORT)"};
  }
  if (deepspeed) {
    // The user's Hugging Face Trainer script in the image, with the DeepSpeed JSON we write.
    for (const char* a : {"train.py", "--deepspeed", "/etc/stepcast/ds_config.json"}) args.push_back(a);
  } else if (!fsdp2) {
    // Our backend's train with the plan.
    for (const char* a : {"--no-python", "train", "--plan", "/etc/stepcast/plan.json", "--device", "cuda"}) args.push_back(a);
    for (const std::string& a : {std::string("--model"), model.name, std::string("--hardware"), req.hardware,
                                 std::string("--steps"), std::to_string(req.steps), std::string("--data"),
                                 std::string("/data/train.txt"), std::string("--save"), std::string("/data/checkpoint")})
      args.push_back(a);
  }
  std::ostringstream o;
  o << "# Stepcast plan for " << model.name << ": " << family_name(c) << ", micro-batch " << c.micro_batch << ", GAS "
    << c.gas << ", " << c.nodes << " pod(s) x " << c.gpus_per_node << " GPU(s).\n";
  o << "# The operator (Kubeflow training-operator) gives each pod RANK (its index), MASTER_ADDR and\n"
       "# MASTER_PORT; torchrun (Accelerate for FSDP2) starts one rank per GPU. Before applying (kubectl apply -f this file),\n"
       "# create the PersistentVolumeClaim \"" << data_claim << "\" (ReadWriteMany) holding train.txt; the\n"
       "# checkpoint is written beside it.\n";
  o << "apiVersion: v1\n";
  o << "kind: ConfigMap\n";
  o << "metadata:\n";
  o << "  name: " << q(config_map) << "\n";
  o << "data:\n";
  o << "  plan.json: |\n";
  block(o, req.plan_json, 4);
  if (deepspeed) {
    o << "  ds_config.json: |\n";
    block(o, deepspeed_config(model, c).deepspeed.dump(2), 4);
  }
  if (fsdp2) {
    o << "  fsdp_config.yaml: |\n";
    block(o, accelerate_fsdp_yaml(model, c), 4);
  }
  o << "---\n";
  o << "apiVersion: kubeflow.org/v1\n";
  o << "kind: PyTorchJob\n";
  o << "metadata:\n";
  o << "  name: " << q(req.job_name) << "\n";
  o << "  labels:\n";
  o << "    app.kubernetes.io/name: stepcast\n";
  o << "spec:\n";
  o << "  runPolicy:\n";
  o << "    cleanPodPolicy: None\n";
  o << "    backoffLimit: 3\n";
  o << "  pytorchReplicaSpecs:\n";
  // Our backend sizes its own CPU threads; only a peer's launch carries OMP_NUM_THREADS.
  ManifestRequest pod = req;
  if (c.engine == Engine::kStepcast || c.offload_optimizer == OffloadDevice::kNone) pod.cpu_threads_per_rank = 0;
  // Our backend sets its allocator from the plan (train --gpu-allocator); a peer reads the variable.
  pod.gpu_expandable_segments = c.gpu_expandable_segments && c.engine != Engine::kStepcast;
  replica(o, "Master", 1, pod, command, args, config_map, c.gpus_per_node, data_claim);
  if (c.nodes > 1) replica(o, "Worker", c.nodes - 1, pod, command, args, config_map, c.gpus_per_node, data_claim);
  return o.str();
}

}  // namespace stepcast
