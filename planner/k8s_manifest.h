// The Kubernetes manifest for a plan: a ConfigMap with the plan (and the DeepSpeed JSON for a
// DeepSpeed plan) and a Kubeflow PyTorchJob (kubeflow.org/v1) with one pod per node.
#pragma once

#include <string>

#include "model/model_spec.h"
#include "model/prediction.h"

namespace stepcast {

struct ManifestRequest {
  std::string job_name = "stepcast-finetune";  // a DNS-1123 label: [a-z0-9-], at most 50 characters
  std::string image = "stepcast:latest";       // the container image with train (or the DeepSpeed script)
  std::string gpu_product;     // the GPU's name, as NVIDIA GPU feature discovery labels nodes
  double pod_cpu_cores = 0;    // CPU cores the pod requests (the plan's CPU optimizer threads and more)
  double pod_memory_bytes = 0; // host memory the pod requests, /dev/shm included
  double shm_bytes = 0;        // size of the in-memory /dev/shm volume (NCCL, data loaders)
  std::string plan_json;       // the planner JSON train --plan reads (explain/recommend --json)
  std::string hardware;        // the profile train predicts with
  int64_t steps = 0;           // optimizer steps of the whole fine-tune
  std::string data_claim;      // PersistentVolumeClaim with train.txt, and room for the checkpoint; empty: <job>-data
  bool gpu_expandable_segments = false;  // PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (a peer's plan)
  int cpu_threads_per_rank = 0;  // DeepSpeed: OMP_NUM_THREADS of each rank (0: torchrun's default, one)
};

// The node label value for a GPU name: NVIDIA GPU feature discovery's nvidia.com/gpu.product,
// the product name with spaces as dashes ("NVIDIA H100 80GB HBM3" -> "NVIDIA-H100-80GB-HBM3").
std::string gpu_product_label(const std::string& gpu_name);

// Host resources a pod of this plan asks for: the predicted host memory of the node (optimizer
// states, pinned buffers) plus `shm_bytes` and 8 GiB for the process and data loader, rounded
// up to whole GiB; cores: the profile's cores per GPU x GPUs per node (the CPU optimizer uses
// them all when it offloads). Writes both into `req`.
void size_pod(const Prediction& plan, double cores_per_gpu, ManifestRequest& req);

// The YAML (two documents). Throws InputError for a job name Kubernetes would refuse.
std::string k8s_manifest_yaml(const ModelSpec& model, const Prediction& plan, const ManifestRequest& req);

}  // namespace stepcast
