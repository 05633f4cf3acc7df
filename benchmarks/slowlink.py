#!/usr/bin/env python3
"""A slow link between a program and your terminal, as SSH over a slow network makes one.

    python benchmarks/slowlink.py RATE -- COMMAND [ARG...]

runs COMMAND on a pseudo-terminal of this terminal's size and passes what it writes on to this
terminal at RATE bytes per second. Like sshd, it reads the program's output at once and queues
whatever the link cannot carry yet (the program never sees the link: its writes never block), so
a program that writes faster than RATE falls behind. Keys (and the terminal's answers to queries)
go the other way at once: they are few. Ends when COMMAND does, after the queue has drained.

Used by benchmarks/bench.py (--slow-link) and the tests, inside tmux: tmux is the terminal.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
import tty

CHUNK_S = 0.05  # the link delivers in slices of this many seconds


def main() -> int:
    args = sys.argv[1:]
    if len(args) < 3 or args[1] != "--":
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    rate, command = float(args[0]), args[2:]
    master, slave = pty.openpty()
    try:
        size = fcntl.ioctl(sys.stdout.fileno(), termios.TIOCGWINSZ, b"\0" * 8)
        fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
    except OSError:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    child = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    stdin = sys.stdin.fileno()
    saved = termios.tcgetattr(stdin) if os.isatty(stdin) else None
    if saved is not None:
        tty.setraw(stdin)
    queue = bytearray()
    credit, last = 0.0, time.monotonic()
    child_done = False
    try:
        while True:
            readable, _, _ = select.select([master, stdin] if not child_done else [stdin], [], [], CHUNK_S)
            if master in readable:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the program ended
                    data = b""
                if data:
                    queue += data  # read at once, like sshd: the program never waits
                else:
                    child_done = True
            if stdin in readable:
                data = os.read(stdin, 4096)
                if data and not child_done:
                    os.write(master, data)
            now = time.monotonic()
            credit = min(credit + (now - last) * rate, rate)  # no bursts beyond one second's worth
            last = now
            if queue and credit >= 1:
                n = min(len(queue), int(credit))
                os.write(sys.stdout.fileno(), bytes(queue[:n]))
                del queue[:n]
                credit -= n
            if child_done and not queue:
                break
    finally:
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGTERM)
        child.wait()
    return child.returncode or 0


if __name__ == "__main__":
    sys.exit(main())
