"""The ssh processes gpumon starts: tied to its life, and their output read with a cap.

A fleet monitor can run hundreds of ssh clients; none may outlive gpumon, even when gpumon is
killed with SIGKILL or crashes and has no chance to end them. Each is started with the parent-death
signal (Linux `prctl(PR_SET_PDEATHSIG)`): the kernel kills it when its parent goes. That signal is
tied to the *thread* that forked, so children are forked only from a thread that lives as long as
they may: the main thread (where the event loop and the TUI run), the caller's thread when it waits
for the child itself (`run_capped`), else one long-lived spawning thread. A shared connection's
master (ControlPersist) is ssh's own grandchild and not tied: it ends by itself once idle.

What a child prints is read with a cap and the child is stopped at it, so a host that sends
endless output costs a bounded amount of memory (`run_capped`; the stream's line reader has its
limit in asyncio's StreamReader). `AsyncChild.end` ends an asyncio child's pipes even when something
else still holds their other end (a shared connection's master holds them while the remote program
lingers), so no transport is left for the garbage collector after the loop has closed.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
STDERR_KEEP = 4096
_CHUNK = 65536


class OutputTooLarge(Exception):
    """The child printed more than the cap allows (it has been stopped)."""


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()  # looked up once here: the forked child only calls it


def _tie(parent: int) -> Callable[[], None] | None:
    """A preexec_fn: the child gets SIGKILL when the thread that forked it ends."""
    if _PRCTL is None:
        return None

    def preexec() -> None:
        if _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return  # not tied (a kernel that refuses): it still runs
        if os.getppid() != parent:  # gpumon died between the fork and the prctl (prctl(2))
            os._exit(1)

    return preexec


_spawner: ThreadPoolExecutor | None = None
_spawner_lock = threading.Lock()


def _spawning_thread() -> ThreadPoolExecutor:
    """One thread, started on first use and kept until gpumon exits: children it forks live on
    after the thread that asked for them has ended."""
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpumon-spawn")
        return _spawner


def popen(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """subprocess.Popen, the child tied to gpumon's life (from any thread)."""
    kwargs["preexec_fn"] = _tie(os.getpid())
    if threading.current_thread() is threading.main_thread():
        return subprocess.Popen(list(argv), **kwargs)
    return _spawning_thread().submit(subprocess.Popen, list(argv), **kwargs).result()


def call(argv: Sequence[str], **kwargs: Any) -> int:
    """subprocess.call, the child tied to gpumon's life: a command in this terminal (an ssh -t)."""
    with popen(argv, **kwargs) as proc:
        try:
            return proc.wait()
        except BaseException:  # Ctrl-C and the like: it goes with us, as subprocess.call does
            proc.kill()
            raise


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


_waited: set[subprocess.Popen[bytes]] = set()  # run_capped's children, while a thread waits for them
_waited_lock = threading.Lock()
_leaving = threading.Event()
# Readable once gpumon is leaving (a byte end_all writes and nobody reads): every run_capped
# watches it, because killing an ssh client does not end its pipes when a shared connection's
# master holds their other ends (ssh passes them to it).
_wake_r, _wake_w = os.pipe()
os.set_blocking(_wake_w, False)


_async_children: set[AsyncChild] = set()  # spawn_async's, until ended


def end_all() -> None:
    """gpumon is leaving: every command a thread still waits for (run_capped) is killed now, and
    none is started after, so no thread holds up the exit for as long as a host takes to answer
    (Python waits for pool threads when it exits); every asyncio child (a host's stream) is sent
    SIGTERM, and ending one from then on waits for nothing (AsyncChild.end): nothing on the way
    out waits on a child. Call it on the way out (the TUI's `q`, Ctrl-C). What has not ended by
    the time gpumon exits gets the parent-death SIGKILL."""
    _leaving.set()
    try:
        os.write(_wake_w, b"x")
    except OSError:  # (already written: the pipe is full)
        pass
    with _waited_lock:
        waited = list(_waited)
    for proc in waited:
        try:
            proc.kill()
        except OSError:
            pass
    for child in list(_async_children):
        if child.returncode is None:
            try:
                os.kill(child.pid, signal.SIGTERM)
            except OSError:  # (gone already)
                pass


