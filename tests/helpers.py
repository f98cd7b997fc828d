"""Small helpers for the suite's subprocess-driven tests (sanity, lint, molecule, VM lab)."""

from __future__ import annotations

import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(argv: list[str], cwd: str = REPO, timeout: int = 1800, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run argv, capturing stdout+stderr together; never raises on a non-zero rc."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(argv, cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout, check=False)


def tail(text: str, lines: int = 80) -> str:
    return "\n".join(text.splitlines()[-lines:])


def assert_ok(proc: subprocess.CompletedProcess, what: str, lines: int = 80) -> None:
    """Fail with the command's last lines when it exited non-zero."""
    assert proc.returncode == 0, f"{what} failed with rc={proc.returncode}:\n{tail(proc.stdout, lines)}"


def first_pci_function() -> str | None:
    """This machine's first PCI function (what the playbook tests audit for real), or None without a PCI bus."""
    try:
        return sorted(os.listdir("/sys/bus/pci/devices"))[0]
    except (OSError, IndexError):
        return None
