# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""lookup reapply_script: the re-apply scripts rendered on the controller, directly and through ansible-playbook
(Ansible's collection loader serves the sources; the text reaches the file untemplated, though the sources hold
``{{``), installed with the one copy task the irq_affinity role uses, idempotent, and runnable alone."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleLookupError

from ansible_collections.gpufleet.inference.plugins.lookup import reapply_script
from ansible_collections.gpufleet.inference.plugins.module_utils.irq import reapply as irq_reapply
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie import reapply as pcie_boot_apply

REPO = Path(__file__).resolve().parents[4]
PLAYBOOK = """\
- name: Install the re-apply scripts as the irq_affinity role does
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Install the IRQ re-apply script, with the module_utils it runs
      ansible.builtin.copy:
        content: "{{ lookup('gpufleet.inference.reapply_script', 'irq_affinity', python=host_python) }}"
        dest: "%(dir)s/gpufleet-irq-affinity-apply"
        mode: "0755"
    - name: Install the PCIe boot applier the same way
      ansible.builtin.copy:
        content: "{{ lookup('gpufleet.inference.reapply_script', 'pcie_boot', python=host_python) }}"
        dest: "%(dir)s/gpufleet-pcie-payload-apply"
        mode: "0755"
"""


def test_the_lookup_renders_what_the_modules_and_the_role_install():
    lookup = reapply_script.LookupModule()
    assert lookup.run(["irq_affinity"], python="/usr/bin/python3") == [irq_reapply.render_script("/usr/bin/python3")]
    assert lookup.run(["pcie_boot", "irq_affinity"], python="/usr/bin/python3.11") == [
        pcie_boot_apply.render_script("/usr/bin/python3.11"), irq_reapply.render_script("/usr/bin/python3.11")]
    with pytest.raises(AnsibleLookupError, match="unknown script 'vfio'; use one of irq_affinity, pcie_boot"):
        lookup.run(["vfio"], python="/usr/bin/python3")
    with pytest.raises(AnsibleLookupError, match="python must be the absolute path"):
        lookup.run(["irq_affinity"], python="python3")


@pytest.mark.skipif(not shutil.which("ansible-playbook"), reason="needs ansible-playbook")
def test_one_copy_task_installs_a_script_that_runs_alone(tmp_path):
    out_dir = tmp_path / "libexec"
    out_dir.mkdir()
    (tmp_path / "play.yml").write_text(PLAYBOOK % {"dir": out_dir})
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_COLLECTIONS_PATH=str(REPO / ".collections"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_PYTHON_INTERPRETER=sys.executable)

    def play() -> dict[str, int]:
        proc = subprocess.run(["ansible-playbook", "-i", "localhost,", str(tmp_path / "play.yml"), "-e", f"host_python={sys.executable}"],
                              cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, env=env,
                              timeout=600, check=False)
        recap = re.search(r"localhost\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", proc.stdout)
        assert recap, proc.stdout[-4000:]
        return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, recap.groups())))

    assert play() == {"ok": 2, "changed": 2, "unreachable": 0, "failed": 0}
    irq = out_dir / "gpufleet-irq-affinity-apply"
    assert irq.read_text() == irq_reapply.render_script(sys.executable)  # byte for byte: nothing templated, nothing stripped
    assert "bdf=${{1##*/}}" in irq.read_text()  # irq_affinity's policy script template: a Jinja-like brace pair survives
    assert (out_dir / "gpufleet-pcie-payload-apply").read_text() == pcie_boot_apply.render_script(sys.executable)
    assert os.stat(irq).st_mode & 0o777 == 0o755
    assert play()["changed"] == 0  # the same text every run: a re-run changes nothing
    proc = subprocess.run([str(irq), "--root", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, check=False, env={"PATH": os.environ["PATH"]}, cwd=str(tmp_path))
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr  # no configuration under that root: nothing to do
