"""What a newcomer's trial hit in the TUI."""

from __future__ import annotations

import subprocess
import sys

from test_tui import launch_app, run, started  # noqa: F401 - fixtures used by name
from test_tui_dialogs import wait_until

from gpumon.jobs import records


def test_a_jobs_command_is_shown_with_shell_quoting(launch_app, fake_driver):  # noqa: F811
    script = "for i in 1 2; do sleep 30; done"
    done = subprocess.run([sys.executable, "-m", "gpumon", "run", "--gpu", "0", "--", "sh", "-c", script],
                          env=fake_driver.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    app = launch_app

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await pilot.press("J")
            await wait_until(pilot, lambda: "sh -c" in str(app.screen.query_one("#jobs-detail").render()),
                             what="the job's command")
            shown = str(app.screen.query_one("#jobs-detail").render())
            assert f"$ sh -c '{script}'" in shown
            for job in records.list_jobs():
                subprocess.run([sys.executable, "-m", "gpumon", "jobs", "--stop", job.spec.id], env=fake_driver.env,
                               capture_output=True, timeout=60)

    run(go())


def test_the_run_dialog_on_a_simulated_amd_card_names_rocm_not_cuda():
    from gpumon.cards.backends.demo import DemoBackend
    from gpumon.tui.app import create_app
    from gpumon.tui.screens.run_dialog import RunDialog

    app = create_app(DemoBackend("mixed"), interval=0.1, backend_args={"demo": "mixed"})

    async def go():
        async with app.run_test(size=(140, 50)) as pilot:
            await started(pilot)
            notes = {}
            for _ in range(5):
                await pilot.press("r")
                await wait_until(pilot, lambda: isinstance(app.screen, RunDialog), what="the run dialog")
                dialog = app.screen
                notes[dialog.gpu.vendor] = str(dialog.query_one("#run-note").render())
                await pilot.press("escape")
                await wait_until(pilot, lambda: not isinstance(app.screen, RunDialog), what="the dialog closing")
                await pilot.press("j")
            assert "CUDA sees no GPU" in notes["nvidia"]
            assert "ROCm sees no GPU" in notes["amd"] and "CUDA" not in notes["amd"]
            assert "Level Zero sees no GPU" in notes["intel"] and "CUDA" not in notes["intel"]

    run(go())


def test_the_users_view_at_80_columns_drops_power_and_energy_before_idle():
    from gpumon.cards.backends.demo import DemoBackend
    from gpumon.tui.app import create_app
    from gpumon.tui.widgets.holder_table import KEYS, HolderTable

    async def widths_at(size):
        app = create_app(DemoBackend(), interval=0.1, backend_args={"demo": "default"})
        async with app.run_test(size=size) as pilot:
            await started(pilot)
            await pilot.press("u")
            await wait_until(pilot, lambda: app.screen.query(HolderTable) and
                             app.screen.query_one(HolderTable).holder_of, what="the users view")
            await pilot.pause(0.3)
            table = app.screen.query_one(HolderTable)
            return dict(zip(KEYS, table.widths)), table.size.width

    async def go():
        narrow, room = await widths_at((80, 30))
        assert narrow["idle"] and narrow["held"] and not narrow["power"]
        assert 1 + sum(w + 2 for w in narrow.values() if w) <= room + 2
        wide, _ = await widths_at((160, 40))
        assert wide["power"] and wide["energy"] and wide["idle"]

    run(go())
