# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One run of the inference_benchmark module: validate, probe (check mode) or benchmark, store, judge.

execute() takes the module's parameters and the Host (files, warnings) and returns its result; every failure is a
_host/result.py Failed carrying the result so far (run_module() ends the run through finish()). Check mode
asks the server for its models and sends no load; a stored result is one atomic, durable write.
"""

from __future__ import annotations

import json
import os
import platform
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.sweep import (
    BenchmarkError, benchmark, check_label, compact_summary, config_from_params, error_failure, plan, probe,
    result_warnings, results_document, results_filename, run,
)
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.model_identity import model_identity
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import server_start
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.transport import parse_endpoint
from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.link_samples import LinkMonitor, WithLinks, flapping_runs, path_devices
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.load_monitor import contaminated_runs, for_pool
from ansible_collections.gpufleet.inference.plugins.module_utils._pci.topology import PciWalker, TopologyError, select_targets

from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host


def link_devices(params: dict[str, Any], fs: HostFS) -> list[str]:
    """With monitor_links, the GPUs (class 03xx, BMC display functions left out) and every bridge above them, top
    first; none on a host without a GPU under /sys/bus/pci (a CPU host, the lab), which is benchmarked unsampled."""
    if not params.get("monitor_links"):
        return []
    try:
        return path_devices(fs, select_targets(PciWalker(fs), class_prefix="03"))
    except TopologyError:
        return []


def check_params(params: dict[str, Any]):
    """The benchmark's config and label from the module's parameters; Failed naming the bad setting."""
    try:
        cfg = config_from_params(params)
        label = check_label(params["label"])
        check_argv(params.get("server_argv"))
        if not 0.0 <= params["max_error_rate"] <= 1.0:
            raise ValueError(f"max_error_rate must be between 0 and 1, got {params['max_error_rate']}")
        if params["results_dir"] and not os.path.isabs(params["results_dir"]):
            raise ValueError(f"results_dir must be an absolute path, got {params['results_dir']!r}")
    except ValueError as err:
        raise Failed(f"Invalid benchmark settings: {err}", changed=False) from None
    return cfg, label


def check_argv(value: Any) -> list[str] | None:
    """``server_argv`` as a list of strings (None when not given); ValueError for anything else."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(a, str) for a in value):
        raise ValueError(f"server_argv must be the vLLM server's command line as a non-empty list of strings (the "
                         f"vllm_service role's rendered argv), got {value!r}")
    return list(value)


def identify(server: dict[str, Any], params: dict[str, Any], fs: HostFS, warn) -> dict[str, Any]:
    """The server's description with the model's identity (read under ``root`` from the directory the server
    reports) and the server's argv (``server_argv``, when given); a warning when the identity cannot be read."""
    server = dict(server)
    server["model_identity"] = model_identity(fs, server.get("root"))
    if "unreadable" in server["model_identity"]:
        warn(f"The model's identity (config, tokenizer and weight files) was not read: {server['model_identity']['unreadable']}. "
             "The gate compares this result by the served name, the model path and the rest of its workload only.")
    argv = check_argv(params.get("server_argv"))
    if argv is not None:
        server["argv"] = argv
    return server


def read_start(params: dict[str, Any], fs: HostFS) -> dict[str, Any]:
    """The start of the server process at ``url`` as this host's /proc says it (bench/server_start.py)."""
    endpoint = parse_endpoint(params["url"])
    return server_start.proc_start(fs, endpoint.host, endpoint.port)


