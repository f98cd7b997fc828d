# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: reapply_script
short_description: A re-apply script that carries the collection's module_utils it runs, for one copy task
version_added: 0.2.0
description:
  - Renders, on the controller, the script that re-applies a device setting outside a module run (at boot, on a
    driver bind), with the module_utils it runs in it - the import closure of its entry module_utils, computed from
    their imports - so that the host runs the modules' own code with no Ansible installed and one
    C(ansible.builtin.copy) task (with O(ansible.builtin.copy#module:content)) installs it whole.
  - V(irq_affinity) is C(/usr/local/libexec/gpufleet-irq-affinity-apply) of the C(gpufleet.inference.irq_affinity)
    role; V(pcie_boot) is C(/usr/local/libexec/gpufleet-pcie-payload-apply), which the C(gpufleet.inference.pcie_payload)
    and C(gpufleet.inference.pcie_acs) modules write themselves (the same text for the same interpreter).
options:
  _terms:
    description: The script, V(irq_affinity) or V(pcie_boot).
    required: true
    type: list
    elements: str
  python:
    description:
      - The host's interpreter, the script's C(#!) line. Python 3.7 or later; the script says so and exits 2 under an
        older one.
    type: str
    required: true
author:
  - gpufleet.inference contributors (@gpufleet)
"""

EXAMPLES = r"""
- name: Install the re-apply script, with the module_utils it runs
  ansible.builtin.copy:
    content: "{{ lookup('gpufleet.inference.reapply_script', 'irq_affinity', python='/usr/bin/python3') }}"
    dest: /usr/local/libexec/gpufleet-irq-affinity-apply
    mode: "0755"
"""

RETURN = r"""
_raw:
  description: The script's text, one string per term.
  type: list
  elements: str
"""

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.gpufleet.inference.plugins.module_utils.irq import reapply as irq_reapply
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie import reapply as pcie_boot_apply
from ansible_collections.gpufleet.inference.plugins.module_utils._host.bundle import BundleError

SCRIPTS = {"irq_affinity": irq_reapply.render_script, "pcie_boot": pcie_boot_apply.render_script}


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        unknown = set(kwargs) - {"python"}
        if unknown:
            raise AnsibleLookupError(f"reapply_script: unknown options {sorted(unknown)}: only python")
        python = kwargs.get("python")
        if not python or not str(python).startswith("/"):
            raise AnsibleLookupError(f"reapply_script: python must be the absolute path of the host's interpreter, not {python!r}.")
        out = []
        for term in terms:
            if term not in SCRIPTS:
                raise AnsibleLookupError(f"reapply_script: unknown script {term!r}; use one of {', '.join(sorted(SCRIPTS))}.")
            try:
                out.append(SCRIPTS[term](str(python)))
            except BundleError as err:
                raise AnsibleLookupError(f"reapply_script: cannot build the {term} script: {err}") from None
        return out
