"""Who holds the cards on `gpumon serve`'s page and in /api/users: the real program against the fake
NVIDIA driver, whose cards list real processes in real Slurm and Docker shaped cgroups
(tests/cgroup_lab.py) with per-process SM %, in Debian's Chromium; and a fleet's over a real sshd."""

from __future__ import annotations

import json
import sys
import time

import pytest
from cgroup_lab import cgroup_lab  # noqa: F401 - the fixture
from conftest import GIB, Card
from holders_lab import two_hosts
from webpage import Served, browser, get, until  # noqa: F401 - browser is a fixture

from gpumon.sanitize import printable

INTERVAL = 0.5
CONTAINER = "ab" * 32
HOSTILE = "<img src=x onerror=window.__pwned=1>[b]x[/b]\x1b[31m"  # a container's name: markup, an escape
FAKE_RELOAD_S = 0.1  # the fake driver looks at its file at most every 50 ms


@pytest.fixture
def held(cgroup_lab, idle_processes, fake_driver, tmp_path):  # noqa: F811 - the fixture imported above
    """Slurm job 77 on cards 0 and 1 (60 % SM), a Docker container with a hostile name on card 2
    (30 %); a config naming where Docker keeps its containers' names."""
    job, box = idle_processes("sleep", "600"), idle_processes("sleep", "600")
    cgroup_lab.place(cgroup_lab.v2, "system.slice/slurmstepd.scope/job_77/step_0/user/task_0", job.pid)
    cgroup_lab.place(cgroup_lab.v1, f"docker/{CONTAINER}", box.pid)
    docker = tmp_path / "docker"
    (docker / "containers" / CONTAINER).mkdir(parents=True)
    (docker / "containers" / CONTAINER / "config.v2.json").write_text(json.dumps({"Name": "/" + HOSTILE}))
    config = tmp_path / "config.toml"
    config.write_text(f'[owners]\ndocker_dir = "{docker}"\n')
    fake_driver.machine.cards = [Card(extra={"power_mw": 300_000}), Card(extra={"power_mw": 200_000}),
                                 Card(extra={"power_mw": 100_000})]
    pids = {"job": job.pid, "box": box.pid}
    set_load(fake_driver, pids, job_sm=60)
    return pids, config


def set_load(fake_driver, pids, job_sm: int) -> None:
    fake_driver.machine.procs = [
        dict(gpu=0, pid=pids["job"], mem=10 * GIB, sm=job_sm), dict(gpu=1, pid=pids["job"], mem=10 * GIB, sm=job_sm),
        dict(gpu=2, pid=pids["box"], mem=2 * GIB, sm=30),
    ]
    fake_driver.write()
    time.sleep(FAKE_RELOAD_S)


def serve(fake_driver, config, *args: str) -> Served:
    argv = [sys.executable, "-m", "gpumon", "serve", "--interval", str(INTERVAL), "--config", str(config), *args]
    return Served(argv, fake_driver.env)


JOB_ROW = 'tr[data-kind="slurm"]'


def cells(page, selector: str) -> dict[str, str]:
    """A users-table row's cells by column."""
    heads = page.locator("#users-table th").all_text_contents()
    return dict(zip(heads, page.locator(f"#users-table {selector} td").all_text_contents()))


def test_the_page_shows_the_job_and_its_user_then_the_job_idle_and_names_as_text(held, fake_driver,
                                                                               browser):  # noqa: F811
    pids, config = held
    with serve(fake_driver, config, "--listen", "127.0.0.1:0") as served:
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(served.url)
        page.wait_for_selector(f"#users-table {JOB_ROW}")
        assert page.locator("#users-table th").all_text_contents() == \
            ["", "WHO", "USER", "CARDS", "MEMORY", "SM %", "POWER", "ENERGY", "HELD", "IDLE"]  # no HOST: one machine
        # A row per user, its job and container under it as a tree; the job computes.
        whos = page.locator("#users-table td.who").all_text_contents()
        assert len(whos) == 3 and whos[0] == "root" and whos[1].startswith("├ docker:") and whos[2] == "└ job 77"
        job = cells(page, JOB_ROW)
        assert (job["USER"], job["CARDS"], job["MEMORY"], job["SM %"], job["IDLE"], job[""]) == \
               ("root", "0,1", "20G", "120", "", "")
        assert page.locator(JOB_ROW).get_attribute("data-idle") == "no"
        user = cells(page, 'tr[data-kind="user"]')
        assert (user["WHO"], user["CARDS"], user["MEMORY"]) == ("root", "0,1,2", "22G")
        assert "nobody holds a card idle" in page.locator("#users-summary").text_content()

        # The container's hostile name is text: its tags, brackets and escape shown, never markup.
        box = page.locator('tr[data-kind="container"] td.who').text_content()
        assert box.endswith(f"docker:{printable(HOSTILE)}") and "\x1b" not in box
        assert page.locator("#users img, #users b").count() == 0
        assert page.evaluate("() => window.__pwned") is None

        # The job stops computing: on the open page its row turns idle within a few intervals, with a
        # word and a sign (not colour alone), and the line above the table names it.
        stopped = time.monotonic()
        set_load(fake_driver, pids, job_sm=0)
        page.wait_for_selector(f'{JOB_ROW}[data-idle="yes"]', timeout=30_000)
        took = time.monotonic() - stopped
        assert took <= 4 * INTERVAL + 2.0, f"idle on the page {took:.1f} s after the job stopped"
        assert page.locator(f"{JOB_ROW} td.mark").text_content() == "! idle"
        summary = page.locator("#users-summary").text_content()
        assert "1 holder idle: job 77 (root) idle " in summary and "holding 20G on 2 cards" in summary, summary
        assert "1 holder idle" in page.locator("#summary").text_content()
        assert page.locator('tr[data-kind="user"]').get_attribute("data-idle") == "no"  # the container computes
        first = cells(page, JOB_ROW)["IDLE"]
        until(lambda: cells(page, JOB_ROW)["IDLE"] != first, 30, "the idle time growing on the page")

        # It computes again: no longer idle.
        set_load(fake_driver, pids, job_sm=45)
        page.wait_for_selector(f'{JOB_ROW}[data-idle="no"]', timeout=30_000)
        assert page.locator(f"{JOB_ROW} td.mark").text_content() == ""
        assert not errors
        page.close()


