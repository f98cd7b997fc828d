"""Render the fleet report (fleet.md, fleet.html) again from a directory of per-host audit JSON
files, as written by playbooks/audit.yml; used for docs/examples and for old audits."""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".collections")]

from ansible_collections.gpufleet.inference.plugins.module_utils.pcie.audit_report import (  # noqa: E402
    render_html, render_markdown)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("directory", help="directory holding <host>.json files")
    args = parser.parse_args(argv)
    fleet = []
    for path in sorted(glob.glob(os.path.join(args.directory, "*.json"))):
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        if "pcie" in data and "host" in data:
            fleet.append(data)
    if not fleet:
        print(f"no audit JSON (with 'host' and 'pcie') in {args.directory}", file=sys.stderr)
        return 1
    for name, render in (("fleet.md", render_markdown), ("fleet.html", render_html)):
        with open(os.path.join(args.directory, name), "w", encoding="utf-8") as fh:
            fh.write(render(fleet))
    print(f"rendered {len(fleet)} host(s) into {args.directory}/fleet.md and fleet.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
