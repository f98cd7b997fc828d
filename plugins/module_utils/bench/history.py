# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The throughput history: every benchmark result document the collection produces, in one SQLite file or one
PostgreSQL database (bench/history_db.py: the same statements, schema and migrations on both).

One row per benchmark (``runs``) with where and under what it was taken (host, time, kernel, GPU
driver, vLLM version, model, tuning state, the benchmark profile and source) and the full result
JSON; one row per concurrency level (``levels``) with the per-run output tok/s samples and the
latency percentiles the report draws. A *configuration* is what was measured (model, prompt and
output tokens, request count, prompt mode, ignore_eos, profile): runs of one host, configuration
and concurrency level form one series, and the change-point rule (bench/changepoint.py) judges each
series. Kernel, driver, vLLM version and tuning are what *changed* between runs: the report
annotates them, they are not part of the configuration.

With each run, the PCIe link findings of its measured runs (inference_benchmark's ``monitor_links``: the GPUs'
and their bridges' links sampled during each run) go into ``link_findings``, one row per measured run and device,
with that run's output tok/s: a link that changed speed or width during the run (``link_flapping``, critical) or
stayed below what both ends can do under load (``link_below_capability``). ``runs.links_sampled`` says whether the
links were sampled at all, so that "no finding" and "not looked" differ.

The schema is versioned (``schema_version``); ``MIGRATIONS`` upgrade an older file in place in one
transaction each, so a history written by an earlier release keeps its rows. Appends are
idempotent: a document's SHA-256 is unique, so feeding the same result file twice stores it once.
Standard library only for SQLite (sqlite3); pg8000 for PostgreSQL. Runs on the controller.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any, Callable, Iterable, Union

from ansible_collections.gpufleet.inference.plugins.module_utils.bench.history_db import (
    Database, DatabaseError, db_errors, is_url, open_database, pg_error_text)
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.workload import LEGACY_PROFILE

FORMAT = "gpufleet.bench_history/1"
SOURCES = ("site", "tune_measured", "kernel_upgrade", "vllm_upgrade", "driver_upgrade", "nccl_change", "health",
           "on_demand")

LINK_FLAPPING = "link_flapping"
LINK_DOWN = "link_below_capability"


def link_findings(doc: dict[str, Any]) -> tuple[bool, list[dict[str, Any]]]:
    """Whether a result document's links were sampled, and its link findings: per measured run and device whose
    links verdict (``levels[].runs[].server_load.links.devices``) is ``flapping`` (critical) or ``stays_down``
    (critical when the width is down, warning when only the speed is), with that run's output tok/s."""
    sampled, out = False, []
    for level in doc.get("levels") or []:
        for rep, run in enumerate(level.get("runs") or []):
            links = (run.get("server_load") or {}).get("links")
            if not isinstance(links, dict):
                continue
            sampled = True
            for device, verdict in sorted((links.get("devices") or {}).items()):
                finding = _link_finding(verdict)
                if finding:
                    top = verdict.get("top") or [None, None]
                    out.append(dict(finding, concurrency=int(level["concurrency"]), repetition=int(run.get("repetition", rep)),
                                    device=device, top_speed_gts=top[0], top_width=top[1], changes=verdict.get("changes"),
                                    output_tps=run.get("output_throughput")))
    return sampled, out


def _link_finding(verdict: dict[str, Any]) -> dict[str, str] | None:
    state = verdict.get("state")
    if state == "flapping":
        return {"code": LINK_FLAPPING, "severity": "critical"}
    if state == "stays_down":
        top, cap = verdict.get("top") or [None, None], verdict.get("cap") or {}
        narrow = top[1] is not None and cap.get("width") is not None and top[1] < cap["width"]
        return {"code": LINK_DOWN, "severity": "critical" if narrow else "warning"}
    return None


def _insert_link_findings(db: Database, run_id: int, doc: dict[str, Any]) -> None:
    sampled, findings = link_findings(doc)
    db.execute("UPDATE runs SET links_sampled = ? WHERE id = ?", (int(sampled), run_id))
    for f in findings:
        db.execute("INSERT INTO link_findings (run_id, concurrency, repetition, device, code, severity, top_speed_gts, "
                   "top_width, changes, output_tps) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                   "ON CONFLICT (run_id, concurrency, repetition, device) DO UPDATE SET code = excluded.code, "
                   "severity = excluded.severity, top_speed_gts = excluded.top_speed_gts, top_width = excluded.top_width, "
                   "changes = excluded.changes, output_tps = excluded.output_tps",
                   (run_id, f["concurrency"], f["repetition"], f["device"], f["code"], f["severity"],
                    _real(f["top_speed_gts"]), f["top_width"], f["changes"], _real(f["output_tps"])))


def _backfill_link_findings(db: Database) -> None:
    """Migration 3: the link findings of the runs already stored, from their result JSON (monitor_links results
    stored before the history kept them)."""
    for row in db.query("SELECT id, result_json FROM runs ORDER BY id"):
        try:
            doc = json.loads(row["result_json"])
        except ValueError:
            continue
        if isinstance(doc, dict):
            _insert_link_findings(db, int(row["id"]), doc)


def server_start_of(doc: dict[str, Any]) -> str | None:
    """The server start a result document measured (``server.start.id``, bench/server_start.py); None when unknown or
    stored before results had it."""
    start = (doc.get("server") or {}).get("start")
    value = start.get("id") if isinstance(start, dict) else None
    return value if isinstance(value, str) and value else None


def _backfill_server_start(db: Database) -> None:
    """Migration 5: the server start of the runs already stored, from their result JSON."""
    for row in db.query("SELECT id, result_json FROM runs ORDER BY id"):
        try:
            doc = json.loads(row["result_json"])
        except ValueError:
            continue
        start = server_start_of(doc) if isinstance(doc, dict) else None
        if start is not None:
            db.execute("UPDATE runs SET server_start = ? WHERE id = ?", (start, int(row["id"])))


# (version, steps): SQL statements, or functions of the database that run inside the step's transaction.
# Statements are in bench/history_db.py's common form: ``{id}`` the run id column, ``{real}`` a double precision
# number (SQLite's REAL, PostgreSQL's DOUBLE PRECISION: PostgreSQL's REAL is single precision), ``?`` placeholders.
# On SQLite they render to the statements released before PostgreSQL was supported, byte for byte.
# Never edit a released step; add the next one.
MIGRATIONS: list[tuple[int, list[Union[str, Callable[[Database], None]]]]] = [
    (1, [
        """CREATE TABLE runs (
            {id},
            digest TEXT NOT NULL UNIQUE,
            host TEXT NOT NULL,
            started_at TEXT,
            finished_at TEXT NOT NULL,
            source TEXT NOT NULL,
            label TEXT,
            kernel TEXT,
            gpu_driver TEXT,
            vllm_version TEXT,
            model TEXT,
            tuning_json TEXT NOT NULL,
            tuning_key TEXT NOT NULL,
            config_json TEXT NOT NULL,
            config_key TEXT NOT NULL,
            result_json TEXT NOT NULL)""",
        "CREATE INDEX runs_host_config ON runs (host, config_key, finished_at)",
        """CREATE TABLE levels (
            run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            concurrency INTEGER NOT NULL,
            output_tps_median {real},
            output_tps_cv {real},
            samples_json TEXT NOT NULL,
            ttft_p50_ms {real}, ttft_p99_ms {real}, tpot_p50_ms {real}, tpot_p99_ms {real},
            errors INTEGER,
            PRIMARY KEY (run_id, concurrency))""",
    ]),
    # 2: the benchmark profile (serving, latency, long_context) and the tuning stage a run measured.
    (2, [
        "ALTER TABLE runs ADD COLUMN profile TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE runs ADD COLUMN stage TEXT NOT NULL DEFAULT ''",
        "CREATE INDEX runs_profile ON runs (host, profile, finished_at)",
    ]),
    # 3: the PCIe link findings of each measured run (monitor_links), with that run's tok/s.
    (3, [
        "ALTER TABLE runs ADD COLUMN links_sampled INTEGER NOT NULL DEFAULT 0",
        """CREATE TABLE link_findings (
            run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            concurrency INTEGER NOT NULL,
            repetition INTEGER NOT NULL,
            device TEXT NOT NULL,
            code TEXT NOT NULL,
            severity TEXT NOT NULL,
            top_speed_gts {real},
            top_width INTEGER,
            changes INTEGER,
            output_tps {real},
            PRIMARY KEY (run_id, concurrency, repetition, device))""",
        _backfill_link_findings,
    ]),
    # 4: the serving verdict of each change (a kernel upgrade, a tuning stage): its answer, each part's word, and the
    # whole verdict with its parts' figures and reasons.
    (4, [
        """CREATE TABLE verdicts (
            {id},
            digest TEXT NOT NULL UNIQUE,
            host TEXT NOT NULL,
            source TEXT NOT NULL,
            stage TEXT NOT NULL,
            decided_at TEXT NOT NULL,
            verdict TEXT NOT NULL,
            keep INTEGER NOT NULL,
            reason TEXT NOT NULL,
            throughput TEXT, latency TEXT, outputs TEXT, stability TEXT,
            verdict_json TEXT NOT NULL)""",
        "CREATE INDEX verdicts_host ON verdicts (host, decided_at)",
    ]),
    # 5: the server start each run measured (inference_benchmark's server.start.id), backfilled from the stored
    # documents that have it; null where unknown: the between-start noise estimate groups runs by it.
    (5, [
        "ALTER TABLE runs ADD COLUMN server_start TEXT",
        _backfill_server_start,
    ]),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]
VERDICT_PARTS = ("throughput", "latency", "outputs", "stability")  # bench/verdict.py PARTS, the table's columns

CONFIG_KEYS = ("model", "prompt_tokens", "output_tokens", "requests", "prompt_mode", "ignore_eos")


class HistoryError(Exception):
    """A history file that cannot be used, or a document that is not a benchmark result."""


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _key(value: Any) -> str:
    return hashlib.sha256(_canonical(value).encode()).hexdigest()[:16]


def schema_version(db: Database) -> int:
    """The history's schema version; 0 for a new one."""
    if not db.has_table("schema_version"):
        return 0
    return int(db.scalar("SELECT MAX(version) AS version FROM schema_version") or 0)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def migrate(db: Database) -> list[int]:
    """Bring the history to SCHEMA_VERSION in one write transaction; returns the steps applied.

    The version is read under the writers' lock (SQLite's BEGIN IMMEDIATE, PostgreSQL's advisory lock): the hosts of
    a play append to one history at once (delegate_to: localhost), and two of them migrating a new file side by side
    failed with "duplicate column name" when each read version 0 before the other wrote."""
    applied = []
    with db.write():
        current = schema_version(db)
        if current > SCHEMA_VERSION:
            raise HistoryError(f"the history has schema version {current}, newer than this collection's "
                               f"{SCHEMA_VERSION}: update gpufleet.inference on the controller, or point the history at "
                               "another file or database")
        for version, statements in MIGRATIONS:
            if version <= current:
                continue
            if version == 1:
                db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at TEXT)")
            for step in statements:
                if callable(step):
                    step(db)
                else:
                    db.execute(step)
            db.execute("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (version, _now()))
            applied.append(version)
    return applied


def connect(location: str, create: bool = True, password: str | None = None) -> Database:
    """Open (and migrate) the history: the SQLite file at ``location``, or the PostgreSQL database its
    ``postgresql://`` URL names (``password`` wins over the URL's); HistoryError saying why it cannot be used, naming
    the file, or the host and database, never a password."""
    sqlite = not is_url(location)
    if sqlite and not create and not os.path.exists(location):
        raise HistoryError(f"no throughput history at {location}: run a benchmark with the history enabled first")
    if sqlite and create:
        os.makedirs(os.path.dirname(os.path.abspath(location)), exist_ok=True)
    try:
        db = open_database(location, password)
    except DatabaseError as err:
        raise HistoryError(str(err)) from None
    try:
        if not create and not db.has_table("schema_version"):
            raise HistoryError(f"no throughput history in {db.where if sqlite else 'the ' + db.where}: run a benchmark "
                               "with the history enabled first")
        db.ready()
        migrate(db)
    except db_errors() as err:
        db.close()
        hint = ("Is it an SQLite file written by gpufleet.inference? Move it away to start a new history." if sqlite else
                "Does the user own the database, or hold CREATE on its schema? Give the history a database of its own.")
        text = str(err) if sqlite else db.loc.scrub(pg_error_text(err))
        named = db.where if sqlite else f"the {db.where}"
        raise HistoryError(f"cannot use {named} as the throughput history: {text}. {hint}") from None
    except BaseException:
        db.close()
        raise
    return db


def config_of(doc: dict[str, Any], profile: str = "") -> dict[str, Any]:
    """The configuration a result measured (not where or under what it ran)."""
    cfg = doc.get("config") or {}
    out = {k: cfg.get(k) for k in CONFIG_KEYS}
    out["model"] = (doc.get("server") or {}).get("model") or cfg.get("model")
    out["profile"] = profile
    out.update(workload_shape(cfg))
    return out


def workload_shape(cfg: dict[str, Any]) -> dict[str, Any]:
    """The request profile and arrivals of a result's config (bench/profiles.py), as the fingerprint's
    ``workload_profile`` and ``arrivals``: {} for unique random prompts in a closed loop, what every result stored
    before profiles measured, so their series go on; a run of another profile or an open loop is a series of its own."""
    shape = {"workload_profile": cfg.get("profile") if isinstance(cfg.get("profile"), dict) else None,
             "arrivals": cfg.get("arrivals") if isinstance(cfg.get("arrivals"), dict) else None}
    if all(shape[k] in (None, legacy) for k, legacy in LEGACY_PROFILE.items()):
        return {}
    return {k: shape[k] or LEGACY_PROFILE[k] for k in shape}


def check_document(doc: Any, where: str = "document") -> dict[str, Any]:
    """A benchmark result as inference_benchmark writes it, or HistoryError naming what is missing."""
    if not isinstance(doc, dict):
        raise HistoryError(f"{where} is a {type(doc).__name__}, not a benchmark result (a JSON object)")
    fmt = str(doc.get("format") or "")
    if not fmt.startswith("gpufleet.inference_benchmark/"):
        raise HistoryError(f"{where} has format {fmt or 'none'!r}, not gpufleet.inference_benchmark/N: only results "
                           "of gpufleet.inference.inference_benchmark go into the history")
    for key in ("levels", "finished_at", "config"):
        if key not in doc:
            raise HistoryError(f"{where} has no {key!r}: it is not a complete benchmark result")
    return doc


def append(db: Database, doc: dict[str, Any], host: str | None = None, source: str = "on_demand",
           gpu_driver: str | None = None, vllm_version: str | None = None, profile: str = "", stage: str = "",
           kernel: str | None = None, where: str = "document") -> tuple[int, bool]:
    """Store one result document; returns (run id, added). The same document twice is stored once (also when two
    controllers or the hosts of a play store it at the same moment: the look-up and the insert hold the writers' lock)."""
    check_document(doc, where)
    if source not in SOURCES:
        raise HistoryError(f"source {source!r} is not one of {', '.join(SOURCES)}")
    host = host or doc.get("host")
    if not host:
        raise HistoryError(f"{where} names no host and none was given")
    digest = hashlib.sha256(_canonical(doc).encode()).hexdigest()
    tuning = doc.get("tuning") or {}
    config = config_of(doc, profile)
    with db.write():
        row = db.one("SELECT id FROM runs WHERE digest = ?", (digest,))
        if row:
            return int(row["id"]), False
        run_id = db.insert(
            "INSERT INTO runs (digest, host, started_at, finished_at, source, label, kernel, gpu_driver, vllm_version, "
            "model, tuning_json, tuning_key, config_json, config_key, result_json, profile, stage, server_start) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (digest, host, doc.get("started_at"), doc["finished_at"], source, doc.get("label"),
             kernel or doc.get("kernel"), gpu_driver or None, vllm_version or None, config["model"],
             _canonical(tuning), _key(tuning), _canonical(config), _key(config), _canonical(doc), profile, stage,
             server_start_of(doc)))
        for lv in doc["levels"]:
            out = lv.get("output_throughput") or {}
            ttft, tpot = lv.get("ttft_ms") or {}, lv.get("tpot_ms") or {}
            db.execute(
                "INSERT INTO levels (run_id, concurrency, output_tps_median, output_tps_cv, samples_json, ttft_p50_ms, "
                "ttft_p99_ms, tpot_p50_ms, tpot_p99_ms, errors) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, int(lv["concurrency"]), _real(out.get("median")), _real(out.get("cv")),
                 json.dumps(list(out.get("values") or [])), _real(ttft.get("p50")), _real(ttft.get("p99")),
                 _real(tpot.get("p50")), _real(tpot.get("p99")), lv.get("errors")))
        _insert_link_findings(db, run_id, doc)
    return run_id, True


