# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The throughput history on PostgreSQL: a real server (Debian's postgresql, tests/unit/pgserver.py, started for this
module and removed after) against the SQLite file. The same records give the same reports byte for byte, the schema
and its migrations are the same, a password never shows in a message, concurrent writers store a document once."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
import threading
import time

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils.bench import history as bh
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.history_db import (
    DatabaseError, open_database, parse_url, render)
from ansible_collections.gpufleet.inference.plugins.modules import bench_history as bench_history_module
from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils._host.host import Host
from ansible_collections.gpufleet.inference.plugins.module_utils._host.result import Failed
from tests.unit.pgserver import PASSWORD, pg_server  # noqa: F401  pylint: disable=unused-import
from tests.unit.plugins.module_utils.test_bench_history import doc
from tests.unit.plugins.module_utils.test_bench_history_links import FLAPPED, STABLE, monitored
from tests.unit.plugins.modules.uthelper import run_module

# Host names whose order differs between byte order and an ICU English collation (the test server's), so that a
# query sorting text in the database's collation gives another report.
HOSTS = ("gpu-10", "GPU-2", "gpu_3", "gpu1")


def fleet_documents() -> list[dict]:
    """A small fleet's history: per host a steady series, a drop with what changed, a link that flapped in a run,
    integer medians (SQLite's REAL affinity and PostgreSQL's float must give back the same), two levels."""
    docs = []
    for h, host in enumerate(HOSTS):
        base = 1000 + 50 * h
        for day in range(1, 7):
            values = [base + d for d in (0, 4, -2, 2, 1)] if day < 5 or h % 2 else [int(base * 0.8) + d for d in (0, 3, -1, 2, 1)]
            kernel = "6.1.0-50-cloud-amd64" if day < 5 else "6.1.0-56-cloud-amd64"
            d = doc(f"2026-12-0{day}T1{h}:00:00Z", values, host=host, kernel=kernel, tuning={"aspm": "off" if day > 3 else "on"})
            if day == 3:
                d = monitored(f"2026-12-0{day}T1{h}:00:00Z", [STABLE, FLAPPED, STABLE, STABLE, STABLE], values)
                d["host"], d["kernel"] = host, kernel
            d["levels"].append(dict(d["levels"][0], concurrency=32,
                                    output_throughput={"median": 3 * base, "cv": 0.02, "values": [3 * base] * 5}))
            docs.append(d)
    return docs


def _fill_and_report(capsys, target: dict, dest) -> tuple[dict, str, str]:
    docs = fleet_documents()
    for i in range(0, len(docs), 6):  # several module runs, as the hosts of a play store theirs
        stored = run_module(bench_history_module, {**target, "documents": docs[i:i + 6], "source": "site",
                                                   "vllm_version": "0.11.0", "gpu_driver": "570.195.03"}, capsys)
        assert stored["changed"] is True and len(stored["added"]) == 6, stored
        where = {k: stored["actions"][0].get(k) for k in ("path", "database", "server")}
        assert where == ({"path": target["path"], "database": None, "server": None} if "path" in target else
                         {"path": None, "database": "same_reports", "server": parse_url(target["url"]).redacted.split("/")[2].split("@")[1]})
    report = run_module(bench_history_module, {**target, "state": "report", "dest": str(dest)}, capsys)
    query = run_module(bench_history_module, {**target, "state": "query"}, capsys)
    return query, (dest / "history.md").read_text(), (dest / "history.html").read_text()


def test_the_same_history_gives_the_same_reports_from_sqlite_and_postgresql(pg_server, tmp_path, capsys):  # noqa: F811
    url = pg_server.create_database("same_reports")
    lite_query, lite_md, lite_html = _fill_and_report(capsys, {"path": str(tmp_path / "h.sqlite")}, tmp_path / "lite")
    pg_query, pg_md, pg_html = _fill_and_report(capsys, {"url": parse_url(url).redacted, "password": PASSWORD},
                                                tmp_path / "pg")
    assert pg_md == lite_md
    assert pg_html == lite_html
    assert json.dumps(pg_query["series"], sort_keys=True) == json.dumps(lite_query["series"], sort_keys=True)
    assert pg_query["drops"] == lite_query["drops"] and pg_query["link_findings"] == lite_query["link_findings"]
    # what the comparison rests on: hosts in byte order, a drop with the kernel that changed, the flapped link
    assert sorted(HOSTS) == ["GPU-2", "gpu-10", "gpu1", "gpu_3"]
    assert lite_md.index("## GPU-2") < lite_md.index("## gpu-10") < lite_md.index("## gpu1") < lite_md.index("## gpu_3")
    assert any("kernel 6.1.0-50-cloud-amd64 -> 6.1.0-56-cloud-amd64" in d["changes"] for d in pg_query["drops"])
    assert len(pg_query["link_findings"]) == len(HOSTS) * 2  # run 1 of day 3, at both levels
    first = pg_query["series"][0]
    assert first["host"] == "GPU-2" and first["runs"][0]["median"] == 1051.0 and isinstance(first["runs"][0]["median"], float)


