# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What gpufleet.inference.bench_history executes (``execute()``): store result documents in the history
(bench/history.py; an SQLite ``path`` or a PostgreSQL ``url``, bench/history_db.py), or read the series and render
the report (bench/history_report.py) and write its files
through the host's files (_host/files.py HostFS). Failures are raised as _host/result.py Failed with the result so
far, never fail_json-ed here.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from ansible_collections.gpufleet.inference.plugins.module_utils.bench import history as bh
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import history_report as hr
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import start_history
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.history_db import (
    DatabaseError, db_errors, is_url, parse_url, pg_error_text)
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed

from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host


def location(p: dict) -> tuple[str, str | None]:
    """Where the history is (the SQLite ``path`` or the PostgreSQL ``url``) and the password to give. A URL given as
    ``path`` is refused: ``path`` is logged (and expanded as a path), ``url`` is not."""
    if not p.get("url") and is_url(p["path"]):
        raise bh.HistoryError("path holds a postgresql:// URL: give it as url (which Ansible keeps out of its output "
                              "and logs, the password with it), and path only for an SQLite file")
    return (p.get("url") or p["path"]), p.get("password")


def where(p: dict) -> str:
    """The history named for messages: the file, or the database, host, port and user (no password)."""
    if p.get("url"):
        try:
            return f"in the {parse_url(p['url']).where}"
        except DatabaseError:
            return "(PostgreSQL)"
    return p["path"]


def _target(p: dict) -> dict[str, Any]:
    """Where an action writes: the SQLite file's path, or the PostgreSQL database and server (no credentials)."""
    if p.get("url"):
        loc = parse_url(p["url"])
        return {"database": loc.database, "server": f"{loc.host}:{loc.port}"}
    return {"path": p["path"]}


def _store_action(p: dict, doc: dict, run_id: int | None = None) -> dict[str, Any]:
    action = {"action": "store", **_target(p), "host": p["host"] or doc.get("host"), "source": p["source"],
              "finished_at": doc.get("finished_at")}
    if run_id is not None:
        action["run_id"] = run_id
    return action


def append(p: dict, check_mode: bool, warn: Callable[[str], None], result: dict) -> None:
    """Check the documents (skipping the invalid ones with a warning where ``skip_invalid`` allows it) and store
    them; the actions, ``run_ids``, ``added`` and ``schema_version`` go into ``result``."""
    docs = [(f"document {i}", d) for i, d in enumerate(p["documents"])]
    docs += bh.load_documents(p["results"])
    checked = []
    for where, doc in docs:
        try:
            bh.check_document(doc, where)
        except bh.HistoryError as err:
            if not (p["skip_invalid"] and where in p["results"]):
                raise
            warn(f"Not stored: {err}")
            continue
        checked.append((where, doc))
    docs = checked
    records = [bh.check_verdict(v, f"verdicts[{i}]") for i, v in enumerate(p.get("verdicts") or [])]
    if records and not p["host"]:
        raise bh.HistoryError("verdicts need host: the host whose change they judged")
    if check_mode:
        result["actions"] = [_store_action(p, doc) for _w, doc in docs]
        result["actions"] += [_verdict_action(p, v) for v in records]
        result["schema_version"] = bh.SCHEMA_VERSION
        return
    path, password = location(p)
    conn = bh.connect(path, password=password)
    try:
        for where, doc in docs:
            run_id, added = bh.append(conn, doc, host=p["host"], source=p["source"], gpu_driver=p["gpu_driver"],
                                      vllm_version=p["vllm_version"], profile=p["profile"], stage=p["stage"],
                                      where=where)
            result["run_ids"].append(run_id)
            if added:
                result["added"].append(run_id)
                result["actions"].append(_store_action(p, doc, run_id))
        for i, record in enumerate(records):
            verdict_id, added = bh.append_verdict(conn, record, p["host"], p["source"], f"verdicts[{i}]")
            if added:
                result["verdicts_added"].append(verdict_id)
                result["actions"].append(_verdict_action(p, record, verdict_id))
        result["schema_version"] = bh.schema_version(conn)
    finally:
        conn.close()


def _verdict_action(p: dict, record: dict, verdict_id: int | None = None) -> dict[str, Any]:
    action = {"action": "store_verdict", **_target(p), "host": p["host"], "source": p["source"],
              "stage": record["stage"], "verdict": record["verdict"]}
    if verdict_id is not None:
        action["verdict_id"] = verdict_id
    return action


