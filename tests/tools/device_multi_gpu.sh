#!/usr/bin/env bash
# Read-only run on a real multi-GPU host through the device tool (issue 9):
#   1. nvidia-smi's view: GPUs, topo -m, the P2P matrices (read, write, nvlink, atomics), NVLink
#      state and PCIe link readings;
#   2. a capture of the PCI tree (tests/tools/capture_pci_tree.py) as a test fixture;
#   3. playbooks/audit.yml -c local (pcie_facts with NVML: pair levels and P2P status);
#   4. the nccl_env role's P2P A/B (pcie_safe profile, P2P on vs off, all-reduce 8 MiB..512 MiB),
#      writing only under the output directory (tests/tools/nccl_ab_local.yml);
#   5. the bench on four environments: NCCL defaults, defaults with P2P off, pcie_safe with P2P on
#      and pcie_safe with P2P off.
# Never writes config space, binds, resets or changes a GPU setting; NVLink multicast stays off.
# Needs ansible-core and resolvelib wheels in .whl/ (no package index on that machine).
#   usage (from the repo root): OUT=/some/dir tests/tools/device_multi_gpu.sh NAME
set -u
export PYTHONUNBUFFERED=1 LC_ALL=C.UTF-8 LANG=C.UTF-8
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:?set OUT to the output directory}
name=${1:-gpu-h200-x2}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH="/tmp/site/bin:$PATH"
mkdir -p .collections/ansible_collections/gpufleet
ln -sfn ../../.. .collections/ansible_collections/gpufleet/inference
export ANSIBLE_COLLECTIONS_PATH="$PWD/.collections"
res="$OUT/work"
mkdir -p "$res/nvidia-smi"
stamp() { echo "== $(date -u +%H:%M:%S) $*"; }

stamp "nvidia-smi"
q=pci.bus_id,name,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max
nvidia-smi --query-gpu=$q --format=csv > "$res/nvidia-smi/link.csv"
nvidia-smi -L > "$res/nvidia-smi/L.txt" 2>&1
nvidia-smi topo -m > "$res/nvidia-smi/topo.txt" 2>&1
for m in r w n a p; do nvidia-smi topo -p2p $m > "$res/nvidia-smi/p2p-$m.txt" 2>&1; done
nvidia-smi nvlink -s > "$res/nvidia-smi/nvlink-s.txt" 2>&1
nvidia-smi -q -d PCIE > "$res/nvidia-smi/q-pcie.txt" 2>&1
cat "$res/nvidia-smi/L.txt" "$res/nvidia-smi/topo.txt" "$res/nvidia-smi/p2p-r.txt" "$res/nvidia-smi/link.csv"
uname -r; nproc

stamp "capture"
python3 tests/tools/capture_pci_tree.py --name "$name" --out "$res/capture" \
    --note "device tool, 2x H200 host ($(uname -r)), read-only capture" > "$res/capture.log" 2>&1
echo "capture rc=$?"; tail -3 "$res/capture.log"

stamp "audit.yml"
python3 -m ansible.cli.playbook -c local -i localhost, playbooks/audit.yml \
    -e "gpufleet_report_dir=$res/audit" -e audit_bandwidth_probe=true \
    -e "ansible_python_interpreter=$(command -v python3)" > "$res/audit-playbook.log" 2>&1
echo "audit.yml rc=$?"; tail -6 "$res/audit-playbook.log"

stamp "nccl_env role A/B"
python3 -m ansible.cli.playbook -c local -i localhost, tests/tools/nccl_ab_local.yml \
    -e "nccl_ab_dir=$res/nccl-role" -e "ansible_python_interpreter=$(command -v python3)" \
    > "$res/nccl-role-playbook.log" 2>&1
echo "nccl role rc=$?"; grep -A3 "Report the A/B" "$res/nccl-role-playbook.log" | tail -3; tail -4 "$res/nccl-role-playbook.log"

stamp "four environments"
cands=$(python3 - <<'PY'
import json, sys
sys.path.insert(0, ".collections")
from ansible_collections.gpufleet.inference.plugins.module_utils.nccl import env as n
safe = n.resolve("pcie_safe")
print(json.dumps({
    "nccl_defaults": {},
    "nccl_defaults_p2p_off": {"NCCL_P2P_DISABLE": "1"},
    "pcie_safe_p2p_on": n.with_p2p(safe, "p2p_on"),
    "pcie_safe_p2p_off": n.with_p2p(safe, "p2p_off"),
}))
PY
)
echo "$cands"
python3 roles/nccl_env/files/nccl_ab_bench.py --candidates "$cands" --tool torch --python python3 \
    --min-bytes 8388608 --max-bytes 536870912 --timeout 240 > "$res/nccl-four.json" 2> "$res/nccl-four.err"
echo "four rc=$?"; tail -c 3000 "$res/nccl-four.json"; tail -5 "$res/nccl-four.err"

stamp "done"
tar -C "$res" -czf "$OUT/multi-gpu.tar.gz" .