def _columns_sqlite(path: str) -> dict[str, list[str]]:
    conn = sqlite3.connect(path)
    try:
        return {t: [r[1] for r in conn.execute(f"PRAGMA table_info({t})")]
                for t in ("schema_version", "runs", "levels", "link_findings", "verdicts")}
    finally:
        conn.close()


def test_the_schema_and_its_migrations_are_the_same_on_both(pg_server, tmp_path):  # noqa: F811
    """An old (version 2) PostgreSQL history is migrated in place, its monitored run backfilled, to the columns an
    SQLite file gets; a second connect applies nothing."""
    url = pg_server.create_database("migrations")
    db = open_database(url)
    db.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TEXT)")
    for version, statements in bh.MIGRATIONS[:2]:
        for sql in statements:
            db.execute(sql)
        db.execute("INSERT INTO schema_version VALUES (?, 'then')", (version,))
    old = monitored("2026-11-02T00:00:00Z", [STABLE, FLAPPED])
    run_id = db.insert("INSERT INTO runs (digest, host, finished_at, source, tuning_json, tuning_key, config_json, "
                       "config_key, result_json) VALUES ('d0', 'old-host', ?, 'site', '{}', 't', '{}', 'c', ?)",
                       (old["finished_at"], json.dumps(old)))
    db.close()
    hist = bh.connect(url)
    try:
        assert bh.schema_version(hist) == bh.SCHEMA_VERSION
        assert [tuple(r.values()) for r in hist.query("SELECT run_id, repetition, code, output_tps FROM link_findings")] == [
            (run_id, 1, "link_flapping", 1004.0)]
        assert bh.migrate(hist) == []
        pg_columns = {t: [r["column_name"] for r in hist.query(
            "SELECT column_name FROM information_schema.columns WHERE table_name = ? AND table_schema = current_schema() "
            "ORDER BY ordinal_position", (t,))] for t in ("schema_version", "runs", "levels", "link_findings", "verdicts")}
        real = hist.query("SELECT data_type FROM information_schema.columns WHERE table_name = 'levels' AND "
                          "column_name = 'output_tps_median'")
    finally:
        hist.close()
    lite = str(tmp_path / "h.sqlite")
    bh.connect(lite).close()
    assert pg_columns == _columns_sqlite(lite)
    assert real == [{"data_type": "double precision"}]
    assert render(bh.MIGRATIONS[0][1][0], "sqlite").splitlines()[1].strip() == "id INTEGER PRIMARY KEY,"


def test_a_wrong_password_names_the_host_and_database_never_the_password(pg_server, capsys):  # noqa: F811
    url = pg_server.url("postgres").replace("127.0.0.1", "localhost")
    wrong = "Wr0ng-" + PASSWORD
    with pytest.raises(bh.HistoryError) as err:
        bh.connect(url, password=wrong)
    text = str(err.value)
    assert "PostgreSQL database 'postgres' on localhost:" in text and "(user 'gpufleet_test')" in text
    assert "password authentication failed" in text
    assert wrong not in text and PASSWORD not in text and "Pa55" not in text
    result = run_module(bench_history_module, {"url": url, "password": wrong, "state": "query"}, capsys)
    assert result["failed"] and "localhost" in result["msg"] and "Pa55" not in json.dumps(result)