def _real(value: Any) -> Any:
    """A number for a ``{real}`` column as a float (SQLite's REAL affinity turns 1000 into 1000.0; PostgreSQL is
    given a float, so that both give back the same value), anything else as it is."""
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def check_verdict(record: Any, where: str = "verdict") -> dict[str, Any]:
    """A serving verdict to store: ``verdict`` (its answer), ``reason``, ``parts`` (each with ``says``), ``stage`` (the
    change: a tuning stage, or the kernel upgrade's old -> target) and ``decided_at``; HistoryError naming the field."""
    if not isinstance(record, dict):
        raise HistoryError(f"{where} is {type(record).__name__}, not a serving verdict (verdict, reason, parts, stage, "
                           "decided_at)")
    for key, kind in (("verdict", str), ("reason", str), ("parts", dict), ("stage", str), ("decided_at", str)):
        if not isinstance(record.get(key), kind) or (kind is str and key != "reason" and not record[key]):
            raise HistoryError(f"{where} has {key} {record.get(key)!r}: give {'text' if kind is str else 'a dict'} "
                               "(bench/verdict.py serving_verdict()'s result, with the stage and when it was decided)")
    bad = [k for k, v in record["parts"].items() if k not in VERDICT_PARTS or not isinstance(v, dict)]
    if bad:
        raise HistoryError(f"{where} has parts {', '.join(map(str, bad))}: the parts are {', '.join(VERDICT_PARTS)}, "
                           "each a dict")
    return record