def series(p: dict) -> tuple[list[dict[str, Any]], int]:
    """Every series of the hosts asked for (all hosts when none), and the file's schema version."""
    path, password = location(p)
    conn = bh.connect(path, create=False, password=password)
    try:
        out = []
        for host in (p["hosts"] or bh.hosts(conn)):
            out += bh.series(conn, host=host)
        return out, bh.schema_version(conn)
    finally:
        conn.close()


def report(p: dict, fs: HostFS, check_mode: bool, result: dict) -> None:
    """The drops (and for ``query`` the series); for ``report`` the Markdown and HTML files, each written only
    when its text changed."""
    found, version = series(p)
    model = hr.build(found, threshold=p["threshold"], alpha=p["alpha"], min_runs=p["min_runs"], cp_alpha=p["cp_alpha"])
    result.update(schema_version=version, drops=model["drops"], link_findings=model["links"])
    if p["state"] == "query":
        result["series"] = found
        path, password = location(p)
        conn = bh.connect(path, create=False, password=password)
        try:
            result["verdicts"] = [v for host in (p["hosts"] or [None]) for v in bh.verdicts(conn, host)]
        finally:
            conn.close()
        return
    files = {"history.md": hr.render_markdown(model, p["title"]), "history.html": hr.render_html(model, p["title"])}
    result["files"] = []
    for name, text in files.items():
        path = os.path.join(os.path.abspath(p["dest"]), name)
        current = fs.read_optional(path) if os.path.exists(path) else None
        if current is not None and current == text.rstrip("\n"):
            continue
        result["actions"].append({"action": "write", "path": path})
        result["files"].append(path)
        if not check_mode:
            fs.write_atomic(path, text, mode=0o644)


def start_noise(p: dict, result: dict) -> None:
    """The between-start noise of each series of the hosts asked for, of ``config_key`` and ``concurrency`` when
    given (bench/start_history.py); HistoryError when none matches (a typo in a host or key must not read as "no
    estimate")."""
    found, version = series(p)
    result["schema_version"] = version
    result["start_noise"] = start_history.for_series(found, p.get("config_key"), p.get("concurrency"))
    if not result["start_noise"]:
        asked = [f"hosts {', '.join(p['hosts'])}" if p["hosts"] else "any host"]
        asked += [f"config_key {p['config_key']}"] if p.get("config_key") else []
        asked += [f"concurrency {p['concurrency']}"] if p.get("concurrency") is not None else []
        keys = sorted({(s["host"], s["config_key"], s["concurrency"]) for s in found})
        known = "; ".join(f"{h} {k} c={c}" for h, k, c in keys[:20]) or "none"
        raise bh.HistoryError(f"no stored series of {', '.join(asked)} (the series stored for these hosts: {known}); "
                              "state=query lists every series with its config_key")
    result["between_start_sd"], result["reason"] = start_history.answer(result["start_noise"])


def execute(p: dict, host: Host, check_mode: bool) -> dict[str, Any]:
    """One run of the module: ``append``, ``report``, ``query`` or ``start_noise`` (report files through ``host.fs``,
    warnings through ``host.warn``). Raises Failed (with the result so far) when a document or the history is bad, or the report cannot
    be written."""
    fs, warn = host.fs, host.warn
    result: dict[str, Any] = {"changed": False, "actions": []}
    try:
        if p["state"] == "append":
            result.update(added=[], run_ids=[], verdicts_added=[])
            append(p, check_mode, warn, result)
        elif p["state"] == "start_noise":
            start_noise(p, result)
        elif p["state"] == "report" and check_mode and not p.get("url") and not os.path.exists(p["path"]):
            result.update(actions=[{"action": "write", "path": f"{p['dest']}/history.md"},
                                   {"action": "write", "path": f"{p['dest']}/history.html"}],
                          drops=[], link_findings=[], files=[], schema_version=bh.SCHEMA_VERSION, changed=True)
            return result
        else:
            report(p, fs, check_mode, result)
    except bh.HistoryError as err:
        raise Failed(f"Throughput history{'' if p.get('url') else ' ' + p['path']}: {err}", **result) from None
    except db_errors() as err:  # a statement after the history was opened: a lost connection, a revoked right
        text = pg_error_text(err)
        if p.get("url"):
            text = parse_url(p["url"], p.get("password")).scrub(text)
        raise Failed(f"Throughput history {where(p)}: {text}. What was stored before it is kept (each result is stored "
                     "in one transaction); run the task again.", **result) from None
    except HostFSError as err:
        raise Failed(f"Cannot write the history report under {p['dest']}: {err}. Check the directory's permissions.",
                     **result) from None
    result["changed"] = bool(result["actions"])
    return result
