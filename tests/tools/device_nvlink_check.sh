#!/usr/bin/env bash
# Read-only: what NVML says is at the far end of each GPU's NVLinks, and the audit (pcie_facts
# with NVML) next to nvidia-smi topo -m. Run through the device tool on a multi-GPU host:
#   OUT=/some/dir tests/tools/device_nvlink_check.sh
set -u
export PYTHONUNBUFFERED=1 LC_ALL=C.UTF-8 LANG=C.UTF-8 NCCL_NVLS_ENABLE=0
OUT=${OUT:?set OUT to the output directory}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH="/tmp/site/bin:$PATH"
mkdir -p .collections/ansible_collections/gpufleet
ln -sfn ../../.. .collections/ansible_collections/gpufleet/inference
python3 - <<'PY' | tee "$OUT/nvlink-remote.json"
import json, pynvml as nv
nv.nvmlInit()
out = {}
for i in range(nv.nvmlDeviceGetCount()):
    h = nv.nvmlDeviceGetHandleByIndex(i)
    links = []
    for link in range(18):
        try:
            if not nv.nvmlDeviceGetNvLinkState(h, link):
                continue
            bus = nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId
            try:
                kind = nv.nvmlDeviceGetNvLinkRemoteDeviceType(h, link)
            except Exception as err:
                kind = "error: %s" % err
            links.append({"link": link, "bus": bus.decode() if isinstance(bus, bytes) else bus, "type": kind})
        except Exception as err:
            links.append({"link": link, "error": str(err)})
            break
    out[i] = links
print(json.dumps(out))
nv.nvmlShutdown()
PY
nvidia-smi topo -m
python3 -m ansible.cli.playbook -c local -i localhost, playbooks/audit.yml -e "gpufleet_report_dir=$OUT/audit" \
    -e "ansible_python_interpreter=$(command -v python3)" > "$OUT/audit-playbook.log" 2>&1
echo "audit.yml rc=$?"
cat "$OUT/audit/fleet.md"