def record_start(server: dict[str, Any], before: dict[str, Any], after: dict[str, Any] | None,
                 warn) -> dict[str, Any]:
    """``server`` with ``start``, the server process's start this benchmark measured (bench/server_start.py), in place
    of what /metrics said of it (``metrics_start``); a warning when the server restarted during the benchmark."""
    server = dict(server)
    said = server.pop("metrics_start", None) or {}
    first = server_start.metrics_start(said.get("at_start"), said.get("reason", ""))
    last = server_start.metrics_start(said.get("at_end"), "the server's /metrics was not read at the end")
    proc = server_start.identify(before, after)
    metrics = server_start.identify(first, last)
    server["start"] = server_start.choose(proc, metrics)
    if server_start.restarted(before, after) or server_start.restarted(first, last):
        warn(f"The server restarted during the benchmark ({proc.get('reason') or metrics.get('reason')}). Its runs "
             "are not one start's: the history leaves them out of the between-start noise estimate.")
    return server


def run_monitor(params: dict[str, Any], devices: list[str], fs: HostFS):
    """The per-run monitor factory for bench/sweep.py's benchmark(): the server's in-flight count (monitor_load) and
    the PCIe links of ``devices`` (link_devices(); none: no link sampling)."""
    load = for_pool if params["monitor_load"] else None
    if not devices:
        return load

    def both(pool, headers):
        return WithLinks(load(pool, headers) if load else None, LinkMonitor(fs, devices))
    return both


def execute(params: dict[str, Any], host: Host, check_mode: bool) -> dict[str, Any]:
    """The module's result (``diff`` empty: a benchmark changes no setting). Raises Failed with the result so far."""
    fs, warn = host.fs, host.warn
    cfg, label = check_params(params)
    kernel = platform.release()
    result: dict[str, Any] = dict(changed=False, actions=[], benchmarked=False, kernel=kernel, plan=plan(cfg),
                                  results_file=None, diff={})
    results_dir = params["results_dir"]

    def failed(msg: str) -> Failed:
        return Failed(msg, **{k: v for k, v in result.items() if k != "diff"})

    if check_mode:
        try:
            server = identify(run(probe(cfg)), params, fs, warn)
        except BenchmarkError as err:
            raise failed(str(err)) from None
        result["server"] = record_start(server, read_start(params, fs), None, warn)
        if results_dir:
            result["actions"] = [{"action": "write", "path": f"{results_dir}/{label}-{kernel}-<UTC time>.json"}]
        result["changed"] = bool(result["actions"])
        return result

    devices = link_devices(params, fs)
    result["links_monitored"] = devices
    before = read_start(params, fs)
    try:
        outcome = run(benchmark(cfg, monitor=run_monitor(params, devices, fs)))
    except BenchmarkError as err:
        raise failed(str(err)) from None
    outcome["server"] = record_start(identify(outcome["server"], params, fs, warn), before, read_start(params, fs), warn)
    doc = results_document(outcome, label=label, host=platform.node(), kernel=kernel, tuning=params["tuning"])
    result.update(benchmarked=True, server=outcome["server"], samples=outcome["samples"], summary=compact_summary(outcome),
                  contaminated=contaminated_runs(outcome["levels"]), benchmark=doc)

    if results_dir:
        path = os.path.join(results_dir, results_filename(label, kernel, outcome["finished_at"]))
        try:
            fs.write_atomic(path, json.dumps(doc, indent=2, sort_keys=True) + "\n", mode=0o644)
        except HostFSError as err:
            raise failed(f"The benchmark ran, but its results could not be stored: {err}. Check that results_dir "
                         "is on a writable file system and that the task runs as a user who may write there "
                         "(become: true).") from None
        result.update(results_file=path, actions=[{"action": "write", "path": path}], changed=True)

    for warning in result_warnings(outcome, cfg):
        warn(warning)
    if devices:
        result["link_flapping"] = flapping_runs(outcome["levels"])
        for f in result["link_flapping"]:
            warn(f"Critical: at concurrency {f['concurrency']}, run {f['repetition']} ({f['output_throughput']} output tok/s), "
                 f"the PCIe link of {', '.join(f['devices'])} changed speed or width: a marginal slot, riser or cable. "
                 "Its tok/s is not the host's; check AER counters and reseat before trusting a gate on this host.")
    failure = error_failure(outcome, params["max_error_rate"])
    if failure:
        raise failed(failure)
    return result
