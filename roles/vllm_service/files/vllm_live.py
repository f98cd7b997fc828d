# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Print the live state of a systemd service's main process as one JSON line (vllm_service's verify).

    python3 vllm_live.py UNIT

{"pid", "user", "argv", "env" (NCCL_*, CUDA_*, HF_*, VLLM_*, TRANSFORMERS_* but never VLLM_API_KEY nor a
 name that looks secret, such as HF_TOKEN), "api_key_in_env" (the key's presence, never its value),
 "secrets_in_env" (the names of the secret-looking variables present, never their values), "env_readable"}

Root may not read another user's /proc/PID/environ where it lacks CAP_SYS_PTRACE (unprivileged
containers); the environment is then read by a child that drops to the process's own user.
"""

import json
import os
import pwd
import re
import subprocess
import sys

SHOWN = ("NCCL_", "CUDA_", "HF_", "VLLM_", "TRANSFORMERS_")
# The same names vllm_args refuses in the plain environment (module_utils/vllm/args.py SECRET_NAME).
SECRET = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|CREDENTIAL|PRIVATE_KEY|ACCESS_KEY|AUTH)", re.IGNORECASE)


def visible(env):
    """The variables worth comparing; never the API key or anything that looks secret."""
    return {k: v for k, v in env.items() if k.startswith(SHOWN) and k != "VLLM_API_KEY" and not SECRET.search(k)}


def secret_names(env):
    return sorted(k for k in env if k == "VLLM_API_KEY" or SECRET.search(k))


def read_as(path, uid, gid):
    """The file's bytes, read by a forked child running as uid:gid; None when that fails too."""
    rfd, wfd = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(rfd)
        code = 1
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            with open(path, "rb") as fh:
                data = fh.read()
            view = memoryview(data)
            while view:
                view = view[os.write(wfd, view):]
            code = 0
        except OSError:
            pass
        finally:
            os._exit(code)  # pylint: disable=protected-access
    os.close(wfd)
    chunks = []
    while True:
        chunk = os.read(rfd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(rfd)
    _pid, status = os.waitpid(child, 0)
    return b"".join(chunks) if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else None


def main():
    unit = sys.argv[1]
    pid = subprocess.run(["systemctl", "show", "--property=MainPID", "--value", unit], stdout=subprocess.PIPE,
                         universal_newlines=True, check=False).stdout.strip()
    if not pid.isdigit() or pid == "0":
        print(json.dumps({"pid": 0, "error": "%s has no main process" % unit}))
        return 0
    st = os.stat("/proc/" + pid)
    with open("/proc/%s/cmdline" % pid, "rb") as fh:
        argv = [a.decode("utf-8", "replace") for a in fh.read().split(b"\0")[:-1]]
    try:
        with open("/proc/%s/environ" % pid, "rb") as fh:
            raw = fh.read()
    except PermissionError:
        raw = read_as("/proc/%s/environ" % pid, st.st_uid, st.st_gid)
    env = {}
    if raw is not None:
        env = dict(e.split("=", 1) for e in raw.decode("utf-8", "replace").split("\0") if "=" in e)
    print(json.dumps({
        "pid": int(pid),
        "user": pwd.getpwuid(st.st_uid).pw_name,
        "argv": argv,
        "env": visible(env),
        "api_key_in_env": "VLLM_API_KEY" in env,
        "secrets_in_env": [k for k in secret_names(env) if k != "VLLM_API_KEY"],
        "env_readable": raw is not None,
        "error": None,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
