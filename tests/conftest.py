"""Shared fixtures: the compiled fake driver, a fake machine per test, and running the real CLI."""

from __future__ import annotations

import gc
import os
import pwd
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).parent))
# The demo scenes shared with scripts/screenshots.py (showcase.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from ending import kill_and_wait  # noqa: E402
from fakenvml import GIB, Card, CompilerMissing, FakeMachine, build  # noqa: E402

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_tool(name: str) -> str:
    """A system tool the test needs: skip without it here, fail without it in CI."""
    path = shutil.which(name)
    if path:
        return path
    if IN_CI:
        pytest.fail(f"{name} is required in CI (.ci/run installs it)")
    pytest.skip(f"{name} is not installed")


def add_suite_user(name: str, *useradd_options: str) -> None:
    """useradd NAME, a user name only this suite uses: one an interrupted earlier run left behind
    (its teardown never ran) is removed first, with whatever it still runs, so the next run starts."""
    try:
        pwd.getpwnam(name)
    except KeyError:
        pass
    else:
        end_users_processes(name)
        subprocess.run(["userdel", name], capture_output=True)
    subprocess.run(["useradd", *useradd_options, name], check=True, capture_output=True)


def end_users_processes(*names: str) -> None:
    """Kill what these users still run, and wait until it is gone: userdel refuses a user who runs
    a process, and a job's supervisor still writes into its user's home while it ends."""
    uids = {pwd.getpwnam(name).pw_uid for name in names}
    kill_and_wait((p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real in uids), 10)


@pytest.fixture(autouse=True)
def _unfreeze_after():
    """An app run in the test's own process freezes the whole process's objects once its first
    sample is up (BaseApp.settled); after the test its widgets are garbage again, to be collected."""
    yield
    gc.unfreeze()


@pytest.fixture(autouse=True)
def _isolate_user_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the developer's own home, config, state and jobs out of every test."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))  # ~/.netrc, ~/.local, `~` in paths: the test's own
    for var, sub in (("XDG_CONFIG_HOME", "config"), ("XDG_STATE_HOME", "state"), ("XDG_DATA_HOME", "data")):
        monkeypatch.setenv(var, str(home / sub))
    # Claims, the queue and reservations are shared by every user of a host: each test has its own place.
    monkeypatch.setenv("GPUMON_CLAIMS_DIR", str(home / "claims"))
    for var in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "GPUMON_NVML_LIB", "NO_COLOR",
                "GPUMON_PROMETHEUS_PASSWORD"):
        monkeypatch.delenv(var, raising=False)
    # Never the machine's own /etc/gpumon/config.toml: a test that wants a system config writes one.
    monkeypatch.setenv("GPUMON_SYSTEM_CONFIG", str(home / "no-system-config.toml"))
    # Clocks on screen are in local time; pin it so screens compare equal anywhere.
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()


def shared_dir(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A folder of this test run that every pytest-xdist worker sees (each worker's own basetemp
    is `popen-gwN` under the run's): for what is built once and shared, under a lock."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    folder = base / name
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def fake_lib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_dir(tmp_path_factory, "fakenvml")


@pytest.fixture(scope="session")
def build_fake(fake_lib_dir: Path):
    """build_fake(omit=(...)) -> path of a libnvidia-ml.so.1 lacking those functions."""

    def _build(omit: tuple[str, ...] = ()) -> Path:
        try:
            return build(fake_lib_dir, omit)
        except CompilerMissing as exc:
            if IN_CI:
                pytest.fail(f"the fake driver must build in CI: {exc}")
            pytest.skip(str(exc))

    return _build


@pytest.fixture
def fake_lib(build_fake) -> Path:
    return build_fake()


class FakeDriver:
    """A fake machine for one test: edit `machine`, call `write()`, run gpumon against it."""

    def __init__(self, lib: Path, config: Path) -> None:
        self.lib = lib
        self.config = config
        self.machine = FakeMachine()

    def write(self) -> FakeDriver:
        self.machine.write(self.config)
        return self

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["GPUMON_NVML_LIB"] = str(self.lib)
        env["FAKE_NVML_CONFIG"] = str(self.config)
        return env

    def run(self, *args: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess[str]:
        """Run the real gpumon command against this driver."""
        return subprocess.run(
            [sys.executable, "-m", "gpumon", *args], env=self.env, capture_output=True,
            text=True, timeout=timeout, **kwargs,
        )


@pytest.fixture
def fake_driver(fake_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    driver = FakeDriver(fake_lib, tmp_path / "fake-nvml.conf")
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(driver.config))
    return driver


@pytest.fixture
def idle_processes() -> Iterator[list[subprocess.Popen]]:
    """Real processes to list as GPU processes, so psutil has something real to read."""
    started: list[subprocess.Popen] = []

    def spawn(*argv: str) -> subprocess.Popen:
        command = list(argv) or [sys.executable, "-c", "import time; time.sleep(600)"]
        proc = subprocess.Popen(command)
        started.append(proc)
        # Until it has exec'd its program: before that it is a copy of pytest (on a busy machine a
        # test could read that name and command line).
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if psutil.Process(proc.pid).cmdline() == command:
                    break
            except psutil.Error:
                pass
            time.sleep(0.01)
        return proc

    yield spawn  # type: ignore[misc]
    for proc in started:
        proc.kill()
        proc.wait()


# The real-sshd fleet harness (tests/sshd.py) and its fixture `ssh_lab`.
from sshd import ssh_lab  # noqa: E402, F401

# A real terminal (tmux) for end-to-end tests, fixture `tmux_session`.
from terminal import tmux_session  # noqa: E402, F401

__all__ = ["GIB", "Card", "FakeMachine", "FakeDriver", "require_tool", "shared_dir", "IN_CI"]

# Fake kernel trees (sysfs, procfs) for AMD and Intel cards, fixture `fake_kernel`.
from fakedrm import fake_kernel  # noqa: E402, F401
