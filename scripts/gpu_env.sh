# Sourced by the GPU scripts: paths of the GPU machine's torch, NCCL and the unpacked .deps.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
DEPS=/tmp/deps
TORCH_CMAKE=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
NCCL_ROOT=$(python3 -c 'import nvidia.nccl,os;print(nvidia.nccl.__path__[0])')
TORCH_LIB=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')
export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu:$NCCL_ROOT/lib:$TORCH_LIB:${LD_LIBRARY_PATH:-}"
