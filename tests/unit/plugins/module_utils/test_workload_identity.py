# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The workload fingerprint's parts (issue 33, item 1): the model's identity read from a fake model directory under
a fake root, the engine's version from GET /version of a real server on 127.0.0.1, the fingerprint of a result
document, and the change under test (what each kind lets differ, everything else refused)."""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS
from ansible_collections.gpufleet.inference.plugins.module_utils.bench import sweep
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.model_identity import EDGE, model_identity
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.stats import GateError
from ansible_collections.gpufleet.inference.plugins.module_utils.bench.workload import (
    CHANGES, WORKLOAD_FIELDS, check_workloads, one_sided, workload, workload_mismatch,
)
from tests.unit.plugins.module_utils.test_inference_client_http import Scripted, json_response, run

MODEL = "/srv/models/qwen"
SHARD = 3 * EDGE + 12345  # larger than both ends together: only its ends are read


def make_model(root, where=MODEL, shard_bytes=SHARD):
    """A model directory under ``root``: config, generation config, tokenizer files, two shards and the index."""
    d = os.path.join(str(root), where.lstrip("/"))
    os.makedirs(d, exist_ok=True)
    files = {"config.json": b'{"architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584}',
             "generation_config.json": b'{"temperature": 0.7}', "tokenizer.json": b'{"model": {"type": "BPE"}}',
             "tokenizer_config.json": b'{"model_max_length": 32768}', "README.md": b"not part of the identity",
             "model.safetensors.index.json": b'{"weight_map": {}}'}
    for name, data in files.items():
        with open(os.path.join(d, name), "wb") as fh:
            fh.write(data)
    for i in (1, 2):
        with open(os.path.join(d, f"model-0000{i}-of-00002.safetensors"), "wb") as fh:
            fh.write(bytes((i * 7 + k) % 251 for k in range(shard_bytes)))
    return d


def poke(path, offset, byte=b"\xff"):
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(byte)


def identity(root, where=MODEL):
    return model_identity(HostFS(str(root)), where)


# ---- the model's identity ------------------------------------------------------------------------
def test_identity_of_a_model_directory(tmp_path):
    make_model(tmp_path)
    got = identity(tmp_path)
    assert set(got) == {"config", "tokenizer", "weights", "files", "bytes"}
    assert got["files"] == 3 and got["bytes"] == 2 * SHARD + len(b'{"weight_map": {}}')
    assert all(len(got[k]) == 64 for k in ("config", "tokenizer", "weights"))


def test_equal_directories_have_equal_identities_wherever_they_are(tmp_path):
    make_model(tmp_path / "a")
    make_model(tmp_path / "b", where="/opt/other/copy")
    assert identity(tmp_path / "a") == identity(tmp_path / "b", "/opt/other/copy")


@pytest.mark.parametrize("name, offset, changed", [
    ("config.json", 5, "config"),
    ("generation_config.json", 3, "config"),
    ("tokenizer.json", 2, "tokenizer"),
    ("tokenizer_config.json", 4, "tokenizer"),
    ("model-00001-of-00002.safetensors", 0, "weights"),  # the first byte
    ("model-00002-of-00002.safetensors", EDGE - 1, "weights"),  # the last byte of the first MiB
    ("model-00002-of-00002.safetensors", SHARD - EDGE, "weights"),  # the first byte of the last MiB
    ("model-00001-of-00002.safetensors", SHARD - 1, "weights"),  # the last byte
    ("model.safetensors.index.json", 1, "weights"),
])
def test_one_byte_changed_changes_its_part_only(tmp_path, name, offset, changed):
    d = make_model(tmp_path)
    before = identity(tmp_path)
    poke(os.path.join(d, name), offset)
    after = identity(tmp_path)
    assert [k for k in ("config", "tokenizer", "weights") if before[k] != after[k]] == [changed]


def test_a_change_in_the_middle_of_a_shard_is_not_seen(tmp_path):
    """The documented blind spot: a shard of the same size and the same first and last MiB."""
    d = make_model(tmp_path)
    before = identity(tmp_path)
    poke(os.path.join(d, "model-00001-of-00002.safetensors"), SHARD // 2)
    assert identity(tmp_path) == before


def test_a_small_weight_file_is_hashed_whole(tmp_path):
    d = make_model(tmp_path, shard_bytes=EDGE + 10)
    before = identity(tmp_path)
    poke(os.path.join(d, "model-00001-of-00002.safetensors"), (EDGE + 10) // 2)
    assert identity(tmp_path)["weights"] != before["weights"]


def test_a_renamed_or_added_or_resized_weight_file_changes_the_weights(tmp_path):
    d = make_model(tmp_path)
    before = identity(tmp_path)
    os.rename(os.path.join(d, "model-00002-of-00002.safetensors"), os.path.join(d, "model-00002-of-00003.safetensors"))
    renamed = identity(tmp_path)
    assert renamed["weights"] != before["weights"] and renamed["config"] == before["config"]
    with open(os.path.join(d, "extra.bin"), "wb") as fh:
        fh.write(b"x")
    assert identity(tmp_path)["files"] == 4
    with open(os.path.join(d, "model-00001-of-00002.safetensors"), "ab") as fh:
        fh.write(b"")  # same bytes: same identity
    assert identity(tmp_path) == identity(tmp_path)


def test_files_that_are_not_the_model_leave_the_identity_alone(tmp_path):
    d = make_model(tmp_path)
    before = identity(tmp_path)
    poke(os.path.join(d, "README.md"), 0)
    with open(os.path.join(d, "notes.txt"), "w", encoding="utf-8") as fh:
        fh.write("x")
    assert identity(tmp_path) == before


def test_the_root_option_is_respected_and_symlinks_inside_it_followed(tmp_path):
    """A Hugging Face cache snapshot: its files are links to blobs; the revision is the snapshot's name."""
    snap = "/hf/models--Qwen/snapshots/" + "a" * 40
    make_model(tmp_path / "plain")
    d = make_model(tmp_path / "cache", where="/hf/models--Qwen/blobs")
    os.makedirs(os.path.join(str(tmp_path / "cache"), snap.lstrip("/")))
    for name in os.listdir(d):
        os.symlink(f"../../blobs/{name}", os.path.join(str(tmp_path / "cache"), snap.lstrip("/"), name))
    got = identity(tmp_path / "cache", snap)
    assert got.pop("revision") == "a" * 40
    assert got == identity(tmp_path / "plain")
    assert "unreadable" in identity(tmp_path / "plain", snap)  # not under this root


