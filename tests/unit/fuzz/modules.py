# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the fuzz suite knows of each module: a tree to run on and arguments that make a sound call (``base``), and the
state files it keeps or reads (``state``), which the suite corrupts.

Trees come from the existing test builders: the first YAML case of a module that has a YAML case file (uthelper's
``setup`` and ``input``), fakesysfs' hosts for the sysfs modules. Every path argument points into the root.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ansible_collections.gpufleet.inference.plugins.filter.nccl_env import FilterModule
from ansible_collections.gpufleet.inference.plugins.modules import (
    bench_history, cpu_placement, cpu_tuning, driver_hold, driver_reload, driver_upgrade_preflight, driver_upgrade_step,
    driver_verify, gpu_health, host_lease, host_lint, hugepages, inference_benchmark, irq_affinity,
    kernel_boot_entry, kernel_boot_health, kernel_cmdline, kernel_cmdline_info, kernel_rollout_step, kernel_upgrade_preflight,
    maintenance_gate, metrics_textfile, nccl_change_step, nccl_env_files, pcie_acs, pcie_aspm, pcie_facts, pcie_payload, output_equivalence,
    throughput_gate, tune_measured, vfio_bind, vllm_preflight, vllm_ready, vllm_service_files, vllm_upgrade_step,
)
from tests.unit.fakesysfs import FakeHost, cpu_knobs, cpus_online, node_memory, two_gpus_one_switch, two_numa_nodes
from tests.unit.plugins.module_utils.test_vfio import gpu_host
from tests.unit.plugins.modules.uthelper import UTHelper, substitute

HERE = Path(__file__).resolve().parent.parent / "plugins" / "modules"
GPU = "0000:17:00.0"
NCCL = FilterModule().filters()["nccl_env"]("pcie_safe")
TARGET = "6.1.0-56-cloud-amd64"


@dataclass
class Spec:
    module: object
    build: Callable[[Path], None]
    base: Callable[[str], dict]
    state: list[str] = field(default_factory=list)  # host paths (under the root) the suite corrupts
    root_option: bool = True  # False: the module works on / and takes real paths (they point into the root)


class AnyCheck(dict):
    """The YAML cases' own checks are not run here: every name is taken."""

    def __contains__(self, key):
        return True


def yaml_case(module, yaml_name: str, case_id: str, builders=None) -> tuple[Callable, Callable]:
    """(build, base) from one case of a YAML case file: its setup builds the tree, its input is the call."""
    helper = UTHelper(module, str(HERE / yaml_name.replace(".yaml", ".py")), builders=builders or {}, checks=AnyCheck(any=None))
    case = next(c for c in helper.cases if c["id"] == case_id)
    return (lambda root: helper.build(root, substitute(case.get("setup"), str(root))),
            lambda root: dict(substitute(case["input"], root)))


def _vllm_upgrade_baseline(root: Path) -> None:
    """Two finished vLLM venvs, the unit's link on the older, and an upgrade journal at its baseline."""
    from tests.unit.plugins.module_utils.test_vllm_upgrade_step import baseline, venvs  # pylint: disable=import-outside-toplevel
    venvs(root)
    baseline(root)


def _nccl_change_baseline(root: Path) -> None:
    """The NCCL files of pcie_safe, the unit's process environment, and a change journal past its baseline."""
    from tests.unit.plugins.module_utils.test_nccl_change_step import baseline, tree  # pylint: disable=import-outside-toplevel
    baseline(tree(root))


def _builders():
    from tests.unit.plugins.modules.test_host_modules import BUILDERS  # pylint: disable=import-outside-toplevel
    return BUILDERS


def _preflight_builders():
    from tests.unit.plugins.modules.test_vllm_args_preflight import build_proc  # pylint: disable=import-outside-toplevel
    return {"proc": build_proc}


def _driver_builders():
    from tests.unit.plugins.modules.test_driver_modules import BUILDERS  # pylint: disable=import-outside-toplevel
    return BUILDERS


def _driver_host(root: Path) -> None:
    """A Debian host with the driver loaded, a running kernel with its /boot files and a work directory."""
    _driver_builders()["debian"](root)
    for rel, text in (("proc/sys/kernel/osrelease", TARGET + "\n"), (f"boot/vmlinuz-{TARGET}", "k"),
                      (f"boot/initrd.img-{TARGET}", "i" * 4096), (f"lib/modules/{TARGET}/build/Makefile", ""),
                      ("var/tmp/.keep", "")):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def _payload_builders():
    from tests.unit.plugins.modules import test_pcie_payload as t  # pylint: disable=import-outside-toplevel
    return {"payload_switch": t.payload_switch, "tuned_switch": t.tuned_switch}


