# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What gpufleet.inference.driver_upgrade_preflight executes: may this host take the candidate driver packages?

It asks apt (``apt-get install -s``), fetches the candidate's DKMS package (``apt-get download``) into a private
directory, unpacks it
(``dpkg-deb -x``) and builds its module with DKMS for the running kernel and every pending kernel in a private DKMS
tree (``dkms add/build --dkmstree --sourcetree``: DKMS's own way to build without touching the system's tree), reads
the built module's version (``modinfo``), and measures /boot. checks.py decides. The private directory is removed
whatever happens; nothing of the host's packages, DKMS tree, modules or /boot changes, in check mode or not.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed, bounded
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.checks import (
    boot_space_needed, check_boot_space, check_build, check_candidate, check_versions, decide,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.parse import (
    build_error_lines, parse_dkms_conf, parse_modinfo,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.driver.reads import (
    MODULE_RE, PACKAGE_RE, VERSION_RE, checked, installed_packages, loaded_version, modinfo_version, pending_kernels,
    running_kernel,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.kernel.upgrade import parse_apt_simulation

DEFAULTS = {"dkms_package": None, "kernel_module": "nvidia", "version_file": "/proc/driver/nvidia/version",
            "workdir": "/var/tmp", "build_kernels": "running_and_pending", "log_lines": 40}
LOG_LINES = (0, 400)


def execute(params: dict, host: Host, check_mode: bool) -> dict[str, Any]:
    """driver_upgrade_preflight's result: ``ok``, ``checks``, ``failed_checks``, ``current``, ``candidate``,
    ``kernels``, ``builds``; Failed (with the same fields) when a check fails."""
    p = dict(DEFAULTS, **{k: v for k, v in params.items() if v is not None})
    packages = [checked("packages[]", n, PACKAGE_RE, "a Debian package name") for n in p.get("packages") or []]
    if not packages:
        raise Failed("packages is empty: name the driver packages to upgrade (nvidia-driver, nvidia-kernel-dkms, ...). "
                     "Nothing was done.", changed=False)
    version = checked("version", p.get("version"), VERSION_RE, "a Debian package version (550.54.15-1)")
    module = checked("kernel_module", p["kernel_module"], MODULE_RE, "a kernel module name")
    bounded("log_lines", p["log_lines"], *LOG_LINES, "lines")
    running = running_kernel(host)
    kernels = [running] + (pending_kernels(host, running) if p["build_kernels"] == "running_and_pending" else [])
    installed = installed_packages(host)
    sim = simulate(host, packages, version)
    checks = [check_candidate(packages, version, sim)]
    builds: list[dict[str, Any]] = []
    if sim["available"]:
        dkms_package = p["dkms_package"] or next(
            (n for n in packages + [i[0] for i in sim["installs"]] if n.endswith("-dkms")), None)
        if dkms_package is None:
            raise Failed(f"none of {', '.join(packages)} is a DKMS package (a name ending in -dkms) and dkms_package is "
                         "not set: name the package that carries the module's source. Nothing was done.", changed=False)
        checked("dkms_package", dkms_package, PACKAGE_RE, "a Debian package name")
        builds = trial_builds(host, dkms_package, version, kernels, p)
        for b in builds:
            checks.append(check_build(b["kernel"], b, "running" if b["kernel"] == running else "pending"))
        checks.append(check_versions({n: version for n in packages}, {b["kernel"]: b["module_version"] for b in builds}))
    initrds = {k: host.fs.size(f"/boot/initrd.img-{k}") for k in kernels if host.fs.exists(f"/boot/initrd.img-{k}")}
    st = os.statvfs(host.fs.path("/boot"))
    checks.append(check_boot_space(st.f_bavail * st.f_frsize, boot_space_needed(initrds)))
    ok, msg = decide(checks)
    result = {"changed": False, "actions": [], "ok": ok, "msg": msg, "checks": checks,
              "failed_checks": [c["name"] for c in checks if not c["ok"]],
              "kernels": {"running": running, "pending": kernels[1:]}, "builds": builds,
              "current": {"loaded": loaded_version(host, p["version_file"]),
                          "module_file": modinfo_version(host, module),
                          "packages": {n: installed.get(n) for n in packages}},
              "candidate": {"version": version, "packages": packages, "installs": [list(i) for i in sim["installs"]]}}
    if not ok:
        raise Failed(msg, **{k: v for k, v in result.items() if k != "msg"})
    return result


def simulate(host: Host, packages: list[str], version: str) -> dict[str, Any]:
    """apt's simulated install of the candidate (held packages allowed to change: the driver is held between upgrades)."""
    apt_get = host.cmd.find("apt-get", required=True, hint="install apt (a Debian or Ubuntu host)")
    rc, out, err = host.cmd.run_in_root([apt_get, "install", "-s", "--no-install-recommends",
                                         "--allow-change-held-packages"] + [f"{n}={version}" for n in packages])
    return parse_apt_simulation(rc, out, err)


def trial_builds(host: Host, package: str, version: str, kernels: list[str], p: dict) -> list[dict[str, Any]]:
    """Fetch and unpack ``package`` at ``version`` in a private directory under ``workdir`` and build its DKMS module
    for each of ``kernels`` there; the directory is removed after."""
    base = host.fs.path(p["workdir"])
    if not os.path.isdir(base):
        raise Failed(f"workdir {p['workdir']} is not a directory under root {host.fs.root}: give one with room for the "
                     "driver's source and build. Nothing was done.", changed=False)
    real = tempfile.mkdtemp(prefix="gpufleet-driver-preflight.", dir=base)
    work = host.fs.unroot(real)
    try:
        source = unpack(host, package, version, work)
        host.fs.makedirs(f"{work}/dkms")  # DKMS refuses a tree it cannot write to, and a missing one
        return [build_one(host, source, work, k, int(p["log_lines"])) for k in kernels]
    finally:
        shutil.rmtree(real, ignore_errors=True)


def unpack(host: Host, package: str, version: str, work: str) -> dict[str, Any]:
    """Download ``package=version`` into ``work``/archives (``apt-get download``, run there by ``env -C``: it also copies
    a package of a local file: repository, which ``--download-only`` leaves in place) and unpack it; its dkms.conf."""
    apt_get = host.cmd.find("apt-get", required=True)
    env = host.cmd.find("env", required=True, hint="install coreutils")
    dpkg_deb = host.cmd.find("dpkg-deb", required=True, hint="install dpkg")
    host.fs.makedirs(f"{work}/archives")
    rc, out, err = host.cmd.run_in_root([env, "-C", f"{work}/archives", apt_get, "download", f"{package}={version}"])
    debs = [n for n in host.fs.listdir(f"{work}/archives") if n.startswith(f"{package}_") and n.endswith(".deb")]
    if rc != 0 or not debs:
        raise Failed(f"apt-get download {package}={version} failed (rc {rc}): "
                     f"{' / '.join(build_error_lines(err, out)) or (err or out).strip()[-400:] or 'no package file'}. "
                     "Nothing was changed.", changed=False)
    rc, _out, err = host.cmd.run_in_root([dpkg_deb, "-x", f"{work}/archives/{debs[0]}", f"{work}/root"])
    if rc != 0:
        raise Failed(f"dpkg-deb -x {debs[0]} failed (rc {rc}): {err.strip()}. Nothing was changed.", changed=False)
    for name in host.fs.listdir(f"{work}/root/usr/src"):
        conf = parse_dkms_conf(host.fs.read_optional(f"{work}/root/usr/src/{name}/dkms.conf"))
        if conf["name"] and conf["version"]:
            return dict(conf, deb=debs[0])
    raise Failed(f"{package} {version} holds no DKMS source (no /usr/src/*/dkms.conf): set dkms_package to the package "
                 "that carries the kernel module's source. Nothing was changed.", changed=False)


def build_one(host: Host, source: dict[str, Any], work: str, kernel: str, log_lines: int) -> dict[str, Any]:
    """``dkms build`` of the unpacked source for ``kernel`` in the private tree; the built module's modinfo version."""
    dkms = host.cmd.find("dkms", required=True, hint="install dkms (the driver's DKMS package needs it)")
    name, version = source["name"], source["version"]
    tree = ["--dkmstree", f"{work}/dkms", "--sourcetree", f"{work}/root/usr/src"]
    out = {"kernel": kernel, "module": name, "version": version, "headers": host.fs.exists(f"/lib/modules/{kernel}/build"),
           "ok": False, "rc": None, "lines": [], "log": [], "make_log": None, "module_version": None}
    if not out["headers"]:
        return out
    if not host.fs.exists(f"{work}/dkms/{name}/{version}/source"):
        rc, o, e = host.cmd.run_in_root([dkms, "add", "-m", name, "-v", version] + tree)
        if rc != 0:
            out.update(rc=rc, lines=build_error_lines(e, o) or [(e or o).strip()[-300:]])
            return out
    rc, o, e = host.cmd.run_in_root([dkms, "build", "-m", name, "-v", version, "-k", kernel, "--force"] + tree)
    log_path = f"{work}/dkms/{name}/{version}/build/make.log"
    make_log = host.fs.read_optional(log_path) or ""
    out.update(rc=rc, ok=rc == 0, make_log=log_path, log=make_log.splitlines()[-log_lines:] if rc != 0 else [])
    if rc != 0:
        out["lines"] = build_error_lines(o, e, make_log)
        return out
    first = find_module(host, f"{work}/dkms/{name}/{version}/{kernel}", source["modules"][0]) if source["modules"] else None
    if first:
        modinfo = host.cmd.find("modinfo", required=True, hint="install kmod")
        rc, o, _e = host.cmd.run_in_root([modinfo, first])
        out["module_version"] = parse_modinfo(o).get("version") if rc == 0 else None
    return out


def find_module(host: Host, base: str, module: str) -> str | None:
    """The built ``module``.ko (or .ko.xz/.zst/.gz) under ``base`` (DKMS keeps it in <kernel>/<arch>/module/)."""
    for arch in host.fs.listdir(base):
        for name in host.fs.listdir(f"{base}/{arch}/module"):
            if name.split(".ko")[0] == module and ".ko" in name:
                return f"{base}/{arch}/module/{name}"
    return None