def append_verdict(db: Database, record: dict[str, Any], host: str, source: str,
                   where: str = "verdict") -> tuple[int, bool]:
    """Store one serving verdict; returns (id, added). The same verdict twice is stored once (the look-up and the
    insert hold the writers' lock)."""
    check_verdict(record, where)
    if source not in SOURCES:
        raise HistoryError(f"source {source!r} is not one of {', '.join(SOURCES)}")
    if not host:
        raise HistoryError(f"{where}: no host was given")
    digest = hashlib.sha256(_canonical([host, source, record]).encode()).hexdigest()
    says = [(record["parts"].get(p) or {}).get("says") for p in VERDICT_PARTS]
    with db.write():
        row = db.one("SELECT id FROM verdicts WHERE digest = ?", (digest,))
        if row:
            return int(row["id"]), False
        vid = db.insert(
            "INSERT INTO verdicts (digest, host, source, stage, decided_at, verdict, keep, reason, throughput, latency, "
            "outputs, stability, verdict_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (digest, host, source, record["stage"], record["decided_at"], record["verdict"],
             int(record["verdict"] == "pass"), record["reason"], *says, _canonical(record)))
    return vid, True


def verdicts(db: Database, host: str | None = None) -> list[dict[str, Any]]:
    """The stored serving verdicts (of ``host``, or all), oldest first, each whole with its host and source."""
    sql = "SELECT id, host, source, verdict_json FROM verdicts" + (" WHERE host = ?" if host else "") + \
        " ORDER BY decided_at {bin}, id"
    return [dict(json.loads(row["verdict_json"]), id=row["id"], host=row["host"], source=row["source"])
            for row in db.query(sql, (host,) if host else ())]


