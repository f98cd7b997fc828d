#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Device driver (not a test): the vllm_service role's vLLM on a real GPU, measured by the collection's client.

Subcommands (tests/tools/device_h200_vllm.sh chains them on the device tool's H200; every one also runs
here against the lab stand-in, extras/lab_inference_server.py, through a vllm_service_command override):

* ``render``: the argv and environment the role renders for a host, from roles/vllm_service/defaults,
  a host-vars file and a profile's overrides: the role's own ``__vllm_service_params`` mapping
  (tasks/main.yml) templated by Ansible, then the role's ``vllm_args`` filter. Nothing is re-spelled here.
* ``serve``: start a rendered command the way its systemd unit would (clean environment plus the rendered
  EnvironmentFile, WorkingDirectory, LimitNOFILE), under setsid (start_new_session), with the log beside it.
* ``ready``: wait for /health and /v1/models, watching the process.
* ``compare``: our client (inference_client, the inference_benchmark module's code) and ``vllm bench serve``
  in turns against one server, at each level; output tok/s and the client's CPU seconds per request.
* ``noise``: whole benchmark runs back to back per level and run length; CV, and the gate's simulated
  false-rollback and 5%-drop detection at that CV.
* ``gate``: interleaved A/B runs between two servers (or A/A on one), decided by throughput_gate.decide()
  at its defaults, adding candidate runs while it answers inconclusive.
* ``restarts``: server starts one after another, whole runs of each (noise between starts), the kernel upgrade's
  gate loop across a restart (h200_restarts.py); the server's tokenizer must round-trip before any run.
* ``tune``: the measured-tuning stages of a profiles file: each stage's server started beside the current one,
  gated, kept or reverted; the stage table from tests/tools/vllm_flag_stages.py.

Every result is a JSON file written as soon as it is known (a killed call still leaves the finished parts).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
for _path in (os.path.join(REPO, ".collections"), REPO, os.path.join(REPO, "tests", "benchmarks"), HERE):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from tests.tools import inference_client as ic  # noqa: E402
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import throughput_gate as tg  # noqa: E402
from tests.tools import vllm_flag_stages as vfs  # noqa: E402
from tests.tools.client_truth import rotation  # noqa: E402

# the environment systemd gives a unit before its EnvironmentFile= lines (systemd.exec(5): PATH, LANG)
SYSTEMD_BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
# what the device image needs to find its driver and CUDA (a real host has them in ld.so.conf); inherited
# from the caller, and recorded as such in the server's record
INHERITED_ENV = ("LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES")


def dump(path: str, data) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True, default=str)
    os.replace(tmp, path)


def load(path: str, default=None):
    if default is not None and not os.path.exists(path):
        return default
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


# ---- render ----------------------------------------------------------------------------------------
def role_vars(host_vars: str, overrides: dict) -> dict:
    from ansible.parsing.dataloader import DataLoader
    loader = DataLoader()
    variables = dict(loader.load_from_file(os.path.join(REPO, "roles/vllm_service/defaults/main.yml")))
    variables.pop("vllm_service_controller_cache", None)  # a lookup on the controller; not a serving setting
    variables.update(loader.load_from_file(host_vars) or {})
    variables.update(overrides)
    return variables


