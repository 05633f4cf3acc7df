#!/usr/bin/env python3
"""What one host that streams large documents back to back costs the fleet's event loop (the loop
`serve`, `watch` and the fleet TUI run on): the loop's lag (how late a 10 ms timer fires) while the
host sends a ~2 MB document as fast as the pipe takes it, read by SshSource (the newest document
parsed at most once an interval, in a thread), and, for comparison, by a reader that parses every
line on the loop as it comes (what SshSource did before).

No sshd needed: `--ssh` is a stand-in that runs the remote command line here, through `sh`, as a
login would (remote/login.py's base64 form included). Run from the repo root:
`python benchmarks/stream_parse.py [--seconds 10] [--processes 6000]`. Printed, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpumon.fleet import open_fleet  # noqa: E402
from gpumon.fleet.schema import snapshot_from_remote  # noqa: E402
from gpumon.remote.children import spawn_async  # noqa: E402
from gpumon.remote.hosts import parse_hosts  # noqa: E402
from gpumon.remote.ssh import SshTransport  # noqa: E402

FAKE_SSH = """#!/bin/sh
# ssh, minus the network: the last argument is the remote command line, run by the login shell here.
for last; do :; done
exec sh -c "$last"
"""
FLOOD = """import sys, time
head, _, tail = open(sys.argv[1], "rb").read().partition(b'"time": 0.0')
out = sys.stdout.buffer
while True:  # each document of its own time, as a real stream's
    out.write(head + b'"time": ' + repr(time.time()).encode() + tail)
    out.flush()
"""


def document(processes: int) -> bytes:
    doc = json.loads(subprocess.run([sys.executable, "-m", "gpumon", "snapshot", "--json", "--demo"],
                                    capture_output=True, check=True, text=True).stdout)
    template = doc["gpus"][0]["processes"][0]
    per_card = processes // len(doc["gpus"])
    doc["time"] = 0.0
    for gpu in doc["gpus"]:
        gpu["processes"] = [dict(template, pid=10_000 + gpu["index"] * per_card + i) for i in range(per_card)]
    return json.dumps(doc).encode() + b"\n"


async def lag_while(seconds: float, work) -> list[float]:
    """How late a 10 ms timer fires (ms), while `work` runs on the same loop."""
    running = asyncio.ensure_future(work())
    lags = []
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    await asyncio.sleep(1.0)  # connected and streaming
    while loop.time() < end:
        before = loop.time()
        await asyncio.sleep(0.01)
        lags.append((loop.time() - before - 0.01) * 1000)
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    return lags


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--processes", type=int, default=6000)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ssh, flood, doc = Path(tmp, "ssh"), Path(tmp, "flood.py"), Path(tmp, "doc.json")
        ssh.write_text(FAKE_SSH)
        ssh.chmod(0o755)
        flood.write_text(FLOOD)
        doc.write_bytes(document(args.processes))
        os.environ["XDG_RUNTIME_DIR"] = tmp
        transport = SshTransport(str(ssh), f"{sys.executable} {flood} {doc}", sharing=False)
        parsed = {"new": 0, "old": 0}

        async def with_fleet() -> None:
            fleet = open_fleet(parse_hosts("flood"), transport, args.interval)
            fleet.subscribe(lambda status: parsed.__setitem__("new", parsed["new"] + (status.state == "live")))
            await fleet.run()

        async def parse_on_loop() -> None:
            proc = await spawn_async(transport.argv(parse_hosts("flood")[0], transport.gpumon_command([])),
                                     limit=8 << 20)
            try:
                while line := await proc.stdout.readline():
                    snapshot_from_remote(json.loads(line))
                    parsed["old"] += 1
            finally:
                await proc.end(0.5, polite=False)

        print(f"one host, a {doc.stat().st_size / 1e6:.1f} MB document ({args.processes} processes) back to back, "
              f"{args.seconds:g} s, interval {args.interval:g} s")
        print("| reader | loop lag median | p99 | max | documents parsed per second |")
        print("|---|---|---|---|---|")
        for name, work in (("SshSource (newest, once an interval, in a thread)", with_fleet),
                           ("every line parsed on the loop (before)", parse_on_loop)):
            started = time.monotonic()
            lags = sorted(asyncio.run(lag_while(args.seconds, work)))
            took = time.monotonic() - started
            key = "new" if work is with_fleet else "old"
            print(f"| {name} | {statistics.median(lags):.1f} ms | {lags[int(len(lags) * 0.99)]:.1f} ms | "
                  f"{lags[-1]:.1f} ms | {parsed[key] / took:.1f} |")


if __name__ == "__main__":
    main()