def test_api_users_is_the_users_json_document_watched_since_the_server_started(held, fake_driver):
    pids, config = held
    with serve(fake_driver, config, "--listen", "127.0.0.1:0") as served:
        started = time.time()
        set_load(fake_driver, pids, job_sm=0)

        def watched_a_while():
            status, headers, body = get(served.base + "/api/users")
            assert status == 200 and headers["Content-Type"].startswith("application/json"), (status, body)
            doc = json.loads(body)
            return doc if doc["window_s"] >= 4 * INTERVAL else None

        ours = until(watched_a_while, 30, "the server watching for a few intervals")
    theirs = json.loads(fake_driver.run("users", "--json", "--interval", "0.2", "--config", str(config)).stdout)
    assert set(ours) == set(theirs) == {"schema", "time", "window_s", "holders", "reservations", "without_claim"}
    assert [set(h) for h in ours["holders"]] == [set(h) for h in theirs["holders"]]
    assert [(h["kind"], h["id"], h["label"]) for h in ours["holders"]] == \
           [(h["kind"], h["id"], h["label"]) for h in theirs["holders"]]
    assert ours["window_s"] <= time.time() - started + 1.0
    # Idle time counts from the server's first reading, not from the request: the job has been idle
    # since the load changed, about as long as the server watched.
    job = next(h for h in ours["holders"] if h["kind"] == "slurm")
    # idle_s is rounded to 0.1 s, window_s to 1 ms: compared to within those roundings.
    assert job["idle_s"] is not None and job["idle_s"] >= 2 * INTERVAL and job["idle_s"] <= ours["window_s"] + 0.051
    assert job["watched_s"] == pytest.approx(ours["window_s"], abs=2 * INTERVAL)


def test_beyond_loopback_api_users_needs_the_token(held, fake_driver):
    _, config = held
    with serve(fake_driver, config, "--listen", "0.0.0.0:0") as served:
        assert served.token
        status, _, body = get(served.base + "/api/users")
        assert status == 401 and b"token" in body
        assert get(served.base + "/api/users", {"Authorization": "Bearer nottheone"})[0] == 401
        assert get(f"{served.base}/api/users?token={served.token}", method="POST")[0] == 405
        status, _, body = get(served.base + "/api/users", {"Authorization": f"Bearer {served.token}"})
        assert status == 200 and {h["kind"] for h in json.loads(body)["holders"]} == {"user", "slurm", "container"}


def test_a_fleets_users_each_host_by_name(cgroup_lab, idle_processes, ssh_lab, browser):  # noqa: F811
    """`serve --hosts a,b` over a real sshd: every host's holders, with a HOST column, and /api/users
    the fleet form of `users --json` (its "hosts")."""
    two_hosts(cgroup_lab, idle_processes, ssh_lab)
    argv = ssh_lab.gpumon_argv("serve", "--listen", "127.0.0.1:0", "--hosts", "nodea,nodeb,nowhere.invalid",
                               "--interval", str(INTERVAL))
    with Served(argv, ssh_lab.env()) as served:
        def both_hosts_holders():
            status, _, body = get(served.base + "/api/users")
            doc = json.loads(body) if status == 200 else {}
            jobs = {(h["host"], h["label"]) for h in doc.get("holders", []) if h["kind"] == "slurm"}
            return doc if jobs == {("nodea", "job 501"), ("nodeb", "job 502")} else None

        doc = until(both_hosts_holders, 60, "both hosts' jobs in /api/users")
        assert set(doc) == {"schema", "time", "window_s", "holders", "hosts"}
        assert [(h["host"], h["state"]) for h in doc["hosts"]] == \
               [("nodea", "ok"), ("nodeb", "ok"), ("nowhere.invalid", "unreachable")]
        assert all(set(h) == {"host", "state", "error", "source"} for h in doc["hosts"])

        page = browser.new_page()
        page.goto(served.url)
        page.wait_for_selector('#users-table tr[data-kind="slurm"][data-idle="yes"]', timeout=30_000)
        assert page.locator("#users-table th").all_text_contents()[:3] == ["", "HOST", "WHO"]
        job_a, job_b = (cells(page, f'tr[data-holder="{key}"]') for key in ("nodea/slurm/501", "nodeb/slurm/502"))
        assert (job_a["HOST"], job_a["CARDS"], job_a["MEMORY"], job_a[""]) == ("nodea", "0,1", "6.0G", "! idle")
        assert (job_b["HOST"], job_b["SM %"], job_b[""]) == ("nodeb", "70", "")
        assert "nodea: root idle" in page.locator("#users-summary").text_content()
        page.close()