def test_a_url_given_as_path_is_refused(tmp_path, capsys, monkeypatch):
    """Refused before anything is done: by the path check (a relative path) as it is, by the executor where a path
    check would let it through (a run from a directory called postgresql:); never taken as an SQLite file."""
    result = run_module(bench_history_module, {"path": "postgresql://u:pw@db.example.com/h", "documents": [doc("t", [1.0])]},
                        capsys)
    assert result["failed"] and "is refused" in result["msg"] and not (tmp_path / "postgresql:").exists()
    host = Host(fs=HostFS("/"), cmd=None, warn=print)
    with pytest.raises(Failed, match="give it as url") as err:
        bench_history_module.execute({"path": "postgresql://u:pw@db.example.com/h", "url": None, "password": None,
                                      "state": "query", "hosts": []}, host, False)
    assert err.value.fields["changed"] is False


@pytest.mark.parametrize("url, match", [
    ("mysql://u@h/db", "scheme 'mysql', not postgresql"),
    ("postgresql://u:pw@h/", "must name a host and one database"),
    ("postgresql://h/db", "names no user"),
    ("postgresql://u:pw@h/db?sslmode=allow", "sslmode 'allow' .* not one of disable, prefer, require, verify-ca, verify-full"),
    ("postgresql://u:pw@h/db?options=-csearch_path%3Dx", "unknown option.*options"),
    ("postgresql://u:pw@h:99999/db", "not a valid postgresql:// URL"),
    ("postgresql://u:pw@h/db?connect_timeout=0", "connect_timeout '0'"),
])
def test_bad_urls_say_what_is_wrong_without_the_password(url, match):
    with pytest.raises(DatabaseError, match=match) as err:
        parse_url(url)
    assert "pw" not in str(err.value).replace("postgresql", "")


def test_a_url_names_its_database_without_the_password():
    loc = parse_url("postgres://fleet:p%40ss%2Fw@db.example.com:6543/gpu%20history?sslmode=verify-full&connect_timeout=3")
    assert (loc.user, loc.password, loc.host, loc.port, loc.database, loc.sslmode, loc.connect_timeout) == (
        "fleet", "p@ss/w", "db.example.com", 6543, "gpu history", "verify-full", 3.0)
    assert loc.redacted == "postgresql://fleet@db.example.com:6543/gpu%20history" and "p@ss" not in repr(loc)
    assert loc.where == "PostgreSQL database 'gpu history' on db.example.com:6543 (user 'fleet')"
    assert parse_url("postgresql://fleet:inurl@h/db", password="option").password == "option"
    assert render("SELECT a FROM t WHERE b = ? AND c = ? ORDER BY a {bin}", "postgresql") == (
        'SELECT a FROM t WHERE b = :p0 AND c = :p1 ORDER BY a COLLATE "C"')


def _tls(url: str) -> bool:
    db = bh.connect(url)
    try:
        return db.scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
    finally:
        db.close()


def test_sslmode_as_libpq_means_it(pg_server):  # noqa: F811
    """The server offers TLS with a self-signed certificate for localhost: disable talks plain TCP, prefer (the
    default) and require encrypt, verify-full checks the certificate against sslrootcert and the name, and refuses a
    server the system's CAs do not vouch for."""
    local = pg_server.url().replace("127.0.0.1", "localhost")
    assert _tls(pg_server.url() + "?sslmode=disable") is False
    assert _tls(pg_server.url()) is True and _tls(pg_server.url() + "?sslmode=require") is True
    assert _tls(f"{local}?sslmode=verify-full&sslrootcert={pg_server.cert}") is True
    assert _tls(f"{pg_server.url()}?sslmode=verify-ca&sslrootcert={pg_server.cert}") is True
    with pytest.raises(bh.HistoryError, match=r"PostgreSQL database 'postgres' on localhost:\d+ .*certificate verify failed"):
        bh.connect(f"{local}?sslmode=verify-full")


def test_a_writer_waits_for_the_lock_longer_than_the_connect_timeout(pg_server):  # noqa: F811
    """Another controller holds the writers' lock for 2 s; a store with connect_timeout=1 waits for it and succeeds
    (pg8000 leaves the connect timeout on the socket: without clearing it the store failed after 1 s)."""
    url = pg_server.create_database("lock_wait") + "?connect_timeout=1"
    holder, waiter = bh.connect(url), bh.connect(url)
    held = threading.Event()

    def hold():
        with holder.write():
            held.set()
            time.sleep(2.0)
    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(10)
        start = time.monotonic()
        assert bh.append(waiter, doc("2026-12-01T00:00:00Z", [1.0] * 5), source="site")[1] is True
        assert time.monotonic() - start >= 1.5
    finally:
        thread.join()
        holder.close()
        waiter.close()


