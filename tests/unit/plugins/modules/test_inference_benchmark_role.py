# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""roles/inference_benchmark: argument specs, defaults, README and the module agree, and the role runs
for real with ansible-playbook against the lab inference server on 127.0.0.1 (check mode, then a
run that stores, fetches and verifies the results)."""

from __future__ import annotations

import json
import os
import sys

import pytest
import yaml

from ansible_collections.gpufleet.inference.plugins.modules import inference_benchmark
from tests.helpers import REPO, assert_ok, run
from tests.unit.test_lab_inference_server import LabServer

ROLE = os.path.join(REPO, "roles", "inference_benchmark")
PREFIX = "inference_benchmark_"


def load(rel: str):
    with open(os.path.join(ROLE, rel), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def test_specs_defaults_and_readme_agree():
    spec = load("meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    defaults = load("defaults/main.yml")
    assert set(spec) == set(defaults)
    for name, option in spec.items():
        assert name.startswith(PREFIX)
        assert option["default"] == defaults[name], name
    with open(os.path.join(ROLE, "README.md"), encoding="utf-8") as fh:
        readme = fh.read()
    for name in spec:
        assert f"`{name}`" in readme, f"{name} is not documented in the role README"
    assert spec[PREFIX + "api_key"].get("no_log") is True


def test_role_passes_every_module_option_with_the_same_default():
    tasks = load("tasks/main.yml")
    call = next(t for t in tasks if "gpufleet.inference.inference_benchmark" in t)["gpufleet.inference.inference_benchmark"]
    module_spec = inference_benchmark.ARGUMENT_SPEC
    spec = load("meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    passed = set(call)
    assert passed <= set(module_spec)
    for option in passed:
        role_var = PREFIX + option
        # the role's empty model, api_key and server_argv mean "not given" (the module's None): passed as omit
        if role_var in spec and option not in ("model", "api_key", "results_dir", "server_argv"):
            assert spec[role_var]["default"] == module_spec[option].get("default"), option


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    server = LabServer(tmp_path_factory.mktemp("model"), "--work", "8", "--step-work", "32")
    yield server
    server.stop()


def playbook(tmp_path, lab, extra: str = "") -> str:
    path = tmp_path / "play.yml"
    path.write_text(f"""
- name: Benchmark the lab server
  hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: gpufleet.inference.inference_benchmark
      vars:
        inference_benchmark_url: {lab.url}
        inference_benchmark_prompt_tokens: 16
        inference_benchmark_output_tokens: 8
        inference_benchmark_concurrency: [1, 2]
        inference_benchmark_requests: 4
        inference_benchmark_warmup: 1
        inference_benchmark_repetitions: 2
        inference_benchmark_label: candidate
        inference_benchmark_results_dir: {tmp_path}/host
        inference_benchmark_controller_dir: {tmp_path}/controller
        inference_benchmark_tuning: {{mps: 256}}
{extra}""")
    return str(path)


def ansible_playbook(tmp_path, lab, *args):
    env = {"ANSIBLE_COLLECTIONS_PATH": os.path.join(REPO, ".collections"), "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_STDOUT_CALLBACK": "default", "ANSIBLE_NOCOLOR": "1"}
    bindir = os.path.dirname(sys.executable)
    return run([os.path.join(bindir, "ansible-playbook"), "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}",
                playbook(tmp_path, lab), *args], env=env, timeout=600)


def test_role_runs_for_real(tmp_path, lab):
    before = lab.metric("vllm:generation_tokens_total")
    proc = ansible_playbook(tmp_path, lab, "--check")
    assert_ok(proc, "role in check mode")
    assert lab.metric("vllm:generation_tokens_total") == before  # check mode sends no load
    assert not (tmp_path / "controller").exists()

    proc = ansible_playbook(tmp_path, lab)
    assert_ok(proc, "role")
    assert "failed=0" in proc.stdout and "Check the stored results against the run" in proc.stdout
    stored = sorted((tmp_path / "host").iterdir())
    fetched = sorted((tmp_path / "controller" / "localhost").iterdir())
    assert len(stored) == 1 and [p.name for p in fetched] == [stored[0].name]
    doc = json.loads(fetched[0].read_text())
    assert doc["label"] == "candidate" and doc["tuning"] == {"mps": 256}
    assert [lv["concurrency"] for lv in doc["levels"]] == [1, 2] and doc["errors"] == 0
    # every token reached the server: 2 levels x 2 runs x 4 requests x 8 tokens, plus warm-up, the settle runs (2 or 3
    # per level, the role's default of at most 3) and the preflight
    settle_runs = [len(lv["settle"]["runs"]) for lv in doc["levels"]]
    assert all(2 <= n <= 3 for n in settle_runs) and doc["config"]["settle_runs"] == 3
    assert lab.metric("vllm:generation_tokens_total") - before == 2 * 2 * 4 * 8 + 2 * 1 * 8 + sum(settle_runs) * 4 * 8 + 4
