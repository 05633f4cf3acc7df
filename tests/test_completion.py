"""`gpumon completion`: the scripts load in the real shells and complete gpumon's own words."""

from __future__ import annotations

import subprocess
import sys

from conftest import require_tool


def _script(shell: str, tmp_path) -> str:
    done = subprocess.run([sys.executable, "-m", "gpumon", "completion", shell], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stderr == ""
    path = tmp_path / f"gpumon.{shell}"
    path.write_text(done.stdout)
    return str(path)


def _bash_complete(bash: str, script: str, words: list[str]) -> list[str]:
    line = " ".join(words)
    program = (f"source {script}; complete -p gpumon >/dev/null || exit 9; "
               f"COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; COMP_LINE='{line}'; COMP_POINT=${{#COMP_LINE}}; "
               f"_shtab_gpumon gpumon {words[-1]} {words[-2]}; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
    done = subprocess.run([bash, "--norc", "--noprofile", "-c", program], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_bash_completes_a_subcommand_and_an_option(tmp_path):
    bash = require_tool("bash")
    script = _script("bash", tmp_path)
    assert _bash_complete(bash, script, ["gpumon", "sna"]) == ["snapshot"]
    assert "doctor" in _bash_complete(bash, script, ["gpumon", "doc"])
    assert _bash_complete(bash, script, ["gpumon", "snapshot", "--js"]) == ["--json"]


def test_fish_loads_its_script_and_completes_from_it(tmp_path):
    fish = require_tool("fish")
    script = _script("fish", tmp_path)
    done = subprocess.run([fish, "--no-config", "-c", f"source {script}; complete -C 'gpumon sna'; "
                           "complete -C 'gpumon snapshot --js'; complete -C 'gpumon alerts ex'"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stderr == ""
    found = [line.split("\t")[0] for line in done.stdout.splitlines()]
    assert found == ["snapshot", "--json", "export"]


def test_zsh_and_tcsh_scripts_are_printed(tmp_path):
    assert "#compdef gpumon" in open(_script("zsh", tmp_path)).read()
    assert "complete gpumon" in open(_script("tcsh", tmp_path)).read()


def test_an_unknown_shell_is_one_line():
    done = subprocess.run([sys.executable, "-m", "gpumon", "completion", "csh"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and "csh" in done.stderr


def test_bash_says_where_bash_completion_reads_it_and_completes_values(tmp_path):
    bash = require_tool("bash")
    script = _script("bash", tmp_path)
    text = open(script).read()
    assert "~/.local/share/bash-completion/completions/gpumon" in text
    assert "bash_completion/gpumon" not in text  # a folder bash-completion never reads
    assert _bash_complete(bash, script, ["gpumon", "report", "--by", "us"]) == ["user"]
    assert {"user", "job", "card"} <= set(_bash_complete(bash, script, ["gpumon", "report", "--by", "''"]))
    assert "gpumon-dark" in _bash_complete(bash, script, ["gpumon", "--theme", "gpumon-"])
    assert "auto" in _bash_complete(bash, script, ["gpumon", "run", "--gpu", "au"])
