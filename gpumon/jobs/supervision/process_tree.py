"""A job's command and the processes it started, as its supervisor watches and signals them.

The command is the supervisor's child, and the supervisor leaves it unreaped (a zombie once it has
ended) until it is done signalling: until it is reaped its pid, and so its process group's id, can
belong to no one else, so `killpg` and the handle taken by pid reach the job and nothing else. Once
it is reaped, the kernel may give that pid to any new process at once: nothing is ever signalled
by it again.

What the command started is held as psutil handles (pid and start time), taken while the command
was unreaped and kept while they run: a process whose parent ended, and so left the tree, is still
the job's, and a pid recycled since is refused by psutil.
"""

from __future__ import annotations

import os
import subprocess

import psutil


class CommandTree:
    def __init__(self, command: subprocess.Popen, own_group: bool) -> None:
        self.command = command
        self.own_group = own_group  # the command leads its own process group (a detached job)
        self.root = psutil.Process(command.pid)  # our unreaped child: it cannot be anyone else
        self.unreaped = True
        self.members: dict[int, psutil.Process] = {self.root.pid: self.root}

    def ended(self) -> bool:
        """Whether the command has ended; it stays unreaped (WNOWAIT) until `reap`."""
        if not self.unreaped:
            return True
        try:
            return os.waitid(os.P_PID, self.command.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:  # reaped after all: its pid is no longer ours
            self.unreaped = False
            return True

    def processes(self) -> list[psutil.Process]:
        """The command and what it started (and still runs), with those seen before that left the tree."""
        found: list[psutil.Process] = []
        if self.unreaped:
            try:
                found = self.root.children(recursive=True)
            except psutil.Error:
                pass
        self.members = {pid: p for pid, p in self.members.items() if _running(p)} | {p.pid: p for p in found}
        return list(self.members.values())

    def signal_group(self, sig: int) -> None:
        """`sig` to the command's process group: only while the command is unreaped."""
        if self.own_group and self.unreaped:
            try:
                os.killpg(self.command.pid, sig)
            except OSError:
                pass

    def signal(self, sig: int) -> None:
        """`sig` to the command's group and to every process of the job, in the group or not."""
        self.signal_group(sig)
        for proc in self.processes():
            try:
                proc.send_signal(sig)  # psutil checks the start time first
            except psutil.Error:
                pass

    def reap(self, timeout: float) -> int:
        """Wait for the command and collect its status; from here its pid is nobody's to signal."""
        # First: a signal handler that runs during the wait must already see the pid as gone.
        self.unreaped = False
        return self.command.wait(timeout=timeout)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running()  # False for a pid that now belongs to another process
    except psutil.Error:
        return False