def _gpu_host(root: Path) -> None:
    host = gpu_host(root)
    node_memory(host, 0, 64 * 1024 * 1024)
    node_memory(host, 1, 64 * 1024 * 1024)


def _switch(root: Path) -> None:
    two_gpus_one_switch(root)


def _aspm(root: Path) -> None:
    path = root / "sys/module/pcie_aspm/parameters/policy"
    path.parent.mkdir(parents=True)
    path.write_text("[default] performance powersave powersupersave\n")


def _cpu_host(root: Path) -> None:
    cpu_knobs(FakeHost(root))
    (root / "dev").mkdir(exist_ok=True)
    (root / "dev/cpu_dma_latency").write_bytes((2_000_000_000).to_bytes(4, "little"))  # the PM QoS device


def _placement_host(root: Path) -> None:
    host = two_numa_nodes(root, remote_irqs=False)
    cpus_online(host, "0-15")
    host.write("/etc/gpufleet/irq_affinity.json", '{"devices": {"%s": {"cpus": "0-1"}}}' % GPU)


def _start_history(root: Path) -> None:
    """An SQLite history of three server starts of one series and a result of no known start."""
    from ansible_collections.gpufleet.inference.plugins.module_utils.bench import history  # pylint: disable=import-outside-toplevel
    from tests.unit.plugins.module_utils.test_start_noise_history import dsv2_documents  # pylint: disable=import-outside-toplevel
    (root / "var/lib/gpufleet").mkdir(parents=True, exist_ok=True)
    db = history.connect(str(root / "var/lib/gpufleet/history.sqlite"))
    try:
        for d in dsv2_documents()[:6]:
            history.append(db, d)
    finally:
        db.close()


def _nothing(root: Path) -> None:
    (root / "etc").mkdir(parents=True, exist_ok=True)


