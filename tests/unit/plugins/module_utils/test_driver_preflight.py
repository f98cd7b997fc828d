# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""driver_upgrade_preflight's executor on a fake host tree. The stand-in driver's packages are the real ones
(tests/lab/dkms/build-standin-debs builds them here) and dpkg-deb unpacks them for real; apt-get, dkms and modinfo,
which need the lab VM's repository and kernel headers, answer with what they printed there for the same packages
(fixtures/driver/, tests/tools/capture_driver_standin.sh: ``dkms add`` and ``dkms build`` of 1.1 and 1.3 in a private
tree, ``--dkmstree``/``--sourcetree``, the failed build's make.log, modinfo of the built 1.1). Everything else is the
real code."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._host.commands import HostCmd
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed
from ansible_collections.gpufleet.inference.plugins.module_utils.driver import driver_upgrade_preflight as pre, parse

FIX = Path(__file__).resolve().parent / "fixtures" / "driver"
REPO = Path(__file__).resolve().parents[4]
RUNNING, PENDING = "6.1.0-50-cloud-amd64", "6.1.0-56-cloud-amd64"
PACKAGES = ["gpufleet-nvidia-standin-utils", "gpufleet-nvidia-standin-dkms"]
PARAMS = {"packages": PACKAGES, "kernel_module": "gpufleet_nvidia", "version_file": "/proc/driver/gpufleet_nvidia/version"}
TOOLS = ("apt-get", "dpkg-query", "dpkg-deb", "env", "dkms", "modinfo")

pytestmark = pytest.mark.skipif(not shutil.which("dpkg-deb"), reason="dpkg-deb is not installed")


def fixture(name: str) -> str:
    return (FIX / name).read_text()


@pytest.fixture(scope="module")
def debs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("debs")
    subprocess.run([str(REPO / "tests/lab/dkms/build-standin-debs"), str(out)], check=True, capture_output=True)
    return out


class LabTools:
    """The AnsibleModule surface HostCmd uses (get_bin_path, run_command). Every command is recorded; see the module
    docstring for who answers what."""

    def __init__(self, root: Path, debs: Path):
        self.root, self.debs, self.ran = root, debs, []
        self.run_command_environ_update = {}

    def get_bin_path(self, name, required=False):
        return f"/usr/bin/{name}"

    def real(self, host_path: str) -> Path:
        return self.root / host_path.lstrip("/")

    def run_command(self, argv, environ_update=None):
        assert argv[:2] == ["/usr/bin/chroot", str(self.root)], argv
        argv = argv[2:]
        self.ran.append(argv)
        tool = os.path.basename(argv[0])
        return getattr(self, tool.replace("-", "_"))(argv[1:])

    def dpkg_query(self, _args):
        return 0, fixture("dpkg-query.out"), ""

    def apt_get(self, args):
        wanted = [a.split("=", 1)[1] for a in args if "=" in a and not a.startswith("Dir::")]
        if args[0] == "install":  # the simulation
            if wanted[0] == "9.9":
                return 100, "", fixture("sim-9.9.err")
            # the captured simulation of 1.1; other versions as apt words it for them (the version only differs)
            return 0, fixture("sim-1.1.out").replace("(1.1 ", f"({wanted[0]} "), ""
        raise AssertionError(f"unexpected apt-get {args}")

    def env(self, args):
        assert args[0] == "-C" and args[2:4] == ["/usr/bin/apt-get", "download"], args
        package, version = args[4].split("=")
        shutil.copy(self.debs / f"{package}_{version}_all.deb", self.real(args[1]))
        return 0, fixture("download-1.1.out").replace("1.1", version), fixture("download-1.1.err")

    def dpkg_deb(self, args):
        assert args[0] == "-x"
        proc = subprocess.run(["dpkg-deb", "-x", str(self.real(args[1])), str(self.real(args[2]))], capture_output=True,
                              text=True, check=False)
        return proc.returncode, proc.stdout, proc.stderr

    def dkms(self, args):
        tree = self.real(args[args.index("--dkmstree") + 1])
        name, version = args[args.index("-m") + 1], args[args.index("-v") + 1]
        assert self.real(args[args.index("--sourcetree") + 1]).joinpath(f"{name}-{version}", "dkms.conf").is_file()
        if args[0] == "add":
            (tree / name / version / "build").mkdir(parents=True)
            (tree / name / version / "source").symlink_to(f"/var/tmp/src/{name}-{version}")
            return 0, fixture("trial-add-1.1.out").replace("1.1", version), ""
        kernel = args[args.index("-k") + 1]
        if version == "1.3":  # its module does not compile: what DKMS printed, and its make.log
            (tree / name / version / "build/make.log").write_text(fixture("trial-make-1.3.log"))
            return 10, fixture("trial-build-1.3.out"), fixture("trial-build-1.3.err")
        ko = tree / name / version / kernel / "x86_64/module/gpufleet_nvidia.ko"  # where DKMS left it (trial-files-1.1.txt)
        ko.parent.mkdir(parents=True)
        ko.write_text("")
        return 0, fixture("trial-build-1.1.out").replace("1.1", version), ""

    def modinfo(self, args):
        if args[-1].endswith(".ko"):  # the module the trial built
            return 0, fixture("trial-modinfo-1.1.out"), ""
        return 0, fixture("modinfo-1.0.out"), ""  # the installed one


def lab_host(tmp_path: Path, debs: Path, kernels=(RUNNING,), headers=(RUNNING,)) -> tuple[Host, LabTools]:
    root = tmp_path / "root"
    for rel in [f"usr/bin/{t}" for t in TOOLS] + ["var/tmp/.keep"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/osrelease").write_text(RUNNING + "\n")
    (root / "proc/driver/gpufleet_nvidia").mkdir(parents=True)
    (root / "proc/driver/gpufleet_nvidia/version").write_text(fixture("proc-version-1.0.out"))
    for k in kernels:
        (root / "boot").mkdir(exist_ok=True)
        (root / f"boot/vmlinuz-{k}").write_text("k")
        (root / f"boot/initrd.img-{k}").write_text("i" * 65536)
        (root / f"lib/modules/{k}").mkdir(parents=True)
    for k in headers:
        (root / f"lib/modules/{k}/build").mkdir(parents=True)
    fs = HostFS(str(root))
    tools = LabTools(root, debs)
    return Host(fs=fs, cmd=HostCmd(tools, fs), warn=lambda m: None), tools


def leftovers(host: Host) -> list[str]:
    return [n for n in host.fs.listdir("/var/tmp") if n != ".keep"]


def test_a_candidate_that_builds_for_the_running_kernel_passes(tmp_path, debs):
    host, tools = lab_host(tmp_path, debs)
    got = pre.execute(dict(PARAMS, version="1.1"), host, True)
    assert got["ok"] and got["failed_checks"] == [] and got["changed"] is False and got["actions"] == []
    assert [c["name"] for c in got["checks"]] == ["candidate", f"build_{RUNNING}", "versions", "boot_space"]
    assert got["builds"][0]["module_version"] == "1.1" and got["builds"][0]["ok"]
    assert got["current"] == {"loaded": "1.0", "module_file": "1.0",
                              "packages": {"gpufleet-nvidia-standin-utils": "1.0", "gpufleet-nvidia-standin-dkms": "1.0"}}
    assert got["checks"][2]["reason"] == "user space and kernel module are both 1.1"
    assert [a[:2] for a in tools.ran] == [["/usr/bin/dpkg-query", "-W"], ["/usr/bin/apt-get", "install"],
                                          ["/usr/bin/env", "-C"], ["/usr/bin/dpkg-deb", "-x"], ["/usr/bin/dkms", "add"],
                                          ["/usr/bin/dkms", "build"], ["/usr/bin/modinfo", tools.ran[6][1]],
                                          ["/usr/bin/modinfo", "gpufleet_nvidia"]]
    assert leftovers(host) == []  # the private tree is gone


def test_a_module_that_does_not_compile_is_refused_with_dkms_s_and_the_compiler_s_lines(tmp_path, debs):
    host, _tools = lab_host(tmp_path, debs)
    with pytest.raises(Failed) as err:
        pre.execute(dict(PARAMS, version="1.3"), host, False)
    msg, fields = str(err.value), err.value.fields
    assert msg.startswith("preflight failed, nothing was changed: build_6.1.0-50-cloud-amd64: gpufleet-nvidia/1.3 does "
                          "not build for the running kernel 6.1.0-50-cloud-amd64: ")
    assert "error: implicit declaration of function 'gpufleet_kernel_api_from_a_newer_release'" in msg
    assert "Bad return status for module build on kernel: 6.1.0-50-cloud-amd64" in msg
    assert fields["failed_checks"] == [f"build_{RUNNING}"] and fields["changed"] is False
    assert any("implicit declaration" in line for line in fields["builds"][0]["log"])
    assert leftovers(host) == []


def test_a_pending_kernel_is_built_for_too_and_one_without_headers_is_refused(tmp_path, debs):
    host, tools = lab_host(tmp_path, debs, kernels=(RUNNING, PENDING), headers=(RUNNING, PENDING))
    got = pre.execute(dict(PARAMS, version="1.1"), host, False)
    assert got["kernels"] == {"running": RUNNING, "pending": [PENDING]}
    assert [b["kernel"] for b in got["builds"]] == [RUNNING, PENDING]
    assert [a[a.index("-k") + 1] for a in tools.ran if a[1:2] == ["build"]] == [RUNNING, PENDING]
    host, _tools = lab_host(tmp_path / "2", debs, kernels=(RUNNING, PENDING), headers=(RUNNING,))
    with pytest.raises(Failed) as err:
        pre.execute(dict(PARAMS, version="1.1"), host, False)
    assert err.value.fields["failed_checks"] == [f"build_{PENDING}"]
    assert f"the pending kernel {PENDING} has no headers" in str(err.value) and f"linux-headers-{PENDING}" in str(err.value)


def test_a_version_apt_does_not_have_is_refused_in_apt_s_words_before_any_download(tmp_path, debs):
    host, tools = lab_host(tmp_path, debs)
    with pytest.raises(Failed) as err:
        pre.execute(dict(PARAMS, version="9.9"), host, False)
    assert "E: Version '9.9' for 'gpufleet-nvidia-standin-utils' was not found" in str(err.value)
    assert [a[1] for a in tools.ran] == ["-W", "install", "gpufleet_nvidia"]  # no download, no build


def test_bad_options_are_refused_before_any_command(tmp_path, debs):
    host, tools = lab_host(tmp_path, debs)
    for params, words in ((dict(PARAMS, version="1.1", packages=[]), "packages is empty"),
                          (dict(PARAMS, version="latest"), "version='latest' is not a Debian package version"),
                          (dict(PARAMS, version="1.1", packages=["x; reboot"]), "is not a Debian package name"),
                          (dict(PARAMS, version="1.1", log_lines=-1), "log_lines=-1 is out of range")):
        with pytest.raises(Failed, match=words):
            pre.execute(params, host, False)
    assert tools.ran == []


def test_dkms_conf_of_the_stand_in_and_of_nvidia():
    here = REPO / "tests" / "lab" / "dkms" / "nvidia_standin" / "dkms.conf.in"
    conf = parse.parse_dkms_conf(here.read_text().replace("@VERSION@", "1.1"))
    assert conf == {"name": "gpufleet-nvidia", "version": "1.1", "modules": ["gpufleet_nvidia"]}
    # SYNTHETIC: the shape of Debian's nvidia-kernel-dkms dkms.conf (several modules, quoted values)
    text = ('PACKAGE_NAME="nvidia-current"\nPACKAGE_VERSION="550.54.15"\nBUILT_MODULE_NAME[0]="nvidia-current"\n'
            'BUILT_MODULE_NAME[1]="nvidia-current-modeset"\n# BUILT_MODULE_NAME[2]="commented"\n'
            'BUILT_MODULE_NAME[2]="nvidia-current-drm"\n')
    assert parse.parse_dkms_conf(text)["modules"] == ["nvidia-current", "nvidia-current-modeset", "nvidia-current-drm"]