def _append_all(url: str) -> list[int]:
    db = bh.connect(url)
    try:
        return [bh.append(db, d, source="site")[0] for d in fleet_documents()[:6]]
    finally:
        db.close()


def test_controllers_appending_at_once_migrate_once_and_store_each_document_once(pg_server):  # noqa: F811
    """Six processes (several controllers, or the hosts of a play) open one new database and store the same six
    documents at the same moment: one migration, six runs, every process told the same run ids."""
    url = pg_server.create_database("concurrent")
    with multiprocessing.get_context("spawn").Pool(6) as pool:
        ids = pool.map(_append_all, [url] * 6, chunksize=1)
    assert all(i == ids[0] for i in ids) and len(set(ids[0])) == 6
    db = bh.connect(url)
    try:
        assert bh.count(db) == 6
        assert [r["version"] for r in db.query("SELECT version FROM schema_version ORDER BY version")] == list(range(1, bh.SCHEMA_VERSION + 1))
    finally:
        db.close()


def test_serving_verdicts_are_stored_once_and_read_back_the_same_on_both(pg_server, tmp_path, capsys):  # noqa: F811
    """The kernel upgrade's and measured tuning's verdicts (bench_history verdicts) in PostgreSQL as in SQLite."""
    from tests.unit.plugins.module_utils.test_bench_history_verdicts import diverged
    url = parse_url(pg_server.create_database("verdicts")).redacted
    answers = {}
    for name, target in (("sqlite", {"path": str(tmp_path / "v.sqlite")}), ("postgresql", {"url": url, "password": PASSWORD})):
        for _attempt in range(2):  # the same verdict twice is stored once
            stored = run_module(bench_history_module, {**target, "verdicts": [diverged(), diverged("max_num_seqs 512")],
                                                       "host": "gpu-01", "source": "tune_measured"}, capsys)
        assert stored["changed"] is False and stored["verdicts_added"] == []
        answers[name] = run_module(bench_history_module, {**target, "state": "query", "hosts": ["gpu-01"]}, capsys)["verdicts"]
    assert [v["stage"] for v in answers["postgresql"]] == ["kv_fp8", "max_num_seqs 512"]
    assert answers["postgresql"] == answers["sqlite"]
    assert answers["postgresql"][0]["verdict"] == "diverged" and answers["postgresql"][0]["parts"]["outputs"]["says"] == "no"


def test_a_schema_4_database_gets_the_server_starts_and_the_same_start_noise_as_sqlite(pg_server, tmp_path, capsys):  # noqa: F811
    """A version 4 PostgreSQL history is migrated in place, the start its stored document names backfilled; the
    between-start estimate of the same documents is the same from both back ends."""
    from tests.unit.plugins.module_utils.test_start_noise_history import (  # pylint: disable=import-outside-toplevel
        BOOT, dsv2_documents, started)
    url = pg_server.create_database("starts")
    db = open_database(url)
    db.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TEXT)")
    for version, statements in bh.MIGRATIONS[:4]:
        for step in statements:
            if not callable(step):
                db.execute(step)
        db.execute("INSERT INTO schema_version VALUES (?, 'then')", (version,))
    old = started(doc("2026-11-02T00:00:00Z", [1000.0, 1001.0]), f"{BOOT}/7/70")
    db.insert("INSERT INTO runs (digest, host, finished_at, source, tuning_json, tuning_key, config_json, config_key, "
              "result_json) VALUES ('d0', 'old-host', ?, 'site', '{}', 't', '{}', 'c', ?)", (old["finished_at"], json.dumps(old)))
    db.close()
    hist = bh.connect(url)
    try:
        assert bh.schema_version(hist) == bh.SCHEMA_VERSION
        assert hist.query("SELECT host, server_start FROM runs") == [{"host": "old-host", "server_start": f"{BOOT}/7/70"}]
    finally:
        hist.close()
    answers = []
    for target in ({"url": parse_url(url).redacted, "password": PASSWORD}, {"path": str(tmp_path / "h.sqlite")}):
        run_module(bench_history_module, {**target, "documents": dsv2_documents(), "source": "site"}, capsys)
        answers.append(run_module(bench_history_module, {**target, "state": "start_noise", "hosts": ["h200-1"]},
                                  capsys)["start_noise"])
    assert answers[0] == answers[1] and answers[0][0]["starts"] == 4 and answers[0][0]["between_start_sd"] > 0.013