def _copied_guide(root: Path) -> None:
    """A GPU host carrying tuning copied from guides (what host_lint reads)."""
    two_gpus_one_switch(root)
    for rel, text in {"proc/cmdline": "BOOT_IMAGE=/vmlinuz root=/dev/vda1 pci=noacs pcie_aspm=off\n",
                      "etc/default/grub": 'GRUB_CMDLINE_LINUX="pci=noacs iommu=pt"\n',
                      "etc/nccl.conf": "NCCL_P2P_LEVEL=PCI\nNCCL_PROTO=LL\n",
                      "etc/sysctl.d/90-gpu.conf": "vm.nr_hugepages = 64\n",
                      "etc/modprobe.d/nvidia.conf": "options nvidia NVreg_EnablePCIeGen5=1\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def _equivalence_reference(root: Path) -> None:
    path = root / "var/lib/gpufleet/equivalence/reference.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"format": "gpufleet.output_equivalence/1", "model": "tiny", "prompts": []}\n')


def _vllm_files_base(root: str) -> dict:
    from tests.unit.plugins.modules.test_vllm_service_files import template  # pylint: disable=import-outside-toplevel
    return {"root": root, "name": "vllm", "config_dir": "/etc/gpufleet/vllm", "env_content": "HF_HUB_OFFLINE=1\n",
            "unit_content": template(), "nccl_env_file": "/etc/gpufleet/nccl.env"}


def specs(vllm_url: str) -> dict[str, Spec]:
    """Every module with a main() (controller_files is documentation of an action plugin)."""
    lease_build, lease_base = yaml_case(host_lease, "test_host_lease.yaml", "a_free_host_is_acquired", _builders())
    step_build, step_base = yaml_case(kernel_rollout_step, "test_kernel_rollout_step.yaml", "the_baseline_opens_the_journal_on_the_host", _builders())
    health_build, health_base = yaml_case(kernel_boot_health, "test_kernel_boot_health.yaml", "present_writes_the_units_and_the_config_and_enables_the_timer",
                                          _builders())
    hold_build, hold_base = yaml_case(driver_hold, "test_driver_hold.yaml",
                                      "holds_the_kernel_side_the_user_space_and_the_extra_package_and_blacklists_them",
                                      _driver_builders())
    reload_build, reload_base = yaml_case(driver_reload, "test_driver_reload.yaml",
                                          "a_process_holding_the_gpu_refuses_the_reload_and_nothing_runs", _driver_builders())
    pre_build, pre_base = yaml_case(kernel_upgrade_preflight, "test_kernel_upgrade_preflight.yaml", "every_check_passes_before_the_install",
                                    _builders())
    entry_build, entry_base = yaml_case(kernel_boot_entry, "test_kernel_boot_entry.yaml", "pin_the_old_kernel_before_the_install", _builders())
    cmd_build, cmd_base = yaml_case(kernel_cmdline, "test_kernel_cmdline.yaml", "dropin_first_owner_writes_dropin_and_runs_update_grub")
    payload_build, payload_base = yaml_case(pcie_payload, "test_pcie_payload.yaml", "max_safe_sets_the_hierarchy_to_the_peer_limit_and_persists",
                                            _payload_builders())
    vp_build, vp_base = yaml_case(vllm_preflight, "test_vllm_preflight.yaml",
                                  "a_hidden_socket_of_the_service_user_is_ours_while_the_unit_is_active", _preflight_builders())
    return {
        "bench_history": Spec(bench_history, _nothing, lambda r: {"path": f"{r}/var/lib/gpufleet/history.jsonl", "state": "query"},
                              ["/var/lib/gpufleet/history.jsonl"], root_option=False),
        # the module's start_noise state, on a history that gives a figure: a name of its own, the module's before ":"
        "bench_history:start_noise": Spec(bench_history, _start_history, lambda r: {
            "path": f"{r}/var/lib/gpufleet/history.sqlite", "state": "start_noise", "hosts": ["h200-1"],
            "concurrency": 64}, ["/var/lib/gpufleet/history.sqlite"], root_option=False),
        "cpu_placement": Spec(cpu_placement, _placement_host, lambda r: {"root": r, "gpus": [GPU], "unit": "vllm.service"},
                              ["/etc/gpufleet/irq_affinity.json"]),
        "cpu_tuning": Spec(cpu_tuning, _cpu_host, lambda r: {
            "root": r, "governor": "performance", "cstate_max_latency_us": 10, "thp_enabled": "madvise", "persist": False},
            ["/var/lib/gpufleet/cpu_tuning.json", "/etc/gpufleet/cpu_tuning.json",
             "/etc/systemd/system/gpufleet-pm-qos.service", "/dev/cpu_dma_latency"]),
        "driver_hold": Spec(driver_hold, hold_build, hold_base, ["/etc/apt/apt.conf.d/51gpufleet-driver-lock"]),
        "driver_reload": Spec(driver_reload, reload_build, reload_base, ["/proc/driver/nvidia/version"]),
        "driver_upgrade_preflight": Spec(driver_upgrade_preflight, _driver_host, lambda r: {
            "root": r, "packages": ["nvidia-driver", "nvidia-kernel-dkms"], "version": "550.54.15-1", "log_lines": 40},
            ["/proc/driver/nvidia/version", "/proc/sys/kernel/osrelease"]),
        "driver_upgrade_step": Spec(driver_upgrade_step, _driver_host, lambda r: {
            "root": r, "target": "550.54.15-1", "packages": ["nvidia-driver", "nvidia-kernel-dkms"], "activate": "reload",
            "lease_ttl": 7200}, ["/var/lib/gpufleet/driver_upgrade/journal.json", "/proc/driver/nvidia/version"]),
        "driver_verify": Spec(driver_verify, _driver_host, lambda r: {
            "root": r, "include_nvml": "never", "expected_version": "550.54.15", "gpu_vendor": "0x10de"},
            ["/proc/driver/nvidia/version"]),
        "gpu_health": Spec(gpu_health, _gpu_host, lambda r: {"root": r, "dcgm_timeout": 60, "clock_ratio": 0.9}),
        "host_lease": Spec(host_lease, lease_build, lease_base, ["/var/lib/gpufleet/lease.json"]),
        "host_lint": Spec(host_lint, _copied_guide, lambda r: {"root": r}, ["/etc/nccl.conf", "/etc/default/grub", "/proc/cmdline"]),
        "maintenance_gate": Spec(maintenance_gate, _nothing, lambda r: {
            "root": r, "windows": [{"days": ["mon-fri"], "start": "22:00", "end": "04:00"}], "timezone": "UTC",
            "now": 1796400000.0, "refuse": False, "blockers": [{"command": ["true"], "timeout": 5}]}),
        "hugepages": Spec(hugepages, _gpu_host, lambda r: {"root": r, "pages_2m": 16}),
        "inference_benchmark": Spec(inference_benchmark, _nothing, lambda r: {
            "url": vllm_url, "model": "tiny", "requests": 2, "warmup": 0, "repetitions": 1, "settle_runs": 1, "concurrency": [1],
            "timeout": 2.0, "deadline": 5.0, "monitor_load": False, "prompt_tokens": 8, "output_tokens": 2,
            "results_dir": f"{r}/var/lib/gpufleet/bench"}, root_option=False),
        "irq_affinity": Spec(irq_affinity, _gpu_host, lambda r: {"root": r, "devices": [GPU]}),
        "kernel_boot_entry": Spec(kernel_boot_entry, entry_build, entry_base, ["/boot/grub/grubenv", "/boot/grub/grub.cfg"]),
        "kernel_boot_health": Spec(kernel_boot_health, health_build, health_base),
        "kernel_cmdline": Spec(kernel_cmdline, cmd_build, cmd_base, ["/etc/default/grub"]),
        "kernel_cmdline_info": Spec(kernel_cmdline_info, cmd_build, lambda r: {"root": r}, ["/etc/default/grub", "/proc/cmdline"]),
        "kernel_rollout_step": Spec(kernel_rollout_step, step_build, step_base, ["/var/lib/gpufleet/kernel_upgrade/journal.json"]),
        "vllm_upgrade_step": Spec(vllm_upgrade_step, _vllm_upgrade_baseline, lambda r: {
            "root": r, "target": "0.33.1", "run_id": "run1", "restart_ok": True, "event": "start"},
            ["/var/lib/gpufleet/vllm_upgrade/journal.json", "/opt/gpufleet/vllm/vllm-0.32.0-aaaa/.gpufleet-complete"]),
        "kernel_upgrade_preflight": Spec(kernel_upgrade_preflight, pre_build, pre_base, ["/var/lib/dpkg/status", "/boot/grub/grubenv"]),
        "metrics_textfile": Spec(metrics_textfile, _nothing, lambda r: {
            "root": r, "host": "gpu-01", "stage": "kernel_upgrade", "verdict": {
                "verdict": {"verdict": "regression"}, "ratio": 0.91, "p_value": 0.001, "runs_needed": 0}},
            ["/var/lib/prometheus/node-exporter/gpufleet_verdict.prom"]),
        "nccl_change_step": Spec(nccl_change_step, _nccl_change_baseline, lambda r: {
            "root": r, "settings": FilterModule().filters()["nccl_env"]("p2p_off")["settings"],
            "target": FilterModule().filters()["nccl_env"]("p2p_off")["id"], "run_id": "run1",
            "restart_ok": True, "event": "start"},
            ["/var/lib/gpufleet/nccl_change/journal.json", "/etc/gpufleet/nccl.env", "/etc/nccl.conf",
             "/proc/4242/environ"]),
        "nccl_env_files": Spec(nccl_env_files, _nothing, lambda r: {
            "root": r, "conf_content": NCCL["nccl_conf"], "env_content": NCCL["env_file"], "settings": NCCL["settings"]},
            ["/etc/nccl.conf", "/etc/gpufleet/nccl.env"]),
        "output_equivalence": Spec(output_equivalence, _equivalence_reference, lambda r: {
            "root": r, "url": vllm_url, "model": "tiny", "mode": "compare", "prompt_lengths": ["short"], "timeout": 2.0,
            "reference": "/var/lib/gpufleet/equivalence/reference.json"}, ["/var/lib/gpufleet/equivalence/reference.json"]),
        "pcie_acs": Spec(pcie_acs, _switch, lambda r: {"root": r, "persist": False},
                         ["/var/lib/gpufleet/pcie_acs/originals.json"]),
        "pcie_aspm": Spec(pcie_aspm, _aspm, lambda r: {"root": r, "policy": "performance"}, ["/sys/module/pcie_aspm/parameters/policy"]),
        "pcie_facts": Spec(pcie_facts, _gpu_host, lambda r: {"root": r, "include_nvml": "never", "dest": "/var/lib/gpufleet/facts.json"}),
        "pcie_payload": Spec(pcie_payload, payload_build, payload_base, ["/var/lib/gpufleet/pcie_payload/originals.json"]),
        "throughput_gate": Spec(throughput_gate, _nothing, lambda r: {
            "baseline": [100.0, 101.0, 99.5, 100.4, 100.2], "candidate": [99.8, 100.1, 100.3, 99.9], "bootstrap_resamples": 200},
            root_option=False),
        "tune_measured": Spec(tune_measured, _nothing, lambda r: {"root": r, "op": "reset"},
                              ["/var/lib/gpufleet/tune_measured/state.json"]),
        "vfio_bind": Spec(vfio_bind, _gpu_host, lambda r: {"root": r, "devices": [GPU], "bind_now": False, "persist": "udev"},
                          ["/var/lib/gpufleet/vfio/original-drivers.json"]),
        "vllm_preflight": Spec(vllm_preflight, vp_build, vp_base),
        "vllm_ready": Spec(vllm_ready, _nothing, lambda r: {
            "url": vllm_url, "served_model_name": "tiny", "timeout": 2, "interval": 0.05, "request_timeout": 2,
            "start_log": f"{r}/var/log/vllm.log"}, ["/var/log/vllm.log"], root_option=False),
        "vllm_service_files": Spec(vllm_service_files, _nothing, _vllm_files_base, ["/etc/gpufleet/nccl.env"]),
    }
