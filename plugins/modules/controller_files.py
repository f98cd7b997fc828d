#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: controller_files
short_description: Write whole report files on the controller, without a module run
version_added: 0.2.0
description:
  - Writes each of O(files) whole on the Ansible controller (atomically, a temporary file renamed over the old one), with
    its mode, only when its content or mode differs; creates O(directories) first (and their missing parents).
  - Runs in the controller's own process (an action plugin), as the user that runs C(ansible-playbook), whatever host the
    task runs for, and opens no connection. One task writes the reports of every host (the C(gpufleet.inference.audit)
    role's per-host JSON, the fleet report) for the cost of a C(debug) task, where a C(copy) per file runs a module.
  - Existing files keep their owner; new files and directories belong to the controller's user.
author:
  - gpufleet.inference contributors (@gpufleet)
options:
  files:
    description: The files to write.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: The file on the controller.
        type: path
        required: true
      content:
        description: Its whole content.
        type: str
        required: true
      mode:
        description: Its mode, octal.
        type: str
        default: '0644'
  directories:
    description: Directories to create (with missing parents) or give O(directory_mode), before the files are written.
    type: list
    elements: path
    default: []
  directory_mode:
    description: The mode of O(directories), octal.
    type: str
    default: '0755'
attributes:
  action:
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the controller.
    support: full
    details: Everything runs in the action plugin, on the controller.
  async:
    description: Supports being used with the C(async) keyword.
    support: none
  bypass_host_loop:
    description: Forces a 'global' task that does not execute per host.
    support: none
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Every comparison is made and nothing written; RV(actions) lists what would be done.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: full
    details: Each changed file's text before and after, and each directory's state or mode.
  platform:
    description: Target OS/families that can be operated against.
    support: full
    platforms: posix
    details: The controller (POSIX); the task's host is not touched.
notes:
  - Use O(files) with a loop-free list built from C(hostvars) and C(run_once) to write one file per host in one task.
seealso:
  - module: ansible.builtin.copy
"""

EXAMPLES = r"""
- name: Keep every host's audit on the controller, in one task
  gpufleet.inference.controller_files:
    directories: ["{{ audit_controller_dir }}"]
    files: "{{ hostvars | gpufleet.inference.audit_controller_files(ansible_play_hosts, audit_controller_dir) }}"
  run_once: true

- name: Write a report
  gpufleet.inference.controller_files:
    directories: [/srv/reports]
    files:
      - path: /srv/reports/fleet.md
        content: "{{ fleet_markdown }}"
  run_once: true
"""

RETURN = r"""
actions:
  description: What was done, or would be done in check mode, on the controller.
  returned: always
  type: list
  elements: dict
  sample: [{action: create_directory, path: /srv/reports, after: "0755"}, {action: create, path: /srv/reports/fleet.md,
           after: "0644"}, {action: write, path: /srv/reports/gpu1.json}, {action: set_mode, path: /srv/reports/gpu2.json,
           before: "0600", after: "0644"}]
diff:
  description: Per changed path, its text (files) or state and mode (directories) before and after.
  returned: when diff mode is on and something changes
  type: list
  elements: dict
  sample: [{before: "", after: "# Fleet\n", before_header: /srv/reports/fleet.md, after_header: /srv/reports/fleet.md}]
"""