@pytest.mark.parametrize("where, fragment", [
    ("Qwen/Qwen2.5-7B-Instruct", "not a local directory (a hub name"),
    (None, "not a local directory"),
    ("/srv/models/absent", "/srv/models/absent is not a directory on this host"),
    ("/srv/models/../../etc", "'..' in a host path"),
])
def test_an_unreadable_directory_says_why(tmp_path, where, fragment):
    got = identity(tmp_path, where)
    assert list(got) == ["unreadable"] and fragment in got["unreadable"]


def test_a_file_that_cannot_be_read_is_unreadable_with_what_to_do(tmp_path):
    d = make_model(tmp_path)
    os.remove(os.path.join(d, "config.json"))
    os.symlink("/nonexistent/outside", os.path.join(d, "config.json"))
    got = identity(tmp_path)
    assert "config.json" in got["unreadable"] and "become: true" in got["unreadable"]


def test_a_directory_without_model_files_has_an_empty_identity(tmp_path):
    os.makedirs(tmp_path / "srv" / "empty")
    assert identity(tmp_path, "/srv/empty") == {"config": None, "tokenizer": None, "weights": None, "files": 0, "bytes": 0}


# ---- the engine: GET /version ----------------------------------------------------------------------
MODELS = json_response(200, {"object": "list", "data": [{"id": "m", "max_model_len": 4096, "root": "/m"}]})


@pytest.mark.parametrize("version, expected", [("0.26.0", "0.26.0"), (None, None)])
def test_the_probe_reads_the_engine_version_or_none(version, expected):
    async def scenario():
        async with Scripted([MODELS], version=version) as srv:
            got = await sweep.probe(sweep.BenchmarkConfig(url=srv.url))
            return got, srv.version_requests

    got, asked = run(scenario())
    assert got["vllm_version"] == expected and asked == 1 and got["model"] == "m"


@pytest.mark.parametrize("body", [{"detail": "x"}, ["0.26"], {"version": ""}, {"version": 26}])
def test_a_version_answer_that_is_not_a_version_is_none(body):
    async def scenario():
        async with Scripted([json_response(200, body)]) as srv:
            return await sweep.engine_version(sweep.BenchmarkConfig(url=srv.url),
                                              sweep.ConnectionPool(sweep.parse_endpoint(srv.url)))

    assert run(scenario()) is None