def render(host_vars: str, overrides: dict) -> dict:
    """The role's rendered command for a host: tasks/main.yml's parameter mapping, templated, through the filter."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template
    from ansible_collections.gpufleet.inference.plugins.filter.vllm_args import FilterModule
    loader = DataLoader()
    tasks = loader.load_from_file(os.path.join(REPO, "roles/vllm_service/tasks/main.yml"))
    task = next(t for t in tasks if "__vllm_service_params" in (t.get("vars") or {}))
    mapping = {k: trust_as_template(v) if isinstance(v, str) else v for k, v in task["vars"]["__vllm_service_params"].items()}
    variables = role_vars(host_vars, overrides)
    params = Templar(loader=loader, variables=variables).template(mapping)
    out = FilterModule().filters()["vllm_args"](json.loads(json.dumps(params, default=str)))
    keep = ("argv", "exec_start", "environment", "env_file", "ready_url", "served_model_name", "port", "uses_vllm",
            "unit_settings")
    rendered = {k: out[k] for k in keep}
    rendered.update(overrides=overrides, base_dir=variables["vllm_service_base_dir"],
                    state_dir=variables["vllm_service_state_dir"], limit_nofile=int(variables["vllm_service_limit_nofile"]))
    return json.loads(json.dumps(rendered, default=str))


def cmd_render(args) -> int:
    with open(args.profiles, encoding="utf-8") as fh:
        import yaml
        prof = yaml.safe_load(fh)
    os.makedirs(args.out, exist_ok=True)
    extra = {k: _yaml(v) for k, v in (s.split("=", 1) for s in args.set)}
    for name, overrides in prof["profiles"].items():
        r = render(args.host_vars, {**extra, **overrides})
        dump(os.path.join(args.out, f"{name}.json"), r)
        print(name, r["exec_start"])
    return 0


def _yaml(text: str):
    import yaml
    return yaml.safe_load(text)


# ---- serve / ready / stop ---------------------------------------------------------------------------
def serve(rendered: dict, log: str, venv: str | None = None) -> dict:
    """Start the rendered command as its unit would, in a new session; returns the server record."""
    if rendered["uses_vllm"]:
        venv = venv or os.path.dirname(os.path.dirname(sys.executable))
        os.makedirs(rendered["base_dir"], exist_ok=True)
        link = os.path.join(rendered["base_dir"], "current")
        if os.path.islink(link) and os.readlink(link) != venv:
            os.unlink(link)
        if not os.path.islink(link):
            os.symlink(venv, link)  # the role's install links its venv here
    os.makedirs(rendered["state_dir"], exist_ok=True)
    env = dict(SYSTEMD_BASE_ENV)
    inherited = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
    env.update(inherited)
    env.update(rendered["environment"])
    for key, value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
        if env.get(key) != value:
            raise SystemExit(f"refusing to start: {key} is {env.get(key)!r} in the rendered environment, not {value!r} "
                             "(NVLink multicast stays off on these machines)")
    nofile = rendered["limit_nofile"]
    # systemd.exec(5) CPUAffinity= from the role's vllm_service_unit_settings; without it a unit gets every
    # CPU (the driver itself may run pinned elsewhere, e.g. under taskset, and a child would inherit that)
    cpus = cpu_list(str((rendered.get("unit_settings") or {}).get("CPUAffinity", ""))) or set(range(os.cpu_count() or 1))

    def limits() -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = nofile if hard == resource.RLIM_INFINITY else min(nofile, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(hard, want) if hard != resource.RLIM_INFINITY else hard))
        os.sched_setaffinity(0, cpus)

    fh = open(log, "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(rendered["argv"], env=env, cwd=rendered["state_dir"], stdout=fh, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=limits)
    SERVERS[rendered["ready_url"]] = proc.pid
    return {"pid": proc.pid, "argv": rendered["argv"], "url": rendered["ready_url"], "log": log,
            "environment": rendered["environment"], "inherited_env": sorted(inherited), "started": time.time(),
            "cpu_affinity": sorted(cpus), "unit_settings": rendered.get("unit_settings") or {}}


def cpu_list(text: str) -> set[int]:
    """A systemd CPU list ("0-11", "0 2 4", "0,1,8-15") as a set of CPU numbers; empty text gives an empty set."""
    cpus: set[int] = set()
    for part in text.replace(",", " ").split():
        low, _sep, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


# ---- what the server and the host did during a run (read from /proc, Linux) --------------------------------
SERVERS: dict[str, int] = {}  # url -> pid of a server this driver started (its process group), or --server-record
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def group_cpu(pgid: int | None) -> dict[str, float]:
    """CPU seconds (user + system) of each live process in process group ``pgid``, keyed "pid:comm"."""
    out: dict[str, float] = {}
    if not pgid:
        return out
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="utf-8", errors="replace") as fh:
                data = fh.read()
        except OSError:
            continue
        comm = data[data.index("(") + 1:data.rindex(")")]
        fields = data[data.rindex(")") + 2:].split()
        if int(fields[2]) == pgid:  # pgrp; utime and stime are fields 14 and 15 of stat(5)
            out[f"{name}:{comm}"] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def host_stat() -> list[int]:
    """The aggregate ``cpu`` line of /proc/stat: user nice system idle iowait irq softirq steal (ticks)."""
    with open("/proc/stat", encoding="utf-8") as fh:
        return [int(v) for v in fh.readline().split()[1:9]]


class Watch:
    """Server CPU (its process group) and host CPU (busy, steal) between two points in time."""

    def __init__(self, url: str) -> None:
        self.pgid = SERVERS.get(url)
        self.t0 = time.time()
        self.cpu0 = group_cpu(self.pgid)
        self.stat0 = host_stat()

    def result(self, requests: int) -> dict:
        cpu1 = group_cpu(self.pgid)
        stat1 = host_stat()
        wall = max(time.time() - self.t0, 1e-9)
        by_proc = {k: round(v - self.cpu0.get(k, 0.0), 3) for k, v in cpu1.items() if v - self.cpu0.get(k, 0.0) > 0.005}
        total = sum(by_proc.values())
        d = [b - a for a, b in zip(self.stat0, stat1)]
        ticks = max(sum(d), 1)
        return {"server_pid": self.pgid, "server_cpu_s": round(total, 3),
                "server_cpu_s_per_request": round(total / max(requests, 1), 6),
                "server_cpu_by_process": by_proc, "server_cores_busy": round(total / wall, 3),
                "host_busy_pct": round(100.0 * (ticks - d[3] - d[4]) / ticks, 2), "host_steal_pct": round(100.0 * d[7] / ticks, 3),
                "wall_s": round(wall, 3)}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def ready(url: str, pid: int | None, timeout: float) -> dict:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if pid and not alive(pid):
            return {"ready": False, "why": f"process {pid} exited", "wait_s": round(time.time() - t0, 1)}
        try:
            with urllib.request.urlopen(url + "/health", timeout=3) as r1, urllib.request.urlopen(url + "/v1/models", timeout=3) as r2:
                if r1.status == 200 and r2.status == 200:
                    return {"ready": True, "wait_s": round(time.time() - t0, 1), "models": json.load(r2)}
        except OSError:
            pass
        time.sleep(1)
    return {"ready": False, "why": f"not ready after {timeout:g} s", "wait_s": round(time.time() - t0, 1)}


def stop(pid: int, wait: float = 40) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except OSError:
        return
    t0 = time.time()
    while time.time() - t0 < wait and alive(pid):
        time.sleep(0.5)
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    time.sleep(1)


def cmd_serve(args) -> int:
    rec = serve(load(args.rendered), args.log, args.venv)
    rec["ready"] = ready(rec["url"], rec["pid"], args.timeout)
    dump(args.record, rec)
    print(json.dumps({k: rec[k] for k in ("pid", "url", "ready")}, default=str)[:400])
    return 0 if rec["ready"]["ready"] else 1


# ---- measuring --------------------------------------------------------------------------------------
class RunWatch:
    """inference_client.benchmark()'s ``monitor``: a Watch over each measured run's own window."""

    def __init__(self, url: str, requests: int) -> None:
        self.url, self.requests, self.watch = url, requests, None

    async def start(self) -> None:
        self.watch = Watch(self.url)

    async def stop(self, _level: int) -> dict:
        return self.watch.result(self.requests) if self.watch else {}

    def close(self) -> None:
        self.watch = None


def run_once(url: str, level: int, requests: int, seed: int, args, warmup: int = 0, repetitions: int = 1,
             per_chunk_usage: bool | None = None, prompt_mode: str = "token_ids") -> dict:
    """One ic.benchmark call; its runs with the client's CPU (getrusage of this process) around it, and
    the server's CPU (its process group) and the host's busy and steal time over each run's window."""
    pcu = getattr(args, "per_chunk_usage", DEFAULT_PER_CHUNK_USAGE) if per_chunk_usage is None else per_chunk_usage
    cfg = ic.BenchmarkConfig(url=url, prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
                             concurrency=[level], requests=requests, warmup=warmup, repetitions=repetitions, seed=seed,
                             timeout=600, per_chunk_usage=pcu, prompt_mode=prompt_mode,
                             **{k: getattr(args, k) for k in WORKLOAD_KEYS if getattr(args, k, None)})
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    call = Watch(url)
    result = ic.run(ic.benchmark(cfg, monitor=lambda _pool, _headers: RunWatch(url, requests)))
    call_load = call.result(requests * repetitions + warmup + 1)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    lv = result["levels"][0]
    runs = []
    for run in lv["runs"]:
        window_cpu = run["client_cpu_pct"] / 100.0 * run["duration_s"]
        runs.append({"output_throughput": run["output_throughput"], "duration_s": run["duration_s"],
                     "requests": requests, "errors": run["errors"], "client_cpu_pct": run["client_cpu_pct"],
                     "client_cpu_s_per_request": round(window_cpu / requests, 6),
                     "ttft_ms": run["ttft_ms"], "tpot_ms": run["tpot_ms"], "itl_ms": run["itl_ms"],
                     "itl_exact": run.get("itl_exact"), "tokens_per_chunk": run.get("tokens_per_chunk"),
                     "per_chunk_usage": pcu, "prompt_mode": prompt_mode,
                     "prompt_tokens": run.get("prompt_tokens"), "server_load": run.get("server_load"),
                     **{k: run[k] for k in ("goodput", "arrivals", "e2el_ms", "output_tokens", "error_reasons") if k in run}})
    return {"runs": runs, "process_cpu_s": round(cpu, 3), "process_cpu_s_per_request": round(cpu / (requests * repetitions + warmup), 6),
            "call_load": call_load, "server": {k: result["server"].get(k) for k in ("model", "max_model_len", "root")}}


