"""One function host for all functions vs one functions-framework process per function.

Starts each arrangement on free ports (no emulators needed: start-up builds no client),
waits until every function answers, and prints start-up seconds and total RSS as JSON.

    .venv/bin/python bench/function_host.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

from functions.routes import ROUTES
from stack.processes import free_ports

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _wait(urls: list[str]) -> None:
    pending = set(urls)
    while pending:
        for url in list(pending):
            try:
                urllib.request.urlopen(url, timeout=1)
                pending.discard(url)
            except urllib.error.HTTPError:
                pending.discard(url)  # it answered
            except OSError:
                pass
        time.sleep(0.02)


def _rss(procs: list[subprocess.Popen[bytes]]) -> int:
    total = 0
    for p in procs:
        proc = psutil.Process(p.pid)
        total += sum(x.memory_info().rss for x in [proc, *proc.children(recursive=True)])
    return total


def measure(argvs: list[list[str]], urls: list[str]) -> dict[str, float]:
    start = time.monotonic()
    procs = [subprocess.Popen(a, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for a in argvs]
    try:
        _wait(urls)
        seconds = time.monotonic() - start
        return {"processes": len(procs), "startup_seconds": round(seconds, 2),
                "rss_mib": round(_rss(procs) / 2**20)}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()


def main() -> None:
    names = list(ROUTES)
    [port] = free_ports(1)
    one = measure([[str(BIN / "gunicorn"), "-b", f"127.0.0.1:{port}", "-k", "gthread",
                    "--threads", "16", "stack.host:app"]], [f"http://127.0.0.1:{port}/"])
    ports = free_ports(len(names))
    each = measure([[str(BIN / "functions-framework"), "--target", n, "--source",
                     "functions/main.py", "--signature-type", "cloudevent", "--host",
                     "127.0.0.1", "--port", str(p)] for n, p in zip(names, ports, strict=True)],
                   [f"http://127.0.0.1:{p}/" for p in ports])
    print(json.dumps({"functions": len(names), "one_host": one, "one_process_each": each},
                     indent=2))


if __name__ == "__main__":
    main()