def hosts(db: Database) -> list[str]:
    return [r["host"] for r in db.query("SELECT host FROM runs GROUP BY host ORDER BY host {bin}")]


def series(db: Database, host: str | None = None, config_key: str | None = None,
           profile: str | None = None) -> list[dict[str, Any]]:
    """Per (host, configuration, concurrency) the runs in time order, each with its samples, what it ran under,
    whether its links were sampled (``links_sampled``) and the link findings of its measured runs at that level
    (``link_findings``, each with the run's tok/s). Text sorts by bytes on both back ends ({bin})."""
    where, args = [], []
    for column, value in (("r.host", host), ("r.config_key", config_key), ("r.profile", profile)):
        if value is not None:
            where.append(f"{column} = ?")
            args.append(value)
    sql = ("SELECT r.id, r.host, r.finished_at, r.source, r.label, r.kernel, r.gpu_driver, r.vllm_version, r.model, "
           "r.tuning_json, r.tuning_key, r.config_json, r.config_key, r.profile, r.stage, r.links_sampled, r.server_start, "
           "l.concurrency, "
           "l.output_tps_median, l.output_tps_cv, l.samples_json, l.ttft_p50_ms, l.ttft_p99_ms, l.tpot_p50_ms, "
           "l.tpot_p99_ms, l.errors FROM runs r JOIN levels l ON l.run_id = r.id"
           + (" WHERE " + " AND ".join(where) if where else "")
           + " ORDER BY r.host {bin}, r.config_key {bin}, l.concurrency, r.finished_at {bin}, r.id")
    grouped: dict[tuple[str, str, int], dict[str, Any]] = {}
    links = _link_findings_by_level(db)
    for row in db.query(sql, args):
        key = (row["host"], row["config_key"], int(row["concurrency"]))
        entry = grouped.setdefault(key, {"host": row["host"], "config_key": row["config_key"],
                                         "config": json.loads(row["config_json"]), "concurrency": key[2], "runs": []})
        entry["runs"].append({
            "id": row["id"], "finished_at": row["finished_at"], "source": row["source"], "label": row["label"],
            "kernel": row["kernel"], "gpu_driver": row["gpu_driver"], "vllm_version": row["vllm_version"],
            "model": row["model"], "tuning": json.loads(row["tuning_json"]), "tuning_key": row["tuning_key"],
            "profile": row["profile"], "stage": row["stage"], "median": row["output_tps_median"],
            "cv": row["output_tps_cv"], "samples": json.loads(row["samples_json"]),
            "ttft_p50_ms": row["ttft_p50_ms"], "ttft_p99_ms": row["ttft_p99_ms"], "tpot_p50_ms": row["tpot_p50_ms"],
            "tpot_p99_ms": row["tpot_p99_ms"], "errors": row["errors"], "links_sampled": bool(row["links_sampled"]),
            "server_start": row["server_start"],
            "link_findings": links.get((row["id"], key[2]), [])})
    return list(grouped.values())