class VllmBench:
    """``vllm bench serve`` in one long-lived process (this script's ``vllmbench-worker``): vLLM is imported once
    (10-15 s of CPU, which was inside every run's process CPU before), then each run is vLLM's own
    ``serve.main()`` on that run's arguments, and its result dictionary comes back with the worker's CPU."""

    def __init__(self, python: str = sys.executable) -> None:
        self.proc = subprocess.Popen([python, os.path.abspath(__file__), "vllmbench-worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)

    def run(self, argv: list[str]) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"argv": argv}) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith("@@RESULT "):
                got = json.loads(line[len("@@RESULT "):])
                if got.get("error"):
                    raise SystemExit(f"vllm bench serve failed: {got['error']}\nargv: {' '.join(argv)}")
                return got
        raise SystemExit(f"the vllm bench worker ended (rc {self.proc.wait()}) before its result")

    def close(self) -> None:
        close_worker(self.proc)


def close_worker(proc: subprocess.Popen) -> None:
    """A worker process that reads its runs from stdin: its stdin closed (it ends after the run in hand), killed
    if it has not ended 30 s later."""
    if proc.stdin:
        proc.stdin.close()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def vllm_bench_argv(args, url: str, level: int, requests: int, seed: int, model: str, tokenizer: str) -> list[str]:
    """The workload of our client, spelled for ``vllm bench serve`` (as tests/benchmarks/bench_client_vs_vllm.py)."""
    return ["--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions", "--model", model,
            "--tokenizer", tokenizer, "--dataset-name", "random", "--random-input-len", str(args.prompt_tokens),
            "--random-output-len", str(args.output_tokens), "--random-range-ratio", "0", "--ignore-eos",
            "--num-prompts", str(requests), "--max-concurrency", str(level), "--request-rate", "inf",
            "--seed", str(seed), "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--num-warmups", str(args.warmup), "--temperature", "0", "--disable-tqdm"]


def cmd_vllmbench_worker(_args) -> int:
    """Read one JSON line {"argv": [...]} per run from stdin; answer each with one ``@@RESULT {json}`` line."""
    from vllm.benchmarks import serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    parser = FlexibleArgumentParser(prog="vllm bench serve")
    serve.add_cli_args(parser)
    keep = ("output_throughput", "duration", "completed", "total_input_tokens", "total_output_tokens", "median_ttft_ms", "p99_ttft_ms",
            "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms", "request_throughput")
    for line in sys.stdin:
        argv = json.loads(line)["argv"]
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.time()
        try:
            res, error = serve.main(parser.parse_args(argv)) or {}, None
        except (Exception, SystemExit) as err:  # noqa: BLE001 - reported to the driver, which stops
            res, error = {}, f"{type(err).__name__}: {err}"
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        out = {k: res.get(k) for k in keep}
        out.update(error=error, wall_s=round(time.time() - t0, 3),
                   cpu_s=round((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), 3))
        sys.stdout.write("@@RESULT " + json.dumps(out, default=str) + "\n")
        sys.stdout.flush()
    return 0


# our client: per-chunk usage on or off, and (ours_text) words instead of token IDs as the prompt, which the server must
# tokenize as it does vllm bench serve's random prompts
# Our client's request shapes as (per-chunk usage, prompt mode). "ours" is the collection's default request (the
# inference_benchmark module's and the gate's), read from the client's config so that it cannot drift from it;
# "ours_usage" asks for per-chunk usage (stream_options.continuous_usage_stats: exact ITL, more work for vLLM's API
# server per token), "ours_text" sends text prompts. Files of the second to sixth sessions call the default request
# "ours_no_usage"; those of the second, fourth, ninth and tenth sessions call the per-chunk usage request "ours"
# (the report names each client by what its runs recorded: h200_report.request_label()).
DEFAULT_PER_CHUNK_USAGE = ic.BenchmarkConfig.__dataclass_fields__["per_chunk_usage"].default
CLIENTS = {"ours": (DEFAULT_PER_CHUNK_USAGE, "token_ids"), "ours_usage": (True, "token_ids"), "ours_text": (False, "text")}


def cmd_compare(args) -> int:
    """Our client (its default request and the other shapes of CLIENTS asked for) and vllm bench serve in turns, at
    each level.

    Round r runs the clients in an order rotated by r; every client gets that round's seed, so no client
    meets prompts that an earlier run left in vLLM's prefix cache."""
    out = load(args.out, {"levels": {}, "settings": vars(args)})
    rc = compare_rounds(out, args, lambda: dump(args.out, out))
    dump(args.out, out)
    return rc