def run_capped(argv: Sequence[str], timeout: float, limit: int,
               env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run a command to its end (stdin: nothing) and return what it printed: stdout whole, the
    last STDERR_KEEP bytes of stderr. OutputTooLarge once stdout passes `limit` bytes, TimeoutError
    after `timeout` seconds (at once once gpumon is leaving: end_all); the child is killed either
    way. Blocks: forked from the caller's thread, which waits for the child."""
    if _leaving.is_set():
        raise TimeoutError
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, preexec_fn=_tie(os.getpid()), env=env)
    with _waited_lock:
        _waited.add(proc)
    if _leaving.is_set():  # end_all ran while it started
        proc.kill()
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + timeout
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ, out)  # type: ignore[arg-type]
            selector.register(proc.stderr, selectors.EVENT_READ, err)  # type: ignore[arg-type]
            selector.register(_wake_r, selectors.EVENT_READ, None)
            while len(selector.get_map()) > 1:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                for key, _ in selector.select(left):
                    if key.data is None:  # gpumon is leaving
                        raise TimeoutError
                    chunk = os.read(key.fd, _CHUNK)
                    if not chunk:
                        selector.unregister(key.fileobj)
                        continue
                    key.data.extend(chunk)
                    if key.data is err:
                        del err[:-STDERR_KEEP]
                    elif len(out) > limit:
                        raise OutputTooLarge(f"sent over {limit >> 20} MiB")
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise TimeoutError from None
    finally:
        _stop(proc)
        with _waited_lock:
            _waited.discard(proc)
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
    if _leaving.is_set():
        raise TimeoutError
    return subprocess.CompletedProcess(list(argv), proc.returncode, bytes(out), bytes(err))


class AsyncChild(asyncio.subprocess.Process):
    """An asyncio child whose stderr is drained as it comes (its last STDERR_KEEP bytes kept, so a
    chatty one never blocks) and whose pipes can be closed whatever holds their other end."""

    def __init__(self, transport: asyncio.SubprocessTransport, protocol: Any, loop: asyncio.AbstractEventLoop):
        super().__init__(transport, protocol, loop)
        self.transport = transport
        self._tail = bytearray()
        self._draining = loop.create_task(self._drain_stderr())
        _async_children.add(self)

    async def _drain_stderr(self) -> None:
        while chunk := await self.stderr.read(_CHUNK):  # type: ignore[union-attr]
            self._tail += chunk
            del self._tail[:-STDERR_KEEP]

    @property
    def stderr_tail(self) -> str:
        return self._tail.decode(errors="replace")

    async def _drop_output(self) -> None:
        while await self.stdout.read(_CHUNK):  # type: ignore[union-attr]
            pass

    async def end(self, grace: float, polite: bool = True) -> int | None:
        """End the child and its pipes: close its stdin (`polite`: and give it `grace` seconds to
        end by itself), then SIGTERM, then SIGKILL, `grace` seconds apart, reading (and dropping)
        what it still sends meanwhile; give its pipes `grace` seconds to reach their end, then
        close them, also when a shared connection's master still holds their other ends. Its exit
        status. Once gpumon is leaving (end_all), at once: killed if still there, its pipes closed,
        nothing waited for (its exit status then None if it had not ended)."""
        _async_children.discard(self)
        if self.stdin is not None and not self.stdin.is_closing():
            self.stdin.close()
        if _leaving.is_set():
            self.transport.close()  # (kills it if it is still there)
            self._draining.cancel()
            return self.returncode
        readers = [asyncio.ensure_future(self._drop_output()), self._draining]
        for sig in (None, signal.SIGTERM, signal.SIGKILL) if polite else (signal.SIGTERM, signal.SIGKILL):
            if sig is not None and self.returncode is None:
                try:
                    self.send_signal(sig)
                except ProcessLookupError:
                    pass
            try:
                async with asyncio.timeout(grace):
                    await self.wait()
                break
            except TimeoutError:
                continue
        await asyncio.wait(readers, timeout=grace)
        self.transport.close()
        await asyncio.wait(readers, timeout=grace)  # closed pipes reach their end at once
        for reader in readers:
            reader.cancel()
        return self.returncode


async def spawn_async(argv: Sequence[str], limit: int) -> AsyncChild:
    """Start `argv` with pipes on all three (stdout read in lines of up to `limit` bytes), tied
    to gpumon's life. The loop's thread forks: run the loop on a thread that outlives its children
    (the main thread, or one that ends them before it ends, as Fleet.run does)."""
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.subprocess_exec(
        lambda: asyncio.subprocess.SubprocessStreamProtocol(limit=limit, loop=loop), *argv,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        preexec_fn=_tie(os.getpid()),
    )
    return AsyncChild(transport, protocol, loop)