def _link_findings_by_level(db: Database) -> dict[tuple[int, int], list[dict[str, Any]]]:
    out: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for row in db.query("SELECT run_id, concurrency, repetition, device, code, severity, top_speed_gts, top_width, "
                        "changes, output_tps FROM link_findings ORDER BY run_id, concurrency, repetition, device {bin}"):
        out.setdefault((row["run_id"], row["concurrency"]), []).append(
            {k: row[k] for k in ("repetition", "device", "code", "severity", "top_speed_gts", "top_width", "changes",
                                 "output_tps")})
    return out


def result_document(db: Database, run_id: int) -> dict[str, Any]:
    """The full result JSON of one stored run."""
    row = db.one("SELECT result_json FROM runs WHERE id = ?", (run_id,))
    if not row:
        raise HistoryError(f"no run {run_id} in the history")
    return json.loads(row["result_json"])


def count(db: Database) -> int:
    return int(db.scalar("SELECT COUNT(*) AS n FROM runs"))


def load_documents(paths: Iterable[str]) -> list[tuple[str, dict[str, Any]]]:
    """(path, document) for each JSON file; HistoryError naming a file that is not JSON."""
    out = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as fh:
                out.append((path, json.load(fh)))
        except (OSError, ValueError) as err:
            raise HistoryError(f"cannot read the benchmark result {path}: {err}") from err
    return out
