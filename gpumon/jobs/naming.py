"""What a person calls a job: the program it runs, or the script an interpreter runs.

`train.py` for `env CUDA_LAUNCH_BLOCKING=1 python train.py`, `vllm.entrypoints.openai.api_server`
for `python -m ...`, `make` for `sh -c 'cd ~/llm && make -j8'`. Code given inline is not a name:
`python3 -c '...'` is `python3`, and `sh -c 'env | grep CUDA'` is `sh` (its first command, `env`,
runs no program). A shell command line is named after its first command (`python train.py | tee
log` is `train.py`), after any set-up commands chained before it with `&&` or `;` (`cd`, `source`,
`export`, ...).
"""

from __future__ import annotations

import os
import re
import shlex

SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "fish"}
# Programs that run another program: a job is named after what they run.
WRAPPERS = {"env", "nohup", "nice", "ionice", "time", "exec", "stdbuf", "taskset", "numactl", "srun", "uv", "poetry"}
_OPTION_VALUE = re.compile(r"^[0-9][0-9a-fx,.:-]*$")  # `10`, `0-3`, `0x3`: values of a wrapper's options
_SCRIPT = re.compile(r"(/|\.(py|sh|jl|R|js|rb|pl)$)")
INTERPRETERS = ("python", "pypy", "torchrun", "accelerate", "deepspeed", "julia", "Rscript", "node", "ruby", "perl")
# The option after which an interpreter's argument is code, not a script: python -c, perl -e, ...
_INLINE_CODE = {"python": "c", "pypy": "c", "julia": "e", "Rscript": "e", "node": "e", "ruby": "e", "perl": "e"}
# A shell command line's first words that set up for the real command, or are not a program at all.
_SETUP = {"cd", "pushd", "source", ".", "export", "set", "ulimit", "umask", "module", "conda"}
_NOT_PROGRAMS = {"for", "while", "until", "if", "case", "select", "function", "{", "(", "!", "[[", "[", "((",
                 "eval", "true", ":"}
_OPERATOR = re.compile(r"^[|&;<>()]+$")


def program_name(argv: list[str]) -> str:
    """The job's name when `--name` does not give one (see the module's docstring)."""
    name = _name(list(argv))
    return name or (os.path.basename(argv[0]) if argv else "") or "job"


def command_line_name(line: str) -> str:
    """The name of a job that runs `line` in a shell (the TUI's `r`)."""
    return program_name(["sh", "-c", line])


def _name(words: list[str]) -> str | None:
    """The program these words run, or None when they run none (a wrapper alone, a loop, ...)."""
    while words:
        word = words.pop(0)
        base = os.path.basename(word)
        if "=" in word and not word.startswith(("-", "=")):
            continue  # VAR=value before the program
        if base in WRAPPERS:
            while words and (words[0].startswith("-") or _OPTION_VALUE.match(words[0])):
                words.pop(0)  # the wrapper's own options: `nice -n 10`, `taskset -c 0-3`
            if base in ("uv", "poetry") and words[:1] == ["run"]:
                words.pop(0)
            continue
        if base in _NOT_PROGRAMS or _OPERATOR.match(word):
            return None
        if base in SHELLS or base.startswith(INTERPRETERS):
            return _interpreted(base, words)
        return base or None
    return None


def _interpreted(base: str, args: list[str]) -> str:
    """An interpreter is named after the script it runs (or the module of `-m`); given code
    inline, after itself, or for a shell after the command line's first program."""
    shell = base in SHELLS
    inline = "c" if shell else next((flag for prefix, flag in _INLINE_CODE.items() if base.startswith(prefix)), None)
    plain = None
    for k, word in enumerate(args):
        if word == "-m" and not shell and k + 1 < len(args):
            return args[k + 1]
        if inline and re.fullmatch(r"-[A-Za-z]*" + inline + (r"[A-Za-z]*" if shell else ""), word):
            code = next((w for w in args[k + 1:] if not w.startswith("-")), None) if shell else None
            return (_first_program(code) if code is not None else None) or base
        if word.startswith("-") or "=" in word:
            continue
        if _SCRIPT.search(word):
            return os.path.basename(word)
        if plain is None and not _OPTION_VALUE.match(word):
            plain = word
    return os.path.basename(plain) if plain else base


def _first_program(line: str) -> str | None:
    """The program a shell command line runs first, after its set-up commands."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:  # unbalanced quotes: the shell will say so in the job's log
        words = line.split()
    while words:
        end = next((i for i, w in enumerate(words) if _OPERATOR.match(w)), len(words))
        command, separator, words = words[:end], words[end:end + 1], words[end + 1:]
        if command and command[0] in _SETUP and separator in (["&&"], [";"]) and words:
            continue
        return _name(command)
    return None
