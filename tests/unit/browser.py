# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Open a report page in real headless Chromium and read back what the browser laid out.

``inspect_charts(page)`` copies the page next to itself with one probe script appended (the
report itself carries no script), loads it in ``chromium --headless --dump-dom`` with networking,
updates and sync off and a throw-away profile, and returns what the probe found: per inline SVG
chart its id, the laid-out size of its bounding box (getBBox, so the browser really rendered the
SVG, not only parsed it), its polylines and drop markers, and every network resource the page
asked for (performance entries; a self-contained page asks for none).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile

PROBE = """<script>
(function () {
  var out = {charts: [], resources: performance.getEntriesByType('resource').map(function (r) { return r.name; })};
  document.querySelectorAll('svg').forEach(function (svg) {
    var box = svg.getBBox();
    out.charts.push({id: svg.id, cls: svg.getAttribute('class'), width: box.width, height: box.height,
                     polylines: svg.querySelectorAll('polyline').length,
                     points: svg.querySelectorAll('polyline')[0] ? svg.querySelectorAll('polyline')[0].points.length : 0,
                     drops: svg.querySelectorAll('circle.drop').length,
                     annotations: svg.querySelectorAll('line.annotation').length});
  });
  var pre = document.createElement('pre');
  pre.id = 'gpufleet-probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--disable-sync", "--virtual-time-budget=2000"]


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def inspect_charts(page: str, timeout: float = 90.0) -> dict:
    exe = chromium()
    if not exe:
        raise RuntimeError("chromium is not installed: run scripts/bootstrap (APT_PACKAGES has chromium)")
    with open(page, encoding="utf-8") as fh:
        text = fh.read()
    probe_page = os.path.join(os.path.dirname(page), ".probe-" + os.path.basename(page))
    with open(probe_page, "w", encoding="utf-8") as fh:
        fh.write(text.replace("</body>", PROBE + "</body>"))
    profile = tempfile.mkdtemp(prefix="gpufleet-chromium-")
    try:
        proc = subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom",
                               "file://" + os.path.abspath(probe_page)],
                              capture_output=True, text=True, timeout=timeout, check=False)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
        os.unlink(probe_page)
    found = re.search(r'<pre id="gpufleet-probe">(.*?)</pre>', proc.stdout, re.S)
    if not found:
        raise AssertionError(f"chromium rc={proc.returncode} gave no probe output; stderr: {proc.stderr[-2000:]}")
    return json.loads(found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
                      .replace("&amp;", "&"))