# ---- the fingerprint of a result -------------------------------------------------------------------
def document(**server):
    return {"client": {"name": "gpufleet.inference_client", "version": "1"},
            "server": {"model": "qwen", "root": MODEL, "max_model_len": 4096, "vllm_version": "0.26.0",
                       "argv": ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--max-num-seqs", "256"],
                       "model_identity": {"config": "c" * 64, "tokenizer": "t" * 64, "weights": "w" * 64, "files": 4,
                                          "bytes": 10}, **server},
            "config": {"prompt_tokens": 1024, "output_tokens": 128, "concurrency": [32], "requests": 128, "seed": 3,
                       "ignore_eos": True, "prompt_mode": "token_ids", "token_id_range": [1000, 4000]}}


def test_the_fingerprint_of_a_result_carries_model_engine_client_and_profile():
    fp = workload(document())
    assert fp["model_config"] == "c" * 64 and fp["model_tokenizer"] == "t" * 64 and fp["model_weights"] == "w" * 64
    assert fp["vllm_version"] == "0.26.0" and fp["server_argv"][-1] == "256"
    assert fp["client"] == "gpufleet.inference_client/1" and fp["concurrency"] == 32
    assert "seed" not in fp  # extra rounds draw new prompts of the same lengths
    assert set(fp) <= set(WORKLOAD_FIELDS)
    assert workload(fp) == fp  # a fingerprint is its own fingerprint


def test_an_unreadable_identity_is_left_out_and_the_rest_compared():
    fp = workload(document(model_identity={"unreadable": "a hub name"}, vllm_version=None))
    assert not {"model_config", "model_tokenizer", "model_weights", "vllm_version"} & set(fp)
    other = workload(document(model_identity={"unreadable": "another reason"}, vllm_version=None))
    assert workload_mismatch(fp, other) == []
    assert "max_model_len: baseline 4096, candidate 8192" in workload_mismatch(
        fp, workload(document(model_identity={"unreadable": "x"}, vllm_version=None, max_model_len=8192)))


def test_one_side_without_identity_is_compared_on_the_rest_with_a_warning():
    with_id, without = workload(document()), workload(document(model_identity={"unreadable": "x"}))
    assert workload_mismatch(with_id, without) == []
    assert one_sided(with_id, without) == ["model_config", "model_tokenizer", "model_weights"]
    assert "model_config, model_tokenizer, model_weights recorded on one side only" in check_workloads(with_id, without)


# ---- the change under test -----------------------------------------------------------------------
DIFFERENT = {
    "model_weights": {"model_identity": {"config": "c" * 64, "tokenizer": "t" * 64, "weights": "v" * 64}},
    "model_config": {"model_identity": {"config": "d" * 64, "tokenizer": "t" * 64, "weights": "w" * 64}},
    "vllm_version": {"vllm_version": "0.27.0"},
    "server_argv": {"argv": ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--max-num-seqs", "64"]},
    "max_model_len": {"max_model_len": 8192},
    "model": {"model": "llama"},
}


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("field", sorted(DIFFERENT))
def test_each_change_lets_exactly_its_fields_differ(change, field):
    base, cand = workload(document()), workload(document(**DIFFERENT[field]))
    diff = workload_mismatch(base, cand, change)
    if field in CHANGES[change]:
        assert diff == [] and check_workloads(base, cand, change) == ""
    else:
        assert [d.split(":")[0] for d in diff] == [field]
        with pytest.raises(GateError) as err:
            check_workloads(base, cand, change)
        assert f"{field}: baseline {base[field]!r}, candidate {cand[field]!r}" in str(err.value)
        assert f"change {change!r} lets" in str(err.value)


def test_the_change_kinds_and_what_they_allow():
    assert CHANGES["none"] == CHANGES["kernel"] == CHANGES["host"] == CHANGES["driver"] == ()
    assert set(CHANGES["vllm_flags"]) == {"server_argv", "max_model_len"}
    assert set(CHANGES["vllm_version"]) == {"vllm_version", "server_argv"}


@pytest.mark.parametrize("change", ["kernel ", "everything", 3, ["kernel"]])
def test_an_unknown_change_is_refused_with_the_choices(change):
    with pytest.raises(GateError, match="change must be one of none, kernel, host, driver, nccl, vllm_flags, vllm_version"):
        workload_mismatch({}, {}, change)
