"""The TUI on a shared host, through tmux: a claimed or reserved card says so on its panel (the
user's own as theirs); `r` on a card the user's own job claims says so; J lists the host's queue."""

from __future__ import annotations

import sys

import pytest
from conftest import GIB, Card
from terminal import gpumon_command
from test_claims import jobs


def test_claims_reservations_and_queue_in_the_tui(fake_driver, tmux_session):
    fake_driver.machine.cards = [
        Card("NVIDIA A40", uuid=f"GPU-{i}{i}{i}{i}9999-1111-2222-3333-44445555666{i}",
             bus=f"00000000:{0x71 + i:02X}:00.0", mem_total=48 * GIB,
             extra=dict(mem_used=(40 if i == 0 else 1) * GIB, util=90 if i == 0 else 0))
        for i in range(3)]
    fake_driver.write()
    try:
        assert fake_driver.run("reserve", "--gpu", "2", "--for", "1h", "--note", "[b]paper[/b]").returncode == 0
        assert fake_driver.run("run", "--gpu", "1", "--name", "[red]train[/red]", "--", "sleep", "60").returncode == 0
        assert fake_driver.run("run", "--wait", "--gpu", "0", "--name", "later", "--", "true").returncode == 0
        tmux = tmux_session(120, 40)
        tmux.start(gpumon_command(fake_driver.env, "--interval", "0.5"))
        screen = tmux.wait_for(lambda s: "Reserved by you until" in s, what="the reservation on its card")
        assert '"[b]paper[/b]"' in screen  # the user's own: read as theirs, the note as typed
        assert "Yours: job " in screen and "[red]train[/red]" in screen  # the job's claim on card 1

        tmux.keys("Down", "r")  # card 1: the user's own job claims it: said, not asked
        screen = tmux.wait_for(lambda s: "Run on GPU 1" in s, what="the run dialog")
        assert "Run a job there anyway?" not in screen
        assert "GPU 1 is yours: job " in screen and "the new job will share it." in screen
        tmux.keys("Escape")  # alone: ESC then J at once reads as Alt+J
        tmux.wait_for(lambda s: "Run on GPU 1" not in s, what="the dialog to close")
        tmux.keys("J")
        screen = tmux.wait_for(lambda s: "Queue on this host" in s, what="the queue under J")
        assert "1. root: job " in screen and "later wants 0" in screen
    finally:
        for job in jobs(fake_driver):
            if job["state"] in ("running", "queued"):
                fake_driver.run("jobs", "--stop", job["id"])


def test_a_flooded_and_poisoned_place_never_holds_the_tui_up(fake_driver, tmux_session, tmp_path):
    """Another user made the place and filled it: 50,000 files, records no parser survives, a FIFO,
    a folder where a record belongs, and the folder touched five times a second. The TUI reads it in
    a thread: its first frame, its users view and J come as they would on an empty place, and `r`
    says whose the folder is, with the fix."""
    import json
    import os
    import threading
    import time

    fake_driver.machine.cards = [Card("NVIDIA A40", uuid="GPU-00009999-1111-2222-3333-444455556660",
                                      bus="00000000:71:00.0", mem_total=48 * GIB)]
    fake_driver.write()
    place = tmp_path / "place"
    place.mkdir(mode=0o1777)
    os.chmod(place, 0o1777)
    nobody = 65534
    for i in range(50_000):
        path = place / f"claim.GPU-{i}.job{i}.0000"
        path.write_bytes(b"{}")
        os.chown(path, nobody, nobody)
    uuid = fake_driver.machine.cards[0].uuid
    for kind, body in {"deep": b'{"card": "%s", "x": ' % uuid.encode() + b"[" * 1900 + b"]" * 1900 + b"}",
                       "nan": b'{"card": "%s", "until": NaN, "created": NaN}' % uuid.encode(),
                       "huge": b'{"card": "%s", "until": 1%s, "created": 1}' % (uuid.encode(), b"0" * 400)}.items():
        (place / f"reserve.{kind}.0000").write_bytes(body)
        os.chown(place / f"reserve.{kind}.0000", nobody, nobody)
    os.mkfifo(place / "reserve.fifo.0000")
    (place / "queue.folder.0000").mkdir()
    (place / "reserve.valid.0000").write_text(json.dumps({"card": uuid, "index": 0, "until": time.time() + 3600,
                                                          "created": time.time(), "note": "kept"}))
    os.chown(place / "reserve.valid.0000", nobody, nobody)
    os.chown(place, nobody, nobody)  # made by another user before anyone launched: theirs
    stop = threading.Event()

    def touch_the_folder() -> None:
        while not stop.wait(0.2):
            (place / "claim.churn.0000").touch()
            (place / "claim.churn.0000").unlink()

    toucher = threading.Thread(target=touch_the_folder, daemon=True)
    toucher.start()
    try:
        env = {**fake_driver.env, "GPUMON_CLAIMS_DIR": str(place)}
        tmux = tmux_session(120, 40)
        started = time.monotonic()
        tmux.start(gpumon_command(env, "--interval", "0.5"))
        tmux.wait_for(lambda s: "NVIDIA A40" in s and "starting" not in s, what="the first frame")
        assert time.monotonic() - started < 15
        screen = tmux.wait_for(lambda s: "Reserved by nobody until" in s, what="the one real reservation")
        assert "kept" in screen
        tmux.keys("u")
        tmux.wait_for(lambda s: "Users ·" in s, what="the users view")
        tmux.keys("Escape")
        tmux.wait_for(lambda s: "Users ·" not in s, what="the main screen again")
        tmux.keys("r")  # the folder's owner can remove the job's claim: said before it launches
        tmux.wait_for(lambda s: "Run a job there anyway?" in s, what="the question (the card is reserved)")
        tmux.keys("y")
        screen = tmux.wait_for(lambda s: "Run on GPU 0" in s, what="the run dialog")
        lines = screen.splitlines()
        top = next(i for i, line in enumerate(lines) if "╭─ Run on GPU 0" in line)
        left, right = lines[top].index("╭"), lines[top].index("╮")
        said = " ".join(" ".join(line[left + 1:right] for line in lines[top + 1:]).split())  # the dialog's text
        assert "belongs to nobody, who can remove anyone's claims" in said
        assert "install -d -m 1777 /run/gpumon" in said
        tmux.keys("Escape")
        tmux.wait_for(lambda s: "Run on GPU 0" not in s, what="the dialog to close")
        tmux.keys("J")
        tmux.wait_for(lambda s: "Jobs" in s, what="the jobs screen")
        tmux.keys("Escape", "q")
        tmux.wait_for(lambda s: "NVIDIA A40" not in s, what="gpumon to end")
    finally:
        stop.set()
        toucher.join()


