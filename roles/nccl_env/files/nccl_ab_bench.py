# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""All-reduce time and bus bandwidth of each NCCL candidate environment (the nccl_env role's P2P A/B),
on the GPUs of one tensor-parallel group (--gpus) or every GPU.

Runs on the GPU host with the standard library only; prints one JSON object on stdout:

    {"tool": "nccl-tests" | "torch" | null, "gpus": N, "gpu_names": [...], "skipped": null | "why",
     "error": null | "why", "bench": {...},
     "results": {NAME: {"ok": bool, "error": str | null, "busbw_gbps": {"BYTES": GB/s}, "algbw_gbps": {...},
                        "time_us": {"BYTES": microseconds per all-reduce},
                        "avg_busbw_gbps": float | null, "seconds": float}}}

Each candidate runs in a fresh process tree with exactly its own NCCL_* settings: inherited NCCL_*
variables are dropped, NCCL_CONF_FILE points at /dev/null and HOME at an empty directory (so neither
/etc/nccl.conf nor ~/.nccl.conf leak in), and NVLink multicast stays off (NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1) whatever the candidate says. A run
that hangs (P2P deadlocks exist on PCIe hosts with ACS, NVIDIA/nccl#2079) is killed after
--timeout seconds and reported as failed.

Tools: nccl-tests' all_reduce_perf (one process, -g N) when found, else PyTorch's
torch.distributed all_reduce over NCCL, one process per GPU (this script re-runs itself as each
worker). With fewer than --min-gpus GPUs nothing runs and "skipped" says why.

    python3 nccl_ab_bench.py --candidates FILE.json [--tool auto|nccl-tests|torch]
        [--all-reduce-perf PATH] [--python PATH] [--min-bytes N] [--max-bytes N] [--warmup N]
        [--iters N] [--timeout S] [--min-gpus N]

FILE.json (or the JSON itself) maps candidate names to {KEY: VALUE} environments.
"""

import argparse
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ALWAYS = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
}
PERF_PLACES = ("/usr/local/bin/all_reduce_perf", "/usr/bin/all_reduce_perf", "/opt/nccl-tests/build/all_reduce_perf",
               "/usr/local/nccl-tests/build/all_reduce_perf")


# ---- GPUs -----------------------------------------------------------------------------------
def count_gpus(python=None, timeout=60):
    """(count, names, how): nvidia-smi, else the driver's /proc entries, else torch."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=pci.bus_id,name", "--format=csv,noheader"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, universal_newlines=True, timeout=timeout, check=False)
            if out.returncode == 0:
                rows = [ln.split(",", 1) for ln in out.stdout.splitlines() if ln.strip()]
                names = [r[-1].strip() for r in rows]
                count_gpus.bus_ids = [bus_bdf(r[0]) for r in rows]
                return len(names), names, "nvidia-smi"
        except (OSError, subprocess.SubprocessError):
            pass
    entries = glob.glob("/proc/driver/nvidia/gpus/*")
    if entries:
        return len(entries), [os.path.basename(e) for e in sorted(entries)], "/proc/driver/nvidia/gpus"
    if python:
        code = "import json, torch; n = torch.cuda.device_count(); " \
               "print(json.dumps([torch.cuda.get_device_name(i) for i in range(n)]))"
        try:
            out = subprocess.run([python, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 universal_newlines=True, timeout=timeout, check=False)
            if out.returncode == 0:
                names = json.loads(out.stdout.strip().splitlines()[-1])
                return len(names), names, "torch"
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            pass
    return 0, [], "none"


count_gpus.bus_ids = []


def bus_bdf(bus_id):
    """nvidia-smi's ``00000000:17:00.0`` -> ``0000:17:00.0``."""
    text = bus_id.strip().lower()
    domain, _sep, rest = text.partition(":")
    return "%04x:%s" % (int(domain, 16), rest) if rest else text


def select_gpus(wanted, bus_ids):
    """CUDA indexes (PCI bus order, as CUDA_DEVICE_ORDER=PCI_BUS_ID numbers them) of the wanted BDFs, or an error."""
    index = {b: i for i, b in enumerate(sorted(bus_ids))}
    missing = [w for w in wanted if w not in index]
    if missing:
        return None, "GPU(s) %s of --gpus not found (this host has %s)" % (", ".join(missing), ", ".join(sorted(bus_ids)) or "none")
    return [index[w] for w in wanted], None


def has_torch(python, timeout=120):
    try:
        out = subprocess.run([python, "-c", "import torch.distributed"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True, timeout=timeout, check=False)
        return out.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def find_perf(explicit=None):
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which("all_reduce_perf")
    if found:
        return found
    for place in PERF_PLACES:
        if os.access(place, os.X_OK):
            return place
    return None


# ---- environments ---------------------------------------------------------------------------------
def candidate_env(base, candidate, home):
    """The parent's environment without its NCCL_* keys, plus the candidate and the fixed keys."""
    env = {k: v for k, v in base.items() if not k.startswith("NCCL_")}
    env.update({str(k): str(v) for k, v in candidate.items()})
    env.update(ALWAYS)
    env["NCCL_CONF_FILE"] = "/dev/null"
    env["HOME"] = home
    env.setdefault("NCCL_DEBUG", "WARN")
    return env


def run_tree(argv_list, envs, timeout):
    """Start every argv in its own session, wait for all; kill them all on timeout.

    Output goes to temporary files, not pipes: a rank that logs a lot must not block on a full
    pipe while its peers wait for it in a collective. Returns (rcs, outs, errs, timed_out).
    """
    files = [(tempfile.TemporaryFile(mode="w+"), tempfile.TemporaryFile(mode="w+")) for _argv in argv_list]
    procs = [subprocess.Popen(argv, env=env, stdout=out, stderr=err, universal_newlines=True, start_new_session=True)
             for argv, env, (out, err) in zip(argv_list, envs, files)]
    deadline = time.monotonic() + timeout
    timed_out = False
    for proc in procs:
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            break
    if timed_out:
        for proc in procs:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                except OSError:
                    pass
                try:
                    proc.wait(timeout=5)
                    break
                except subprocess.TimeoutExpired:
                    continue
    outs, errs = [], []
    for out, err in files:
        for fh, dest in ((out, outs), (err, errs)):
            fh.seek(0)
            dest.append(fh.read())
            fh.close()
    return [p.returncode for p in procs], outs, errs, timed_out


def tail(text, chars=600):
    text = (text or "").strip()
    return text[-chars:]


# ---- nccl-tests -----------------------------------------------------------------------------------
_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(-?\d+)\s+(.*)$")


def parse_all_reduce_perf(text):
    """all_reduce_perf's table -> {busbw_gbps, algbw_gbps, time_us, wrong, avg_busbw_gbps}.

    A row is `size count type redop root` then time/algbw/busbw/#wrong out of place and again in
    place. The bus bandwidth kept per size is the out-of-place one; #wrong is summed over both
    (N/A when the run did not check).
    """
    busbw, algbw, times, wrong, avg = {}, {}, {}, 0, None
    for line in text.splitlines():
        if line.startswith("#"):
            match = re.search(r"Avg bus bandwidth\s*:\s*([0-9.]+)", line)
            if match:
                avg = float(match.group(1))
            continue
        row = _ROW.match(line)
        if not row:
            continue
        rest = row.group(6).split()
        if len(rest) < 4:
            continue
        try:
            algbw[row.group(1)] = float(rest[1])
            busbw[row.group(1)] = float(rest[2])
            times[row.group(1)] = float(rest[0])
        except ValueError:
            continue
        for field in (rest[3], rest[7] if len(rest) >= 8 else "0"):
            if field.isdigit():
                wrong += int(field)
    return {"busbw_gbps": busbw, "algbw_gbps": algbw, "time_us": times, "wrong": wrong, "avg_busbw_gbps": avg}


def run_nccl_tests(perf, gpus, env, args):
    argv = [perf, "-b", str(args.min_bytes), "-e", str(args.max_bytes), "-f", "2", "-g", str(gpus),
            "-w", str(args.warmup), "-n", str(args.iters), "-c", "1"]
    rcs, outs, errs, timed_out = run_tree([argv], [env], args.timeout)
    if timed_out:
        return {"ok": False, "error": "all_reduce_perf did not finish in %d s (a hang: check ACS on the GPUs' PCIe path, "
                                      "NVIDIA/nccl#2079)" % args.timeout}
    parsed = parse_all_reduce_perf(outs[0] or "")
    if rcs[0] != 0:
        return dict(parsed, ok=False, error="all_reduce_perf exited %s: %s" % (rcs[0], tail(errs[0] or outs[0])))
    if not parsed["busbw_gbps"]:
        return dict(parsed, ok=False, error="all_reduce_perf printed no result rows: %s" % tail(outs[0]))
    if parsed["wrong"]:
        return dict(parsed, ok=False, error="all_reduce_perf found %d wrong values: this setting corrupts data" % parsed["wrong"])
    return dict(parsed, ok=True, error=None)


# ---- torch.distributed ------------------------------------------------------------------------------
def free_port():
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
    finally:
        sock.close()


def sizes(min_bytes, max_bytes):
    out, size = [], max(4, min_bytes)
    while size <= max_bytes:
        out.append(size)
        size *= 2
    return out


def nccl_version(torch):
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # pylint: disable=broad-except
        return None
    return ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)


def worker(args):
    """One rank: all_reduce each size, time it, check one sum; rank 0 prints the JSON line."""
    import torch  # pylint: disable=import-outside-toplevel,import-error
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel,import-error

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    busbw, algbw, times = {}, {}, {}
    check = torch.full((1024,), float(rank + 1), device="cuda")
    dist.all_reduce(check)
    torch.cuda.synchronize()
    expected = world * (world + 1) / 2.0
    wrong = int((check != expected).sum().item())
    for size in sizes(args.min_bytes, args.max_bytes):
        buf = torch.zeros(size // 4, dtype=torch.float32, device="cuda")
        for _step in range(args.warmup):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _step in range(args.iters):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        elapsed = torch.tensor([(time.perf_counter() - start) / args.iters], device="cuda")
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        seconds = float(elapsed.item())
        times[str(size)] = round(seconds * 1e6, 2)
        algbw[str(size)] = round(size / seconds / 1e9, 3)
        busbw[str(size)] = round(size / seconds / 1e9 * 2.0 * (world - 1) / world, 3)
        del buf
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({"busbw_gbps": busbw, "algbw_gbps": algbw, "time_us": times, "wrong": wrong,
                          "torch": torch.__version__, "nccl": nccl_version(torch)}))
    return 0


def run_torch(python, gpus, env, args):
    port = free_port()
    argv_list, envs = [], []
    for rank in range(gpus):
        env_r = dict(env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(gpus), MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
        argv_list.append([python, os.path.abspath(__file__), "--worker", "--min-bytes", str(args.min_bytes),
                          "--max-bytes", str(args.max_bytes), "--warmup", str(args.warmup), "--iters", str(args.iters)])
        envs.append(env_r)
    rcs, outs, errs, timed_out = run_tree(argv_list, envs, args.timeout)
    if timed_out:
        return {"ok": False, "error": "torch.distributed all_reduce did not finish in %d s (a hang: check ACS on the GPUs' "
                                      "PCIe path, NVIDIA/nccl#2079)" % args.timeout}
    failed = [(r, rc) for r, rc in enumerate(rcs) if rc != 0]
    if failed:
        rank = failed[0][0]
        return {"ok": False, "error": "rank %d exited %s: %s" % (rank, failed[0][1], tail(errs[rank] or outs[rank]))}
    lines = [ln for ln in (outs[0] or "").splitlines() if ln.startswith("{")]
    if not lines:
        return {"ok": False, "error": "rank 0 printed no result: %s" % tail(errs[0] or outs[0])}
    data = json.loads(lines[-1])
    if data.get("wrong"):
        return dict(data, ok=False, error="all_reduce gave %d wrong values: this setting corrupts data" % data["wrong"])
    busbw = list(data["busbw_gbps"].values())
    data["avg_busbw_gbps"] = round(sum(busbw) / len(busbw), 3) if busbw else None
    return dict(data, ok=True, error=None)


# ---- main -------------------------------------------------------------------------------------------
def parse_args(argv):
    parser = argparse.ArgumentParser(description="NCCL all-reduce bus bandwidth per candidate environment")
    parser.add_argument("--candidates", help="JSON file, or inline JSON: {name: {KEY: VALUE}}")
    parser.add_argument("--tool", choices=("auto", "nccl-tests", "torch"), default="auto")
    parser.add_argument("--all-reduce-perf", dest="perf", help="path of nccl-tests' all_reduce_perf")
    parser.add_argument("--python", default=sys.executable, help="interpreter with PyTorch for the torch tool")
    parser.add_argument("--min-bytes", type=int, default=1 << 13)
    parser.add_argument("--max-bytes", type=int, default=1 << 29)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--timeout", type=int, default=300, help="seconds per candidate before it counts as hung")
    parser.add_argument("--min-gpus", type=int, default=2)
    parser.add_argument("--gpus", default="", help="PCI addresses of the GPUs to measure (the tensor-parallel group), "
                                                   "comma-separated; default every GPU")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.worker and not args.candidates:
        parser.error("--candidates is required")
    if args.min_bytes < 4 or args.max_bytes < args.min_bytes:
        parser.error("need 4 <= --min-bytes <= --max-bytes")
    return args


def bench(args):
    report = {"tool": None, "gpus": 0, "gpu_names": [], "gpus_from": None, "skipped": None, "error": None, "no_tool": False,
              "results": {},
              "bench": {"min_bytes": args.min_bytes, "max_bytes": args.max_bytes, "warmup": args.warmup,
                        "iters": args.iters, "timeout": args.timeout, "gpus": args.gpus}}
    try:
        if args.candidates.lstrip().startswith("{"):
            candidates = json.loads(args.candidates)
        else:
            with open(args.candidates, encoding="utf-8") as fh:
                candidates = json.load(fh)
        if not isinstance(candidates, dict) or not all(isinstance(v, dict) for v in candidates.values()):
            raise ValueError("expected {name: {KEY: VALUE}}")
    except (OSError, ValueError) as err:
        report["error"] = "cannot read the candidates (%s): %s" % (tail(args.candidates, 80), err)
        return report

    gpus, names, how = count_gpus(args.python if args.tool != "nccl-tests" else None)
    report.update(gpus=gpus, gpu_names=names, gpus_from=how)
    visible = None
    wanted = [w.strip().lower() for w in (args.gpus or "").split(",") if w.strip()]
    if wanted:
        indexes, problem = select_gpus(wanted, count_gpus.bus_ids)
        if problem:
            report["error"] = problem + " (nvidia-smi names them)"
            return report
        visible = ",".join(str(i) for i in indexes)
        gpus = len(indexes)
        report.update(gpus=gpus, group=wanted, cuda_visible_devices=visible)
    if gpus < args.min_gpus:
        report["skipped"] = "A/B skipped: %d GPU(s)" % gpus
        return report

    perf = find_perf(args.perf) if args.tool in ("auto", "nccl-tests") else None
    if perf:
        report["tool"] = "nccl-tests"
    elif args.tool == "nccl-tests":
        report["error"] = "nccl-tests' all_reduce_perf not found (%s)" % (args.perf or "PATH, " + ", ".join(PERF_PLACES))
        report["no_tool"] = True
        return report
    elif has_torch(args.python):
        report["tool"] = "torch"
    else:
        report["error"] = ("neither nccl-tests' all_reduce_perf (PATH, %s) nor PyTorch for %s was found; install one "
                           "or point the role at them" % (", ".join(PERF_PLACES), args.python))
        report["no_tool"] = True
        return report

    for name in sorted(candidates):
        home = tempfile.mkdtemp(prefix="nccl-ab-")
        try:
            env = candidate_env(os.environ, candidates[name], home)
            if visible is not None:
                env["CUDA_VISIBLE_DEVICES"] = visible
            start = time.monotonic()
            if perf:
                result = run_nccl_tests(perf, gpus, env, args)
            else:
                result = run_torch(args.python, gpus, env, args)
            result["seconds"] = round(time.monotonic() - start, 1)
            result.setdefault("busbw_gbps", {})
            result.setdefault("avg_busbw_gbps", None)
            report["results"][name] = result
        finally:
            shutil.rmtree(home, ignore_errors=True)
    return report


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.worker:
        return worker(args)
    report = bench(args)
    report["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
