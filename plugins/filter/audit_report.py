# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters that turn per-host pcie_facts results into the fleet report (logic in module_utils)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.audit_report import (
    fleet_audits, render_html, render_markdown, tuning_changes)
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.pcie_facts import render_report


def _fleet_audits(hostvars, hosts, key="__audit_result", benchmark_dir=None, tuning_dir=None, audit_dir=None):
    try:
        return fleet_audits(hostvars, list(hosts), key, benchmark_dir=benchmark_dir, tuning_dir=tuning_dir,
                            audit_dir=audit_dir or None)
    except (KeyError, TypeError) as err:
        raise AnsibleFilterError(f"fleet_audits: cannot read the audit of a host ({err}); "
                                 "pass hostvars and a list of inventory host names") from err


def _checked(render):
    def wrapper(fleet, previous=None):
        if not isinstance(fleet, list) or not all(isinstance(e, dict) and "host" in e and "pcie" in e for e in fleet):
            raise AnsibleFilterError(f"{render.__name__}: expects the list made by gpufleet.inference.fleet_audits")
        return render(fleet, previous=previous or None)
    return wrapper


def _audit_controller_files(hostvars, hosts, directory, key="__audit_result"):
    """One {path, content} per host of ``hosts`` that holds an audit result: ``<directory>/<host>.json`` with
    ``{host, kernel, pcie}`` as render_report writes it: the bytes pcie_facts keeps on the host."""
    files = []
    for host in hosts:
        try:
            result = hostvars[host].get(key)
        except (KeyError, TypeError, AttributeError) as err:
            raise AnsibleFilterError(f"audit_controller_files: cannot read the audit of {host} ({err}); "
                                     "pass hostvars and a list of inventory host names") from err
        if not isinstance(result, dict) or not isinstance(result.get("pcie"), dict):
            continue
        facts = hostvars[host].get("ansible_facts") or {}
        files.append({"path": f"{directory}/{host}.json",
                      "content": render_report(host, facts.get("kernel", ""), result["pcie"])})
    return files


def _tuning_changes(hostvars_of_host):
    return tuning_changes(hostvars_of_host)


class FilterModule:
    """Fleet audit report filters."""

    def filters(self):
        return {
            "fleet_audits": _fleet_audits,
            "audit_controller_files": _audit_controller_files,
            "audit_markdown": _checked(render_markdown),
            "audit_html": _checked(render_html),
            "tuning_changes": _tuning_changes,
        }
