# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Restart extras/lab_inference_server.py (the lab stand-in, not vLLM) with the given flags, on a fixed
port, detached, and wait until it listens: the test role's equivalent of vllm_service restarting vLLM."""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--state", required=True, help="directory for the pid, the argv and the log")
ap.add_argument("--server", required=True)
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--max-num-seqs", type=int, default=0)
ap.add_argument("--stop", action="store_true")
args, extra = ap.parse_known_args()
pidfile = os.path.join(args.state, "pid")
if os.path.exists(pidfile):
    with open(pidfile, encoding="utf-8") as fh:
        pid = int(fh.read())
    try:
        os.kill(pid, signal.SIGTERM)
        for _i in range(100):
            os.kill(pid, 0)
            time.sleep(0.1)
    except ProcessLookupError:
        pass
    os.unlink(pidfile)
if args.stop:
    sys.exit(0)
argv = [sys.executable, args.server, "--model", args.state, "--served-model-name", "lab", "--host", "127.0.0.1",
        "--port", str(args.port), *extra]
if args.max_num_seqs:
    argv += ["--max-num-seqs", str(args.max_num_seqs)]
log = open(os.path.join(args.state, "server.log"), "ab")
proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
with open(pidfile, "w", encoding="utf-8") as fh:
    fh.write(str(proc.pid))
with open(os.path.join(args.state, "argv.json"), "w", encoding="utf-8") as fh:
    json.dump(argv[2:], fh)
for _i in range(300):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health", timeout=1).read()
        print(json.dumps({"pid": proc.pid, "argv": argv[2:]}))
        sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit(f"the stand-in did not answer on port {args.port}")
