"""The job records stay cheap to read as jobs pile up: finished jobs are pruned beyond `[jobs]
keep` and after `keep_for` when a job is made, and JobsReader reads again only what changed."""

from __future__ import annotations

import json
import time

from gpumon.config import JOBS_KEEP, JOBS_KEEP_FOR_S
from gpumon.jobs import records
from gpumon.jobs.files import jobs_dir, write_atomic
from gpumon.jobs.jobs_reader import JobsReader


def _finished(n: int, ended: float, keep: records.JobsKeep = records.JobsKeep()) -> records.JobSpec:
    spec = records.JobSpec(id=f"20260101-000000-{n:04x}", name=f"job{n}", command=["true"], gpu_spec="0",
                           cwd="/", created=ended - 5)
    directory = records.create_job(spec, keep)
    write_atomic(directory / "exit.json", json.dumps({"state": "exited", "exit_code": 0, "signal": None,
                                                      "ended": ended, "reason": None}))
    return spec


def test_finished_jobs_are_pruned_beyond_the_count_and_after_the_age(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    now = time.time()
    keep_all = records.JobsKeep(10**6, 10**9)  # nothing pruned while they are made
    for n in range(30):
        _finished(n, now - 100 + n, keep_all)
    old = _finished(99, now - 40 * 86400, keep_all)
    assert len(records.list_jobs()) == 31
    removed = records.prune_old(keep=20, keep_for=30 * 86400, now=now)
    assert old.id in {j.spec.id for j in removed}
    kept = records.list_jobs()
    assert len(kept) == 20 and [j.spec.name for j in kept][-1] == "job29"  # the newest are kept
    _finished(200, now, records.JobsKeep(5, 30 * 86400))  # as the config's [jobs] keep says: each new job prunes
    assert len(records.list_jobs()) <= 6


def test_the_defaults_keep_what_the_config_says_by_default():
    assert records.JobsKeep() == records.JobsKeep(JOBS_KEEP, JOBS_KEEP_FOR_S) == records.JobsKeep(200, 30 * 86400.0)


def test_the_reader_reads_again_only_what_changed(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    now = time.time()
    for n in range(50):
        _finished(n, now - 100 + n)
    reader = JobsReader()
    first = reader.read()
    assert len(first) == 50 and reader.changed
    again = reader.read()
    assert not reader.changed
    assert all(a is b for a, b in zip(again, first))  # the same records: none read again
    changed = first[3]
    write_atomic(jobs_dir() / changed.spec.id / "exit.json", json.dumps(
        {"state": "failed", "exit_code": 3, "signal": None, "ended": now, "reason": None}))
    after = reader.read()
    assert reader.changed
    assert [a is b for a, b in zip(after, first)] == [i != 3 for i in range(50)]  # that one alone
    assert after[3].exit_code == 3