def test_the_fleets_free_count_is_what_select_gives_on_that_host(fake_driver, tmux_session):
    """FREE in the fleet overview passes by a card another user reserved, as `select` there does."""
    import json
    import os
    import time
    from pathlib import Path

    from test_claims import free_cards

    free_cards(fake_driver.machine, 3)
    fake_driver.write()
    place = Path(fake_driver.env["GPUMON_CLAIMS_DIR"])
    place.mkdir(mode=0o1777, exist_ok=True)
    uuid = fake_driver.machine.cards[2].uuid
    booked = place / f"reserve.{uuid}.0000"
    booked.write_text(json.dumps({"card": uuid, "index": 2, "until": time.time() + 3600, "created": time.time()}))
    os.chown(booked, 65534, 65534)  # nobody's
    assert fake_driver.run("select", "--count", "3").returncode == 1
    assert fake_driver.run("select", "--count", "2").returncode == 0
    tmux = tmux_session(120, 50)
    tmux.start(gpumon_command(fake_driver.env, "--hosts", "local", "--interval", "0.5"))
    screen = tmux.wait_for(lambda s: "local  live" in s and " 2/3 " in s, what="FREE as select counts it")
    assert "1 reserved by others" in screen  # the row's note says who has the rest
    tmux.keys("Enter")  # the host's own view: its cards say who has them, in the same words
    tmux.wait_for(lambda s: "Reserved by nobody" in s, what="the reservation on the host's card")


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_who_has_each_card_at_a_glance_at_every_size(fake_driver, tmux_session, size):
    """8 cards on a shared host: one claimed by another user's job, one they reserved, one the
    user's own job claims, the rest free. Each compact row says which, in a column of its own."""
    import json
    import os
    import subprocess
    import time
    from pathlib import Path

    from test_claims import free_cards

    free_cards(fake_driver.machine, 8)
    fake_driver.write()
    place = Path(fake_driver.env["GPUMON_CLAIMS_DIR"])
    place.mkdir(mode=0o1777, exist_ok=True)
    os.chmod(place, 0o1777)
    uuids = [c.uuid for c in fake_driver.machine.cards]
    booked = place / f"reserve.{uuids[5]}.0000"
    booked.write_text(json.dumps({"card": uuids[5], "index": 5, "until": time.time() + 3600,
                                  "created": time.time(), "note": "deadline"}))
    os.chown(booked, 65534, 65534)
    # Another user's claim: the file is theirs (whose a claim is comes from its owner) and held by a live
    # process's flock (whose process it is does not matter).
    claimed = place / f"claim.{uuids[2]}.j42.0000"
    claimed.write_text(json.dumps({"card": uuids[2], "job": "j42", "name": "train.py", "since": time.time()}))
    os.chown(claimed, 65534, 65534)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys; f = open(sys.argv[1]); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
                               str(claimed)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert fake_driver.run("run", "--gpu", "6", "--name", "mine", "--", "sleep", "60").returncode == 0
        tmux = tmux_session(*size)
        tmux.start(gpumon_command(fake_driver.env, "--interval", "0.5"))
        screen = tmux.wait_for(lambda s: "nobody: train.py" in s and "nobody's →" in s and "yours: mine" in s,
                               what="who has each card")
        words = [line.replace("▌", " ").replace("│", " ").split() for line in screen.splitlines()]
        rows = {int(w[0]): " ".join(w) for w in words if len(w) > 2 and w[0].isdigit() and w[1] == "A40"}
        assert sorted(rows) == list(range(8)), screen
        assert "nobody: train.py" in rows[2] and "nobody's →" in rows[5] and "yours: mine" in rows[6]
        assert all(("nobody" not in rows[i] and "yours" not in rows[i] and rows[i].endswith(" free"))
                   for i in (0, 1, 3, 4, 7)), rows
    finally:
        holder.stdin.close()
        holder.wait(10)
        for job in json.loads(fake_driver.run("jobs", "--json").stdout or "[]"):
            if job["state"] in ("running", "queued"):
                fake_driver.run("jobs", "--stop", job["id"])
