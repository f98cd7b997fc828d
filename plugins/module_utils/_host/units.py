# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The systemd unit files the modules install and enable, in one shape: comment lines that say who installed the unit,
what it does and where its log is, then ``[Unit]``, ``[Service]`` and ``[Install]``.

``oneshot()`` is the ``[Service]`` of a boot-time re-apply (the PCIe, CPU and IRQ settings): it runs once and stays
active, so ``systemctl status`` shows that it ran. Pure: the modules write the text through their managed files.
"""

from __future__ import annotations

from typing import Sequence


def render_unit(comments: Sequence[str], unit: Sequence[str], service: Sequence[str], wanted_by: str) -> str:
    """The unit file: ``comments`` (each a ``#`` line), ``[Unit]`` with the ``unit`` lines, ``[Service]`` with the
    ``service`` lines and ``[Install]`` ``WantedBy=`` the target that enabling it links it into."""
    lines = [f"# {c}" for c in comments] + ["[Unit]", *unit, "", "[Service]", *service, "", "[Install]",
                                            f"WantedBy={wanted_by}"]
    return "\n".join(lines) + "\n"


def oneshot(exec_start: str) -> list[str]:
    """The ``[Service]`` lines of a boot-time re-apply: run ``exec_start`` once, stay active after it."""
    return ["Type=oneshot", "RemainAfterExit=yes", f"ExecStart={exec_start}"]
