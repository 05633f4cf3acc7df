"""`run --hosts … --gpu auto` places a job on a host with a free card that no job there claims now
(each host's own claims have the last word; a real sshd, each alias a machine of its own)."""

from __future__ import annotations

import json

from conftest import GIB, Card


def test_select_and_run_across_hosts_skip_a_host_whose_free_card_is_claimed(ssh_lab):
    first = ssh_lab.host("first")
    first.machine.cards = [Card(uuid="GPU-aaaa0000-1111-2222-3333-444455556666", mem_total=80 * GIB)]
    first.write()
    second = ssh_lab.host("second")
    second.machine.cards = [Card(uuid="GPU-bbbb0000-1111-2222-3333-444455556666", mem_total=40 * GIB)]
    second.write()
    try:
        held = ssh_lab.gpumon("run", "--host", "first", "--name", "holder", "--", "sleep", "60")
        assert held.returncode == 0, held.stderr
        # first's card still looks free (the job has touched nothing) and has more memory, but
        # first's snapshot says who claims it: neither select nor run offers it.
        chosen = ssh_lab.gpumon("select", "--hosts", "first,second", "--verbose")
        assert chosen.returncode == 0, chosen.stderr
        assert chosen.stdout.split() == ["second", "GPU-bbbb0000-1111-2222-3333-444455556666"]
        assert "claimed by" in chosen.stderr and "holder" in chosen.stderr
        launched = ssh_lab.gpumon("run", "--hosts", "first,second", "--gpu", "auto", "--name", "next", "--",
                                  "sleep", "60")
        assert launched.returncode == 0, launched.stderr
        assert "gpumon: second: GPU 0" in launched.stderr and "first:" not in launched.stderr
        (job,) = json.loads(ssh_lab.gpumon("jobs", "--hosts", "second", "--json").stdout)
        assert job["name"] == "next" and job["gpus"] == ["GPU-bbbb0000-1111-2222-3333-444455556666"]
    finally:
        for alias in ("first", "second"):
            for job in json.loads(ssh_lab.gpumon("jobs", "--hosts", alias, "--json").stdout or "[]"):
                if job["state"] in ("running", "queued"):
                    ssh_lab.gpumon("jobs", "--hosts", alias, "--stop", job["id"])


def test_reserve_release_and_queue_across_hosts(ssh_lab):
    for alias in ("r1", "r2"):
        host = ssh_lab.host(alias)
        host.machine.cards = [Card(uuid=f"GPU-{alias}00000-1111-2222-3333-444455556666", mem_total=40 * GIB),
                              Card(uuid=f"GPU-{alias}00001-1111-2222-3333-444455556666", mem_total=40 * GIB,
                                   extra=dict(util=90, mem_used=30 * GIB))]
        host.write()
    try:
        made = ssh_lab.gpumon("reserve", "--hosts", "r1,r2", "--gpu", "0", "--for", "1h", "--note", "<demo>")
        assert made.returncode == 0, made.stderr
        assert sorted(line.split(":")[0] for line in made.stdout.splitlines()) == ["r1", "r2"]  # as they answer
        doc = json.loads(ssh_lab.gpumon("reserve", "--hosts", "r1,r2", "--list", "--json").stdout)
        assert [(h["host"], [(r["index"], r["note"]) for r in h["reservations"]]) for h in doc["hosts"]] == [
            ("r1", [(0, "<demo>")]), ("r2", [(0, "<demo>")])]
        queued = ssh_lab.gpumon("run", "--host", "r2", "--wait", "--gpu", "1", "--name", "later", "--", "true")
        assert queued.returncode == 0, queued.stderr
        line = json.loads(ssh_lab.gpumon("queue", "--hosts", "r1,r2", "--json").stdout)["hosts"]
        assert [(h["host"], [e["name"] for e in h["queue"]]) for h in line] == [("r1", []), ("r2", ["later"])]
        assert "r2: POS" in ssh_lab.gpumon("queue", "--hosts", "r1,r2").stdout
        gone = ssh_lab.gpumon("release", "--hosts", "r1,r2")
        assert gone.returncode == 0 and gone.stdout.count("released GPU 0") == 2
    finally:
        for job in json.loads(ssh_lab.gpumon("jobs", "--hosts", "r2", "--json").stdout or "[]"):
            if job["state"] in ("running", "queued"):
                ssh_lab.gpumon("jobs", "--hosts", "r2", "--stop", job["id"])
