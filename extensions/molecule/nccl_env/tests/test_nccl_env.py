"""testinfra checks for the nccl_env scenario: the files, their modes and content, NVLink
multicast off, the consumer unit's live environment, and the A/B record on a host without GPUs."""

from __future__ import annotations

import json

testinfra_hosts = ["podman://gpufleet-nccl-bookworm", "podman://gpufleet-nccl-trixie"]

PCIE_SAFE_CONF = ["NCCL_DEBUG=WARN", "NCCL_IB_DISABLE=1", "NCCL_NVLS_ENABLE=0", "NCCL_P2P_LEVEL=PXB", "NCCL_PROTO=^LL128"]
# p2p_off with NCCL_SOCKET_IFNAME, NCCL_BUFFSIZE 8M, NCCL_ALGO ring, NCCL_PROTO removed, NCCL_DEBUG INFO
P2P_OFF_CONF = ["NCCL_ALGO=Ring", "NCCL_BUFFSIZE=8388608", "NCCL_DEBUG=INFO", "NCCL_IB_DISABLE=1", "NCCL_NVLS_ENABLE=0",
                "NCCL_P2P_DISABLE=1", "NCCL_SOCKET_IFNAME=^docker,lo"]


def _is_bookworm(host):
    return host.backend.get_hostname() == "gpufleet-nccl-bookworm"


def _settings(text):
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


def _managed(f):
    assert f.exists and f.is_file
    assert f.user == "root" and f.group == "root" and f.mode == 0o644
    assert f.content_string.startswith("# Managed by Ansible (gpufleet.inference.nccl_env, profile ")


def test_nccl_conf(host):
    f = host.file("/etc/nccl.conf")
    _managed(f)
    expected = PCIE_SAFE_CONF if _is_bookworm(host) else P2P_OFF_CONF
    assert _settings(f.content_string) == expected


def test_environment_file(host):
    f = host.file("/etc/gpufleet/nccl.env")
    _managed(f)
    conf = PCIE_SAFE_CONF if _is_bookworm(host) else P2P_OFF_CONF
    assert _settings(f.content_string) == sorted(conf + ["CUDA_DEVICE_ORDER=PCI_BUS_ID"])
    d = host.file("/etc/gpufleet")
    assert d.is_directory and d.mode == 0o755


def test_consumer_unit_runs_with_the_new_environment(host):
    if not _is_bookworm(host):
        return
    svc = host.service("gpufleet-nccl-consumer.service")
    assert svc.is_running
    pid = host.check_output("systemctl show -p MainPID --value gpufleet-nccl-consumer.service")
    environ = host.file(f"/proc/{pid}/environ").content.split(b"\0")
    for line in PCIE_SAFE_CONF + ["CUDA_DEVICE_ORDER=PCI_BUS_ID"]:
        assert line.encode() in environ
    # restarted exactly once by the handler, not on the idempotence run
    restarts = host.check_output("journalctl -u gpufleet-nccl-consumer.service -o cat --no-pager | grep -c '^Started' || true")
    assert restarts.strip() == "2", "started by prepare, restarted once by the role"


def test_ab_record_on_a_host_without_gpus(host):
    record = host.file("/var/lib/gpufleet/nccl/ab.json")
    if not _is_bookworm(host):
        assert not record.exists
        return
    assert record.user == "root" and record.mode == 0o644
    data = json.loads(record.content_string)
    assert data["skipped"] == "A/B skipped: 0 GPU(s)"
    assert data["gpus"] == 0 and data["decision"] is None and data["results"] == {}
    assert set(data["candidates"]) == {"p2p_on", "p2p_off"}
    assert data["candidates"]["p2p_off"]["NCCL_P2P_DISABLE"] == "1"
    assert all(c["NCCL_NVLS_ENABLE"] == "0" for c in data["candidates"].values())
    assert len(data["key"]) == 16 and data["measured_at"].endswith("Z")
