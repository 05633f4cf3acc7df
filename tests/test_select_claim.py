"""`gpumon select --claim`: the README's way to pin a shell to an idle card, safe for two people at
once. The chosen cards are claimed while the shell lives (a detached holder keeps the claim), so a
second shell, `run --gpu auto` and the queue pass them by; the shell gone, the claim goes."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time

import test_claims
from test_claims import free_cards, wait_for

stop_jobs = test_claims.stop_jobs


def _shell(fake_driver) -> subprocess.Popen[str]:
    """A real shell that pins itself with `eval "$(gpumon select --claim --export)"`, says what it
    got, and stays until its stdin closes."""
    gpumon = f"{shlex.quote(sys.executable)} -m gpumon"
    script = (f'eval "$({gpumon} select --claim --export)"; echo "pinned=$CUDA_VISIBLE_DEVICES"; read _ignored')
    return subprocess.Popen(["bash", "-c", script], env=fake_driver.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_two_shells_pinned_with_select_claim_never_share_a_card(fake_driver, stop_jobs):
    free_cards(fake_driver.machine, 3)
    fake_driver.write()
    shells = [_shell(fake_driver) for _ in range(2)]
    try:
        started = time.monotonic()
        pinned = [shell.stdout.readline().strip().removeprefix("pinned=") for shell in shells]
        assert time.monotonic() - started < 30, "$(...) waited for the holder"
        assert all(p.startswith("GPU-") for p in pinned) and pinned[0] != pinned[1], pinned
        place = fake_driver.env["GPUMON_CLAIMS_DIR"]
        claimed = [name for name in os.listdir(place) if name.startswith("claim.")]
        assert len(claimed) == 2
        listing = fake_driver.run("select", "--verbose", "--count", "1")
        assert listing.returncode == 0, listing.stderr
        assert "claimed by root: job shell-" in listing.stderr
        assert listing.stdout.strip() not in pinned  # the third card
        assert "nothing is claimed" in listing.stderr
        # The first shell ends: its card is free again.
        shells[0].stdin.close()
        shells[0].wait(10)
        wait_for(lambda: len([n for n in os.listdir(place) if n.startswith("claim.")]) == 1,
                 what="the first shell's claim to go")
    finally:
        for shell in shells:
            if shell.poll() is None:
                shell.stdin.close()
                shell.wait(10)
    wait_for(lambda: not [n for n in os.listdir(place) if n.startswith("claim.")], what="every claim to go")


def test_claim_for_a_process_that_is_not_there_is_one_line(fake_driver):
    free_cards(fake_driver.machine, 1)
    fake_driver.write()
    gone = subprocess.Popen(["true"])
    gone.wait()
    answer = fake_driver.run("select", "--claim-for", str(gone.pid))
    assert answer.returncode == 2 and answer.stderr.count("\n") == 1
    assert f"--claim-for {gone.pid}: no such process" in answer.stderr
