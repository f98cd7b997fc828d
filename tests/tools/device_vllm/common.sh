# shellcheck shell=bash
# sourced by tests/tools/device_h200_vllm.sh on the device: NVLink multicast off (kept off on these machines), the
# hub offline (the machine reaches nothing), vLLM from the unpacked payload
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/site
