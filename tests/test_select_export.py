"""Pinning from the shell: `eval "$(gpumon select --export)"` in real shells (sh, bash, dash, fish),
with UUIDs a shell would otherwise run, and a machine with no free card, where the eval must do
nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import GIB, Card, require_tool

# What a driver (or a fake one) could call a card: quotes, substitutions, backslashes, spaces.
NASTY = "GPU-1'$(touch pwned)`touch pwned`\\'; touch pwned; echo '"
POSIX = 'eval "$($GPUMON select --export {args})"; printf "%s|%s" "$CUDA_VISIBLE_DEVICES" "$CUDA_DEVICE_ORDER"'


def cards(fake_driver, uuids: list[str], busy: tuple[int, ...] = ()) -> None:
    fake_driver.machine.cards = [
        Card("NVIDIA A100-SXM4-40GB", uuid=u, mem_total=40 * GIB, extra=dict(util=90 if i in busy else 0))
        for i, u in enumerate(uuids)]
    fake_driver.write()


def in_shell(fake_driver, shell: str, script: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_tool(shell), "-c", script], cwd=fake_driver.config.parent, capture_output=True,
                          text=True, timeout=60,
                          env=fake_driver.env | {"GPUMON": f"{sys.executable} -m gpumon"} | env)


@pytest.mark.parametrize("shell", ["sh", "bash", "dash"])
def test_eval_export_pins_a_posix_shell_to_the_best_free_cards(fake_driver, shell):
    uuids = [f"GPU-{i}{i}{i}{i}0000-1111-2222-3333-44445555666{i}" for i in range(3)]
    cards(fake_driver, uuids, busy=(0,))
    result = in_shell(fake_driver, shell, POSIX.format(args=""), CUDA_VISIBLE_DEVICES="0")
    assert result.stdout == f"{uuids[1]}|PCI_BUS_ID", result.stderr
    result = in_shell(fake_driver, shell, POSIX.format(args="--count 2"))
    assert result.stdout == f"{uuids[1]},{uuids[2]}|PCI_BUS_ID", result.stderr


def test_eval_export_in_fish(fake_driver):
    uuids = [f"GPU-{i}{i}{i}{i}0000-1111-2222-3333-44445555666{i}" for i in range(2)]
    cards(fake_driver, uuids, busy=(0,))
    for script in ("eval ($GPUMON select --export --shell fish)",
                   "$GPUMON select --export --shell fish | source"):
        result = in_shell(fake_driver, "fish", script.replace("$GPUMON", f"{sys.executable} -m gpumon")
                          + '; printf "%s|%s" "$CUDA_VISIBLE_DEVICES" "$CUDA_DEVICE_ORDER"')
        assert result.stdout == f"{uuids[1]}|PCI_BUS_ID", result.stderr


@pytest.mark.parametrize("shell", ["sh", "bash", "dash", "fish"])
def test_a_uuid_full_of_shell_syntax_is_only_ever_a_value(fake_driver, shell):
    cards(fake_driver, [f'"{NASTY}"'])  # double quotes: the fake driver's config syntax for a value with spaces
    gpumon = f"{sys.executable} -m gpumon"
    script = (f"eval ({gpumon} select --export --shell fish)" if shell == "fish"
              else 'eval "$($GPUMON select --export)"') + '; printf "%s" "$CUDA_VISIBLE_DEVICES"'
    result = in_shell(fake_driver, shell, script)
    assert result.stdout == NASTY, result.stderr
    assert not (fake_driver.config.parent / "pwned").exists()


def test_no_free_card_prints_nothing_so_eval_changes_nothing(fake_driver):
    cards(fake_driver, ["GPU-aaaa0000-1111-2222-3333-444455556666"], busy=(0,))
    result = fake_driver.run("select", "--export")
    assert result.returncode == 1 and result.stdout == ""
    assert "only 0 of 1 cards are free" in result.stderr and result.stderr.count("\n") == 1
    shell = in_shell(fake_driver, "sh", 'pins=$($GPUMON select --export) || echo "status $?"; eval "$pins"; '
                                        'printf "%s" "$CUDA_VISIBLE_DEVICES"', CUDA_VISIBLE_DEVICES="mine")
    assert shell.stdout == "status 1\nmine"


@pytest.mark.parametrize("args, words", [
    (["select", "--shell", "fish"], "--shell goes with --export"),
    (["select", "--export", "--shell", "tcsh"], "invalid choice: 'tcsh'"),
    (["select", "--export", "--hosts", "local"], "--export pins this shell to this machine's cards"),
])
def test_bad_export_options_are_one_line_and_exit_2(fake_driver, args, words):
    cards(fake_driver, ["GPU-aaaa0000-1111-2222-3333-444455556666"])
    result = fake_driver.run(*args)
    assert result.returncode == 2 and result.stdout == "" and words in result.stderr
    assert result.stderr.count("\n") == 1
