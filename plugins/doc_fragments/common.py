# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """Option and attribute documentation shared by every gpufleet.inference module."""

    # The one I/O seam: every /sys, /proc, /etc, /boot path is read and written under O(root).
    DOCUMENTATION = r"""
options:
  root:
    description:
      - Directory that stands for C(/) when the module reads and writes C(/sys), C(/proc), C(/etc),
        C(/dev) and C(/boot).
      - Leave it at C(/) on real hosts. Tests point it at a captured or synthetic tree.
    type: path
    default: /
"""

    ATTRIBUTES_READONLY = r"""
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: The module never changes the host, so check mode returns the same result.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
  platform:
    description: Target OS/families that can be operated against.
    support: full
    platforms: posix
    details: Linux hosts with sysfs.
"""

    ATTRIBUTES = r"""
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Every read is done and no write; RV(actions) lists what would be done.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: full
    details: Returns C(before) and C(after) of the state the module manages.
  platform:
    description: Target OS/families that can be operated against.
    support: full
    platforms: posix
    details: Linux hosts with sysfs.
"""
