# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A change's journal on the host, read and written through HostFS, for every kind: loaded and validated against the
kind's shape (a corrupt one is refused with the fix), written durably and exclusively to this run (temp file, fsync,
rename, fsync of the directory; the host's lease keeps other runs out), moved to the kind's history directory when the
change ends.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ansible_collections.gpufleet.inference.plugins.module_utils._host.files import HostFS, HostFSError
from ansible_collections.gpufleet.inference.plugins.module_utils.change.flow import ChangeKind, FlowError, check_journal


def load_journal(fs: HostFS, path: str, kind: ChangeKind) -> dict[str, Any] | None:
    """The journal at ``path``, or None when there is none; FlowError (nothing changed) when it cannot be trusted
    (unreadable, not JSON, or not the kind's shape: check_journal)."""
    if not fs.exists(path):
        return None
    try:
        text = fs.read_text(path)
    except HostFSError as err:
        raise FlowError(f"the upgrade journal {path} cannot be read ({err.strerror}): nothing was changed. Run as root "
                        "(become: true); if the file system is damaged, repair it first.") from None
    try:
        data = json.loads(text or "")
    except (ValueError, RecursionError) as err:
        raise FlowError(f"the upgrade journal {path} is not valid JSON ({err}): nothing was changed. "
                        + kind.journal_fix(path).replace("Nothing was changed. ", "")) from None
    return check_journal(kind, data, path)


def dump(journal: dict[str, Any]) -> str:
    return json.dumps(journal, indent=2, sort_keys=True) + "\n"


def history_path(journal: dict[str, Any], history_dir: str) -> str:
    """``<history_dir>/<run id>-<start, epoch s>-<target>.json``: one file per change, even for one run id (the
    target is a version the kind validated: no path separator)."""
    run = re.sub(r"[^0-9A-Za-z._-]", "", str(journal.get("run_id") or "")) or "run"
    return f"{history_dir}/{run}-{int(journal.get('started_at') or 0)}-{journal['target']}.json"


def save_journal(fs: HostFS, journal: dict[str, Any], path: str, history_dir: str) -> list[dict[str, Any]]:
    """Write the journal durably; a finished one goes to the history and the live journal is removed.
    Returns the actions taken."""
    if journal.get("finished"):
        dest = history_path(journal, history_dir)
        fs.write_durable(dest, dump(journal), 0o644)
        if fs.remove(path):
            fs.fsync_dir(path)
        return [{"action": "archive_journal", "path": dest}, {"action": "remove_journal", "path": path}]
    fs.write_durable(path, dump(journal), 0o600)
    return [{"action": "write_journal", "path": path, "stage": journal["stage"]}]
