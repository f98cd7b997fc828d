# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The identity of the model a server serves, read from its model directory on the host (HostFS, so ``root`` holds).

``model_identity(fs, directory)`` gives {"config": sha256, "tokenizer": sha256, "weights": sha256, "files": n,
"bytes": total} (and "revision" for a Hugging Face cache snapshot), or {"unreadable": why} where the directory is
not a readable local directory (a hub name, a model on another host). The workload fingerprint compares the three
hashes (bench/workload.py); docs/benchmark.md ("What the gate compares") says what they cover and cannot see:

* ``config``: sha256 over the whole of config.json and generation_config.json (those present, by name);
* ``tokenizer``: the same over tokenizer.json and tokenizer_config.json;
* ``weights``: sha256 over the sorted weight files (``*.safetensors``, ``*.bin``, ``*.pt``, ``*.index.json``), each
  its name, its size and the sha256 of its first and last EDGE bytes (the whole file when it is at most 2 x EDGE).
  Cheap (at most 2 MiB read per file, never the 15 GB of a shard); blind to a change inside a shard that keeps
  its size and both ends (a re-quantisation keeps neither; a single flipped weight in the middle would).
Pure apart from the reads through ``fs``; standard library only.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError

CONFIG_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".index.json")
EDGE = 1 << 20  # bytes hashed at each end of a weight file
IDENTITY_KEYS = ("config", "tokenizer", "weights", "files", "bytes", "revision", "unreadable")
_SNAPSHOT = re.compile(r"/snapshots/([0-9a-f]{40})/?$")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _files_hash(fs: HostFS, directory: str, names: list[str]) -> str | None:
    """sha256 over "name sha256(content)" lines of the whole files named (None when none is present)."""
    if not names:
        return None
    lines = [f"{name} {_sha(fs.read_bytes(f'{directory}/{name}'))}" for name in names]
    return _sha("\n".join(lines).encode("utf-8"))


def weight_line(fs: HostFS, path: str, name: str) -> tuple[str, int]:
    """One weight file's line of the weights hash ("name size sha256(first EDGE) sha256(last EDGE)") and its size."""
    size = fs.size(path)
    if size <= 2 * EDGE:
        return f"{name} {size} {_sha(fs.read_bytes(path))}", size
    return f"{name} {size} {_sha(fs.read_bytes(path, EDGE))} {_sha(fs.read_bytes(path, EDGE, size - EDGE))}", size


def weights_identity(fs: HostFS, directory: str, names: list[str]) -> dict[str, Any]:
    """{"weights": sha256 or None, "files": n, "bytes": total} of the weight files among ``names``."""
    weights = sorted(n for n in names if n.endswith(WEIGHT_SUFFIXES))
    lines, total = [], 0
    for name in weights:
        line, size = weight_line(fs, f"{directory}/{name}", name)
        lines.append(line)
        total += size
    return {"weights": _sha("\n".join(lines).encode("utf-8")) if lines else None, "files": len(lines), "bytes": total}


def model_identity(fs: HostFS, directory: Any) -> dict[str, Any]:
    """The identity of the model in ``directory`` (the ``root`` the server reports in /v1/models), or
    {"unreadable": why} when it is not a readable local directory."""
    if not isinstance(directory, str) or not directory.startswith("/"):
        return {"unreadable": f"the server reports the model as {directory!r}, not a local directory (a hub name, or "
                              "a path the server does not report): its files cannot be read here"}
    directory = directory.rstrip("/") or "/"
    try:
        if not fs.isdir(directory):
            return {"unreadable": f"{directory} is not a directory on this host (the server runs elsewhere, or the "
                                  "benchmark was delegated to another host): run the benchmark on the server's host"}
        names = fs.listdir(directory)
        out = {"config": _files_hash(fs, directory, [n for n in CONFIG_FILES if n in names]),
               "tokenizer": _files_hash(fs, directory, [n for n in TOKENIZER_FILES if n in names])}
        out.update(weights_identity(fs, directory, names))
    except HostFSError as err:
        return {"unreadable": f"{err}: run the benchmark as a user who may read the model directory (become: true)"}
    snapshot = _SNAPSHOT.search(directory)
    if snapshot:
        out["revision"] = snapshot.group(1)
    return out
