#!/usr/bin/env bash
# Read-only audit of a real GPU host, as run through the device tool on the H200 machine:
# link readings from nvidia-smi taken right before and after a capture of the PCI tree
# (tests/tools/capture_pci_tree.py), then playbooks/audit.yml with -c local and the bandwidth
# probe. Never writes config space, binds, resets or changes a GPU setting.
# Needs ansible-core and resolvelib wheels in .whl/ (no package index on that machine).
#   usage (from the repo root): OUT=/some/dir tests/tools/device_audit.sh
set -u
export PYTHONUNBUFFERED=1 LC_ALL=C.UTF-8 LANG=C.UTF-8
OUT=${OUT:?set OUT to the output directory}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH="/tmp/site/bin:$PATH"
mkdir -p .collections/ansible_collections/gpufleet
ln -sfn ../../.. .collections/ansible_collections/gpufleet/inference
res="$OUT/work"
mkdir -p "$res"
q=pci.bus_id,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,pcie.link.gen.gpumax,pcie.link.gen.hostmax
nvidia-smi --query-gpu=$q --format=csv > "$res/nvidia-smi-link-before.csv"
python3 tests/tools/capture_pci_tree.py --name gpu-h200-microvm --out "$res" \
    --note "device tool H200 microVM (Firecracker): one H200 directly on bus 0, no root port or switch" > "$res/capture.log" 2>&1
nvidia-smi --query-gpu=$q --format=csv > "$res/nvidia-smi-link-after.csv"
nvidia-smi -q -d PCIE > "$res/nvidia-smi-q-pcie.txt" 2>&1
nvidia-smi topo -m > "$res/nvidia-smi-topo.txt" 2>&1
nvidia-smi -L > "$res/nvidia-smi-L.txt" 2>&1
start=$(date +%s.%N)
python3 -m ansible.cli.playbook -c local -i localhost, playbooks/audit.yml \
    -e "gpufleet_report_dir=$res/audit" -e audit_bandwidth_probe=true \
    -e "ansible_python_interpreter=$(command -v python3)" > "$res/audit-playbook.log" 2>&1
echo "audit.yml rc=$? in $(python3 -c "import time;print(round(time.time()-$start,1))") s" | tee -a "$res/audit-playbook.log"
tail -25 "$res/audit-playbook.log"
cat "$res/nvidia-smi-link-before.csv" "$res/nvidia-smi-link-after.csv"
tar -C "$res" -czf "$OUT/device-audit.tar.gz" .
rm -rf "$res"