def compare_rounds(out: dict, args, save) -> int:
    """The rounds of cmd_compare into ``out["levels"]`` (resumable: what is there is kept), against ``args.url``;
    ``save()`` after every run; 3 when ``args.deadline`` stopped it."""
    with urllib.request.urlopen(args.url + "/v1/models", timeout=10) as resp:
        entry = json.load(resp)["data"][0]
    model, tokenizer = entry["id"], args.tokenizer or entry.get("root")
    clients = list(args.clients)
    bench = VllmBench(args.vllm_python) if "vllm" in clients else None
    try:
        for i, level in enumerate(args.concurrency):
            requests = (args.requests[i] if args.requests else args.requests_per_slot * level)
            rec = out["levels"].setdefault(str(level), {"requests": requests, **{c: [] for c in clients}})
            if getattr(args, "level_warmup", False) and "warmup" not in rec:
                # one unrecorded run of the round's size first: the server's first runs at a new level are slower
                # (the ninth session's c=256 rounds 0-1), and the first client of round 0 would pay for it alone
                rec["warmup"] = run_once(args.url, level, requests, args.seed + 99, args)["runs"][0]
                save()
            for rnd in range(args.rounds):
                if time.time() > args.deadline:
                    out["deadline_hit"] = True
                    save()
                    return 3
                seed = args.seed + 100 * rnd + level
                for who in rotation(rnd, clients):
                    if len(rec.get(who, [])) > rnd:
                        continue  # done by an earlier call (the command is resumable)
                    if time.time() > args.deadline:
                        out["deadline_hit"] = True
                        save()
                        return 3
                    if who in CLIENTS:
                        got = run_once(args.url, level, requests, seed, args, warmup=args.warmup,
                                       per_chunk_usage=CLIENTS[who][0], prompt_mode=CLIENTS[who][1])
                        run = dict(got["runs"][0], process_cpu_s=got["process_cpu_s"],
                                   process_cpu_s_per_request=got["process_cpu_s_per_request"], call_load=got["call_load"],
                                   round=rnd, seed=seed)
                    else:
                        watch = Watch(args.url)
                        argv = vllm_bench_argv(args, args.url, level, requests, seed, model, tokenizer)
                        try:
                            res = bench.run(argv)
                        except SystemExit as err:  # once: a fresh worker (vLLM imported again), then give up
                            print("vllm bench worker failed, starting another:", str(err)[-600:], flush=True)
                            bench.close()
                            bench = VllmBench(args.vllm_python)
                            watch = Watch(args.url)
                            res = bench.run(argv)
                        run = {"output_throughput": round(res["output_throughput"], 3), "duration_s": res["duration"],
                               "errors": requests - (res["completed"] or 0), "ttft_p50_ms": res["median_ttft_ms"],
                               "ttft_p99_ms": res["p99_ttft_ms"], "tpot_p50_ms": res["median_tpot_ms"],
                               "tpot_p99_ms": res["p99_tpot_ms"], "itl_p50_ms": res["median_itl_ms"],
                               "total_output_tokens": res["total_output_tokens"],
                               "total_input_tokens": res.get("total_input_tokens"), "process_cpu_s": res["cpu_s"],
                               "process_cpu_s_per_request": round(res["cpu_s"] / requests, 6),
                               "process_wall_s": res["wall_s"], "call_load": watch.result(requests + args.warmup + 1),
                               "round": rnd, "seed": seed}
                    rec.setdefault(who, []).append(run)
                    save()
                    print("compare", level, who, rnd, run["output_throughput"], run.get("client_cpu_s_per_request"),
                          run["process_cpu_s_per_request"], run["call_load"]["server_cpu_s_per_request"],
                          run["call_load"]["host_steal_pct"], flush=True)
                if "ours" in rec and "vllm" in rec:
                    rec.update(vfs.compare_summary(rec["ours"], rec["vllm"]))
                for who in CLIENTS:
                    if who != "ours" and who in rec and "vllm" in rec:
                        rec[who.removeprefix("ours_")] = vfs.compare_summary(rec[who], rec["vllm"])
                save()
    finally:
        if bench:
            bench.close()
    save()
    return 0


def cmd_noise(args) -> int:
    out = load(args.out, {"cells": [], "settings": vars(args)})
    done = {(c["concurrency"], c["requests"]) for c in out["cells"]}
    for level in args.concurrency:
        for slots in args.lengths:
            requests = slots * level
            if (level, requests) in done:
                continue
            if time.time() > args.deadline:
                out["deadline_hit"] = True
                dump(args.out, out)
                return 3
            got = run_once(args.url, level, requests, args.seed + requests, args, warmup=args.warmup,
                           repetitions=args.runs)
            cell = {"concurrency": level, "requests": requests, "runs": got["runs"],
                    "process_cpu_s": got["process_cpu_s"]}
            cell.update(vfs.noise_cell([r["output_throughput"] for r in got["runs"]],
                                       [r["duration_s"] for r in got["runs"]]))
            out["cells"].append(cell)
            print("noise", level, requests, cell["cv"], cell["median"], flush=True)
            dump(args.out, out)
    return 0


