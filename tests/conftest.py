"""Test-suite wide setup: make the checkout importable as ansible_collections.gpufleet.inference."""

from __future__ import annotations

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTIONS = os.path.join(REPO, ".collections")

# An installed collection (or ansible-test's copy of it) already sits at ansible_collections/gpufleet/inference:
# the directory above ansible_collections is the collections path. A checkout needs scripts/bootstrap's link.
if os.path.basename(os.path.dirname(os.path.dirname(REPO))) == "ansible_collections":
    COLLECTIONS = os.path.dirname(os.path.dirname(os.path.dirname(REPO)))
elif not os.path.isdir(os.path.join(COLLECTIONS, "ansible_collections", "gpufleet", "inference")):
    raise RuntimeError(f"{COLLECTIONS}/ansible_collections/gpufleet/inference is missing: run scripts/bootstrap first")
for path in (COLLECTIONS, REPO):
    if path not in sys.path:
        sys.path.insert(0, path)