class Hog:
    """CPU contention as a regression of known kind: one busy loop per CPU the server may run on
    (its affinity), each pinned to its CPU, for the length of a candidate run; stopped after it (and, as
    children in this process's session, with the device call if it is killed)."""

    def __init__(self, pid: int | None, per_cpu: int = 1) -> None:
        self.cpus = sorted(os.sched_getaffinity(pid or 0))
        self.per_cpu = per_cpu
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> "Hog":
        for cpu in self.cpus * self.per_cpu:
            self.procs.append(subprocess.Popen(
                [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"]))
        return self

    def __exit__(self, *_exc) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait()
        self.procs = []


def gate_ab(base_url: str, cand_url: str, level: int, requests: int, args, label: str, during=None) -> dict:
    """Interleaved runs (baseline, candidate, ...) until decide() is not inconclusive or the cap.

    ``during``: a context manager factory wrapped around each candidate run (the CPU hog)."""
    base: list[dict] = []
    cand: list[dict] = []
    for url in sorted({base_url, cand_url}):
        run_once(url, level, requests, 7, args, warmup=max(args.warmup, level))  # warm each server's path once
    seed = 1000
    want = args.min_runs
    decision = None
    while True:
        while len(cand) < want:
            if time.time() > args.deadline:
                return {"label": label, "deadline_hit": True, "baseline_runs": base, "candidate_runs": cand,
                        "decision": decision}
            seed += 1
            base.append(run_once(base_url, level, requests, seed, args)["runs"][0])
            seed += 1
            if during is None:
                cand.append(run_once(cand_url, level, requests, seed, args)["runs"][0])
            else:
                with during():
                    cand.append(run_once(cand_url, level, requests, seed, args)["runs"][0])
        decision = tg.decide([r["output_throughput"] for r in base], [r["output_throughput"] for r in cand],
                             min_runs=args.min_runs, max_runs=args.max_runs, order="interleaved")
        print("gate", label, len(base), len(cand), decision["decision"], round(decision["ratio"] or 0, 4),
              decision["p_value"], flush=True)
        if decision["decision"] != "inconclusive" or not decision["runs_needed"]:
            break
        want = len(cand) + decision["runs_needed"]
    return {"label": label, "concurrency": level, "requests": requests, "baseline_url": base_url,
            "settings": {"threshold": 0.95, "min_runs": args.min_runs, "max_runs": args.max_runs, "order": "interleaved"},
            "candidate_url": cand_url, "baseline_runs": base, "candidate_runs": cand,
            "decision": {k: decision[k] for k in ("decision", "ratio", "p_value", "p_value_pass", "decided_by",
                                                  "reason", "warnings", "ci")}}


def start_profile(rendered: dict, logdir: str, name: str, timeout: float) -> dict:
    rec = serve(rendered, os.path.join(logdir, f"server-{name}.log"))
    rec["ready"] = ready(rec["url"], rec["pid"], timeout)
    return rec


def cmd_gate(args) -> int:
    """A/A on the baseline, then each named regression profile against it (server started, gated, stopped)."""
    out = load(args.out, {"gates": [], "settings": vars(args)})
    # a case cut off by an earlier call's deadline is measured again from the start, in place of that record
    out["gates"] = [g for g in out["gates"] if not g.get("deadline_hit") or g["label"] not in args.candidates]
    done = {g["label"] for g in out["gates"] if not g.get("deadline_hit")}
    level, requests = args.concurrency[0], args.requests_per_slot * args.concurrency[0]
    if "A/A" not in done and not args.skip_aa:
        out["gates"].append(gate_ab(args.url, args.url, level, requests, args, "A/A"))
        dump(args.out, out)
    for name in args.candidates:
        # a candidate server takes 40-70 s to start on the H200 and 10 interleaved runs about a minute more
        if name in done or time.time() > args.deadline - args.candidate_s:
            continue
        if name == "hog":  # the baseline server itself, with its CPUs busy during each candidate run
            pid = (load(args.server_record) or {}).get("pid") if args.server_record else None
            g = gate_ab(args.url, args.url, level, requests, args, name,
                        during=lambda: Hog(pid, args.hog_per_cpu))  # noqa: B023 - used before the next iteration
            g.update(hog={"cpus": sorted(os.sched_getaffinity(pid or 0)), "per_cpu": args.hog_per_cpu, "server_pid": pid})
            out["gates"].append(g)
            dump(args.out, out)
            continue
        rendered = load(os.path.join(args.rendered_dir, f"{name}.json"))
        rec = start_profile(rendered, args.logdir, name, args.start_timeout)
        try:
            if not rec["ready"]["ready"]:
                out["gates"].append({"label": name, "server": rec, "error": "server not ready"})
            else:
                g = gate_ab(args.url, rendered["ready_url"], level, requests, args, name)
                g.update(argv=rendered["argv"], start_wait_s=rec["ready"]["wait_s"])
                out["gates"].append(g)
        finally:
            stop(rec["pid"])
        dump(args.out, out)
    return 0


def cmd_tune(args) -> int:
    """The stages of the profiles file, one at a time, each gated against the current (kept) configuration."""
    import yaml
    with open(args.profiles, encoding="utf-8") as fh:
        stages = yaml.safe_load(fh)["stages"]
    state = load(args.out, {"records": [], "current": {"vars": {}, "url": args.url, "pid": None, "name": "baseline"},
                            "settings": vars(args)})
    level = args.concurrency[0]
    table_levels = args.table_levels
    pending = state.pop("pending", None)
    if pending and pending.get("pid"):  # a stage server left by a call killed at its limit: stop it, run it again
        stop(pending["pid"])
    if state["current"].get("pid"):
        SERVERS[state["current"]["url"]] = state["current"]["pid"]
    if not state["records"]:  # the baseline's own figures at every table level
        levels = {str(c): run_once(args.url, c, args.requests_per_slot * c, 11 + c, args, warmup=c)["runs"]
                  for c in table_levels}
        state["records"].append({"stage": "baseline", "changed": {}, "levels": levels, "gate": None})
        dump(args.out, state)
    port = 8100 + len(state["records"])
    for stage in stages[len(state["records"]) - 1:]:
        if time.time() > args.deadline - 150:  # a stage server starts in 40-70 s, its gate runs take a minute more
            state["deadline_hit"] = True
            break
        cur = state["current"]
        cand_vars = {**cur["vars"], **stage["vars"], "vllm_service_port": port}
        port += 1
        rendered = render(args.host_vars, {**{k: _yaml(v) for k, v in (s.split("=", 1) for s in args.set)}, **cand_vars})
        state["pending"] = {"pid": None, "port": cand_vars["vllm_service_port"]}
        rec = start_profile(rendered, args.logdir, f"stage{len(state['records'])}", args.start_timeout)
        state["pending"]["pid"] = rec["pid"]
        dump(args.out, state)
        entry = {"stage": stage["name"], "changed": stage["vars"], "argv": rendered["argv"], "levels": {}, "gate": None,
                 "start_wait_s": rec["ready"]["wait_s"]}
        if not rec["ready"]["ready"]:
            entry["error"] = rec["ready"]["why"]
            stop(rec["pid"])
            state.pop("pending", None)
            state["records"].append(entry)
            dump(args.out, state)
            continue
        entry["gate"] = gate_ab(cur["url"], rendered["ready_url"], level, args.requests_per_slot * level, args, stage["name"])
        for c in table_levels:
            if c != level and time.time() < args.deadline - 30:
                entry["levels"][str(c)] = run_once(rendered["ready_url"], c, args.requests_per_slot * c, 21 + c, args,
                                                   warmup=c)["runs"]
        entry["levels"][str(level)] = entry["gate"]["candidate_runs"]
        verdict = (entry["gate"].get("decision") or {}).get("decision")
        entry["kept"] = verdict == "pass"  # inconclusive reverts (measured tuning's default)
        if entry["kept"]:
            if cur["pid"]:
                stop(cur["pid"])
            state["current"] = {"vars": {k: v for k, v in cand_vars.items() if k != "vllm_service_port"},
                                "url": rendered["ready_url"], "pid": rec["pid"], "name": stage["name"]}
        else:
            stop(rec["pid"])
        state.pop("pending", None)
        state["records"].append(entry)
        state["table"] = vfs.stage_table(state["records"], level)
        dump(args.out, state)
        print("stage", stage["name"], verdict, entry["kept"], flush=True)
    state["table"] = vfs.stage_table(state["records"], level)
    dump(args.out, state)
    return 0


# ---- noise between server starts, and the kernel upgrade's gate across a restart ----------------------------------
def server_roundtrip(url: str, model: str, words: str = "w5 w77 w31999 w100000") -> dict:
    """The server's own tokenizer, asked through /tokenize and /detokenize: a prompt of words must come back as a
    non-empty ID list and decode to itself (a Qwen2Tokenizer built from a word-level vocabulary encodes every word
    to nothing, and the server then refuses every text prompt)."""
    def post(path: str, body: dict) -> dict:
        req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.load(resp)
    out: dict = {"prompt": words}
    try:
        ids = post("/tokenize", {"model": model, "prompt": words, "add_special_tokens": False}).get("tokens") or []
        back = post("/detokenize", {"model": model, "tokens": ids}).get("prompt") if ids else None
        out.update(ids=ids, decoded=back)
    except OSError as err:
        out.update(ids=[], decoded=None, error=f"{type(err).__name__}: {err}")
    out["ok"] = bool(out["ids"]) and (out.get("decoded") or "").strip() == words
    return out


def plan_entry(entry: str) -> dict:
    """A --plan entry: PROFILE[/OPTION,OPTION...], options eq=record|compare, runs=N, cells=0|1|I.J.., swap=/DIR,
    cmp=ROUNDS.

    eq: the output-equivalence module against this start (record: the reference and its A/A; compare: against the
    reference recorded earlier). runs: runs at the gate level (default --runs; more while a gate asks). cells: the
    --cells after them (0: none, 1: all, the default; I.J.. or I.: those of the --cells by index, "2." for cell 2 alone:
    a bare 0 or 1 means none or all). cmp: that many paired rounds of our client against vllm bench serve
    (compare_rounds()) after the gate level's runs. swap: DIR is served at the profile's model path for this start
    (renamed in, and back once the start is done), so that the reference's model identity (served name, path, tokenizer) matches a
    corrupted copy of the same model."""
    profile, rest = (entry.split("/", 1) + [""])[:2]
    opts = rest.split(",") if rest else []
    out: dict = {"profile": profile, "eq": None, "runs": None, "cells": True, "swap": None, "cmp": 0}
    for opt in opts:
        key, value = (opt.split("=", 1) + [""])[:2]
        if key == "eq" and value in ("record", "compare"):
            out["eq"] = value
        elif key == "runs" and value.isdigit():
            out["runs"] = int(value)
        elif key == "cells" and value in ("0", "1"):
            out["cells"] = value == "1"
        elif key == "cells" and "." in value and all(v.isdigit() for v in value.rstrip(".").split(".")):
            out["cells"] = [int(v) for v in value.rstrip(".").split(".")]  # "2." is cell 2 alone, "0.1" cells 0 and 1
        elif key == "swap" and value.startswith("/"):
            out["swap"] = value
        elif key == "cmp" and value.isdigit():
            out["cmp"] = int(value)
        else:
            raise SystemExit(f"--plan {entry!r}: option {opt!r} is not eq=record|compare, runs=N, cells=0|1|I.J..|I., "
                             "swap=/DIR or cmp=ROUNDS")
    return out


# the workload profile of a cell (bench/profiles.py), as BenchmarkConfig takes it
WORKLOAD_KEYS = ("profile", "profile_options", "arrivals", "goodput")


def cell_args(args, cell: str):
    """LEVELxPROMPT/OUTPUT[@PROFILE[=OPTIONS]][~ARRIVALS] as (level, a copy of args with those lengths and that
    workload): e.g. 16x2048/256, 64x512/256@shared_prefix={"prefix_tokens":1536} (1,536 shared tokens and 512 of
    each request's own), 32x0/256@mixed_lengths={"preset":"document"}~{"mode":"poisson","rate":6} (OPTIONS and
    ARRIVALS are JSON without spaces, checked by bench/profiles.py before any run)."""
    from ansible_collections.gpufleet.inference.plugins.module_utils.bench import profiles as bp
    head, _sep, arrivals = cell.partition("~")
    head, _at, workload = head.partition("@")
    level, lengths = (head.split("x", 1) + [""])[:2]
    prompt, output = (lengths.split("/", 1) + [""])[:2]
    if not (level.isdigit() and prompt.isdigit() and output.isdigit()):
        raise SystemExit(f"--cells {cell!r}: not LEVELxPROMPT/OUTPUT[@PROFILE[=JSON]][~JSON], e.g. 16x2048/256")
    name, _eq, options = workload.partition("=")
    extra = {"profile": name or None, "profile_options": json.loads(options) if options else None,
             "arrivals": json.loads(arrivals) if arrivals else None}
    try:
        bp.check_profile(extra["profile"], extra["profile_options"])
        bp.check_arrivals(extra["arrivals"])
    except (bp.ProfileError, ValueError) as err:
        raise SystemExit(f"--cells {cell!r}: {err}") from err
    return int(level), argparse.Namespace(**{**vars(args), "prompt_tokens": int(prompt), "output_tokens": int(output),
                                             **extra})


def swap_model(model: str, other: str, back: bool) -> None:
    """Serve ``other`` at ``model``'s path (rename both), or put them back."""
    aside = model.rstrip("/") + ".aside"
    if not back and not os.path.exists(aside):
        os.rename(model, aside)
        os.rename(other, model)
    elif back and os.path.exists(aside):
        os.rename(model, other)
        os.rename(aside, model)


def equivalence(st: dict, mode: str, logdir: str) -> dict:
    """The collection's output_equivalence module against a start's server, run as Ansible runs it (its args file)."""
    args_file = os.path.join(logdir, f"equiv-args-start{st['index']}.json")
    params = {"url": st["url"], "model": st["served_model_name"], "mode": mode, "reference": os.path.join(logdir, "equiv-reference.json"),
              "overwrite": mode == "record", "timeout": 120}
    dump(args_file, {"ANSIBLE_MODULE_ARGS": params})
    t0 = time.time()
    proc = subprocess.run([sys.executable, os.path.join(REPO, "plugins", "modules", "output_equivalence.py"), args_file],
                          capture_output=True, text=True, timeout=900, check=False)
    try:
        result = json.loads(proc.stdout)
    except ValueError:
        result = {"failed": True, "msg": "no JSON from the module", "stdout": proc.stdout[-4000:], "stderr": proc.stderr[-4000:]}
    result["seconds"] = round(time.time() - t0, 1)
    result["params"] = params
    dump(os.path.join(logdir, f"equiv-start{st['index']}.json"), result)
    return result


def compare_args(args, st: dict, rounds: int):
    """The compare settings of a restart's cmp=ROUNDS: --compare-levels with --compare-requests at --compare-lengths."""
    prompt, output = (int(x) for x in args.compare_lengths.split("/"))
    return argparse.Namespace(**{**vars(args), "url": st["url"], "concurrency": args.compare_levels,
                                 "requests": args.compare_requests, "rounds": rounds, "prompt_tokens": prompt,
                                 "output_tokens": output, "clients": args.compare_clients, "warmup": 0, "seed": 0,
                                 "level_warmup": True})


def cmd_restarts(args) -> int:
    """Server starts one after another (one server on the GPU at a time, as on a host with one model), each with whole
    runs at the gate's level (and, time permitting, at --extra-levels); resumable from --out.

    Before any run of a start the server's tokenizer must round-trip (server_roundtrip), else nothing is measured.
    A start's runs at the gate level go on past --runs while the kernel upgrade's gate loop (h200_restarts.upgrade_gate)
    over a --gates pair would ask for more of them, up to the cap. Servers run under setsid, so a start can go on in the
    next device call when this one reaches its deadline."""
    import h200_restarts as hr
    out = load(args.out, {"starts": [], "settings": vars(args)})
    # a later call may extend the plan and the pairs (the starts already made keep their index)
    if out["settings"].get("plan") != args.plan[:len(out["settings"].get("plan") or [])]:
        raise SystemExit(f"--plan {args.plan} does not extend the stored plan {out['settings'].get('plan')}")
    out["settings"].update(plan=args.plan, gates=args.gates)
    entries = [plan_entry(e) for e in args.plan]
    cells = [(c, *cell_args(args, c)) for c in args.cells]
    level = args.concurrency[0]
    requests = args.requests_per_slot * level
    pairs = [tuple(int(x) for x in g.split(":")) for g in args.gates]
    cap = max(hr.UPGRADE_GATE["max_runs"], args.runs)

    def runs_wanted(i: int) -> int:
        return args.runs if entries[i]["runs"] is None else entries[i]["runs"]

    def runs_of(i: int) -> list[float]:
        return [r["output_throughput"] for r in out["starts"][i]["levels"].get(str(level), [])] if i < len(out["starts"]) else []

    def wants_more(i: int) -> bool:
        n = len(runs_of(i))
        if n < runs_wanted(i):
            return True
        if n >= cap or runs_wanted(i) == 0:
            return False
        for b, c in pairs:
            if i in (b, c) and max(b, c) <= i:  # both sides' starts exist by now (this one is the later)
                need = hr.upgrade_gate(runs_of(b), runs_of(c)).get("needs")
                if need and (b if need["side"] == "baseline" else c) == i:
                    return True
            elif i == b:  # the baseline of a later start: enough for the baseline's own judgement
                need = hr.upgrade_gate(runs_of(b), []).get("needs")
                if need and need["side"] == "baseline":
                    return True
        return False

    def stop_others(keep: int) -> None:
        for j, st in enumerate(out["starts"]):
            if j != keep and st.get("pid") and not st.get("stopped"):
                stop(st["pid"])
                st["stopped"] = True
        dump(args.out, out)

    def left() -> float:
        return args.deadline - time.time()

    for i, entry in enumerate(entries):
        profile = entry["profile"]
        if i < len(out["starts"]) and out["starts"][i].get("done"):
            continue
        if i == len(out["starts"]):
            if left() < args.start_budget:
                out["deadline_hit"] = True
                dump(args.out, out)
                print(f"restarts: {left():.0f} s left, too little to start server {i} ({profile})", flush=True)
                return 3
            stop_others(i)
            rendered = load(os.path.join(args.rendered_dir, f"{profile}.json"))
            if entry["swap"]:
                swap_model(rendered["argv"][rendered["argv"].index("--model") + 1], entry["swap"], back=False)
            rec = serve(rendered, os.path.join(args.logdir, f"server-start{i}-{profile}.log"))
            out["starts"].append({"index": i, "profile": profile, "argv": rendered["argv"], "pid": rec["pid"],
                                  "url": rendered["ready_url"], "served_model_name": rendered["served_model_name"],
                                  "started": rec["started"], "cpu_affinity": rec["cpu_affinity"], "levels": {}})
            dump(args.out, out)
        st = out["starts"][i]
        SERVERS[st["url"]] = st["pid"]
        if not (st.get("ready") or {}).get("ready"):
            st["ready"] = ready(st["url"], st["pid"], max(5.0, min(args.start_timeout - (time.time() - st["started"]), left())))
            dump(args.out, out)
            print("restarts: start", i, profile, st["ready"].get("ready"), st["ready"].get("wait_s"), flush=True)
            if not st["ready"]["ready"]:
                if alive(st["pid"]) and time.time() - st["started"] < args.start_timeout:
                    return 3  # still starting at the deadline: the next call waits on
                st.update(done=True, error=st["ready"].get("why"))
                stop(st["pid"])
                st["stopped"] = True
                if entry["swap"]:
                    swap_model(st["argv"][st["argv"].index("--model") + 1], entry["swap"], back=True)
                dump(args.out, out)
                continue
            st["ready"]["since_start_s"] = round(time.time() - st["started"], 1)
        if "roundtrip" not in st:
            st["roundtrip"] = server_roundtrip(st["url"], st["served_model_name"])
            dump(args.out, out)
            print("restarts: tokenizer round trip", json.dumps(st["roundtrip"]), flush=True)
        if not st["roundtrip"]["ok"]:
            stop(st["pid"])
            st.update(stopped=True, done=True, error="the server's tokenizer does not round-trip: nothing measured")
            dump(args.out, out)
            raise SystemExit(f"start {i}: {st['error']}: {st['roundtrip']}")
        if entry["eq"] and "equivalence" not in st:
            eq = equivalence(st, entry["eq"], args.logdir)
            st["equivalence"] = {k: eq.get(k) for k in ("verdict", "reason", "failed", "msg", "seconds", "figures", "band", "aa", "tolerance", "params")}
            dump(args.out, out)
            print("restarts: start", i, profile, "equivalence", entry["eq"], json.dumps(st["equivalence"])[:600], flush=True)
        if "warmup" not in st:
            st["warmup"] = run_once(st["url"], level, 2 * level, 7, args, warmup=0)["runs"][0]
            dump(args.out, out)
        seed = 1000 + 100 * i
        while wants_more(i):
            runs = st["levels"].setdefault(str(level), [])
            need_s = (runs[-1]["duration_s"] if runs else st["warmup"]["duration_s"]) * 1.2 + 3
            if left() < need_s:
                out["deadline_hit"] = True
                dump(args.out, out)
                return 3
            runs.append(run_once(st["url"], level, requests, seed + len(runs), args)["runs"][0])
            dump(args.out, out)
            print("restarts: start", i, profile, "c", level, len(runs), runs[-1]["output_throughput"], runs[-1]["errors"],
                  flush=True)
        if entry["cmp"]:
            cmp = st.setdefault("compare", {"levels": {}})
            if compare_rounds(cmp, compare_args(args, st, entry["cmp"]), lambda: dump(args.out, out)) == 3:
                out["deadline_hit"] = True
                dump(args.out, out)
                return 3
        # the cells (LEVELxPROMPT/OUTPUT[@PROFILE]) and the extra levels (at the gate level's lengths), to --extra-runs
        chosen = cells if entry["cells"] is True else [cells[k] for k in entry["cells"] or []]
        work = [(key, lv, ca, 70) for key, lv, ca in chosen]
        work += [(str(lv), lv, args, 50) for lv in args.extra_levels]
        for key, extra, cargs, offset in work:
            runs = st["levels"].setdefault(key, [])
            while len(runs) < args.extra_runs:
                need_s = (runs[-1]["duration_s"] * 1.2 + 3) if runs else 30
                if left() < need_s + args.reserve_s:  # the next call goes on with this start's cells (never done short)
                    out["deadline_hit"] = True
                    dump(args.out, out)
                    return 3
                runs.append(run_once(st["url"], extra, args.requests_per_slot * extra, seed + offset + len(runs), cargs,
                                     warmup=extra if not runs else 0)["runs"][0])
                dump(args.out, out)
                print("restarts: start", i, profile, "cell", key, len(runs), runs[-1]["output_throughput"], flush=True)
        st["done"] = True
        if i < len(args.plan) - 1:
            stop(st["pid"])
            st["stopped"] = True
        if entry["swap"]:
            swap_model(st["argv"][st["argv"].index("--model") + 1], entry["swap"], back=True)
        dump(args.out, out)
    # the summaries (h200_report.py recomputes them from the runs)
    base_starts = [runs_of(i) for i, e in enumerate(entries) if e["profile"] == entries[0]["profile"] and i < len(out["starts"])]
    if len([s for s in base_starts if len(s) >= 2]) >= 2:
        out["between_starts"] = hr.between_starts([s for s in base_starts if len(s) >= 2])
    out["gates"] = [{"baseline_start": b, "candidate_start": c, **hr.upgrade_gate(runs_of(b), runs_of(c))} for b, c in pairs
                    if c < len(out["starts"])]
    for g in out["gates"]:
        print("restarts: gate", g["baseline_start"], "->", g["candidate_start"], g.get("decision"), g.get("needs"),
              (g.get("gate") or {}).get("ratio"), flush=True)
    dump(args.out, out)
    return 0


def _terminated(signum, _frame):
    raise SystemExit(128 + signum)


def main() -> int:
    signal.signal(signal.SIGTERM, _terminated)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("render")
    r.add_argument("--host-vars", required=True)
    r.add_argument("--profiles", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--set", action="append", default=[], help="VAR=YAML, over every profile (a local stand-in command)")
    s = sub.add_parser("serve")
    s.add_argument("--rendered", required=True)
    s.add_argument("--log", required=True)
    s.add_argument("--record", required=True)
    s.add_argument("--venv")
    s.add_argument("--timeout", type=float, default=400)
    for name in ("compare", "noise", "gate", "tune", "restarts"):
        q = sub.add_parser(name)
        q.add_argument("--url", default="http://127.0.0.1:8000")
        q.add_argument("--out", required=True)
        q.add_argument("--concurrency", type=int, nargs="+", default=[16, 64, 256])
        q.add_argument("--requests-per-slot", type=int, default=8, help="requests per run = this x concurrency")
        q.add_argument("--prompt-tokens", type=int, default=256)
        q.add_argument("--output-tokens", type=int, default=128)
        q.add_argument("--warmup", type=int, default=32)
        q.add_argument("--seed", type=int, default=0)
        q.add_argument("--per-chunk-usage", dest="per_chunk_usage", action="store_true",
                       help="our client asks for stream_options.continuous_usage_stats (exact ITL; not the default)")
        q.add_argument("--no-per-chunk-usage", dest="per_chunk_usage", action="store_false",
                       help="our client without stream_options.continuous_usage_stats (as vllm bench serve sends)")
        q.set_defaults(per_chunk_usage=DEFAULT_PER_CHUNK_USAGE)
        q.add_argument("--deadline", type=float, default=time.time() + 3600, help="epoch seconds: stop starting work")
        q.add_argument("--min-runs", type=int, default=5)
        q.add_argument("--max-runs", type=int, default=15)
        q.add_argument("--logdir", default="/tmp")
        q.add_argument("--rendered-dir", default="")
        q.add_argument("--start-timeout", type=float, default=300)
        q.add_argument("--server-record", default="",
                       help="serve's record of the server at --url (its pid: the server's CPU per run, the hog's CPUs)")
        if name == "compare":
            q.add_argument("--rounds", type=int, default=3)
            q.add_argument("--clients", nargs="+", default=["ours", "ours_usage", "vllm"], choices=[*CLIENTS, "vllm"])
            q.add_argument("--requests", type=int, nargs="+", help="requests per run at each level (else per slot)")
            q.add_argument("--vllm-python", default=sys.executable, help="the python that imports vLLM (its worker)")
            q.add_argument("--tokenizer")
        if name == "noise":
            q.add_argument("--runs", type=int, default=8)
            q.add_argument("--lengths", type=int, nargs="+", default=[2, 8], help="run lengths, requests per slot")
        if name == "gate":
            q.add_argument("--candidates", nargs="*", default=["eager", "seqs8", "hog"],
                           help="profiles of the rendered dir, and 'hog' (CPU contention on the baseline's CPUs)")
            q.add_argument("--candidate-s", type=float, default=150, help="seconds a candidate needs; skipped with less left")
            q.add_argument("--hog-per-cpu", type=int, default=1)
            q.add_argument("--skip-aa", action="store_true", help="no A/A first (measured before on this setup)")
        if name == "tune":
            q.add_argument("--profiles", required=True)
            q.add_argument("--host-vars", required=True)
            q.add_argument("--table-levels", type=int, nargs="+", default=[16, 64, 256])
            q.add_argument("--set", action="append", default=[])
        if name == "restarts":
            q.add_argument("--plan", nargs="+", required=True, help="the rendered profile of each server start, in order")
            q.add_argument("--gates", nargs="*", default=[], help="BASELINE:CANDIDATE start indices, gated as the kernel upgrade")
            q.add_argument("--runs", type=int, default=8, help="runs of each start at the gate level (more while a gate asks)")
            q.add_argument("--extra-levels", type=int, nargs="*", default=[], help="levels measured after the gate level")
            q.add_argument("--extra-runs", type=int, default=6)
            q.add_argument("--cells", nargs="*", default=[], help="LEVELxPROMPT/OUTPUT cells after the gate level (e.g. 16x2048/256)")
            q.add_argument("--start-budget", type=float, default=170, help="seconds left needed to start another server")
            q.add_argument("--reserve-s", type=float, default=0, help="seconds kept back: a cell's run that would eat into them is left to the next call")
            q.add_argument("--compare-levels", type=int, nargs="+", default=[16, 64, 256], help="cmp=: the levels")
            q.add_argument("--compare-requests", type=int, nargs="+", default=[64, 256, 512], help="cmp=: requests a run")
            q.add_argument("--compare-lengths", default="512/256", help="cmp=: PROMPT/OUTPUT tokens")
            q.add_argument("--compare-clients", nargs="+", default=["ours", "vllm"], choices=[*CLIENTS, "vllm"],
                           help="cmp=: the clients in turns (ours: the collection's default request)")
            q.add_argument("--tokenizer", help="cmp=: the tokenizer vllm bench serve loads (default: the server's root)")
            q.add_argument("--vllm-python", default=sys.executable, help="cmp=: the python that imports vLLM")
    sub.add_parser("vllmbench-worker", help="vllm bench serve runs from stdin (compare starts it)")
    args = p.parse_args()
    if getattr(args, "server_record", "") and os.path.exists(args.server_record):
        SERVERS[args.url] = load(args.server_record)["pid"]
    return {"vllmbench-worker": cmd_vllmbench_worker, "render": cmd_render, "serve": cmd_serve, "compare": cmd_compare, "noise": cmd_noise, "gate": cmd_gate,
            "tune": cmd_tune, "restarts": cmd_restarts}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
