"""The README and the guide under docs/ stay true: every relative link reaches a file (and a heading,
as GitHub makes anchors of them), and every `gpumon …` command in their ```sh blocks is one that
gpumon's own argument parser accepts, read as `gpumon`'s main reads its argv."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from gpumon.cli.parser import build_parser, normalise_argv
from gpumon.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Commands the docs show with a placeholder the parser cannot take, skipped by their exact text.
# Keep it short: each entry is a command nobody can check, so say why it is here.
PLACEHOLDERS: set[str] = set()

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+).+?\1")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
PROMPT = re.compile(r"^\s*\$ (.*)$")
EXEC_START = re.compile(r"^ExecStart=-?(.*)$")
PUNCTUATION = set("();<>|&")  # what shlex's punctuation_chars splits words at


def blocks(text: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The lines outside code fences, and each fenced block as (its info string, its lines)."""
    prose: list[str] = []
    fenced: list[tuple[str, list[str]]] = []
    current: list[str] | None = None
    marker = ""
    for line in text.split("\n"):
        m = FENCE.match(line)
        if current is None and m:
            marker, current = m.group(2), []
            fenced.append((m.group(3).strip(), current))
        elif current is not None and m and m.group(2).startswith(marker) and not m.group(3).strip():
            current = None
        elif current is not None:
            current.append(line)
        else:
            prose.append(line)
    return prose, fenced


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    prose, _ = blocks(path.read_text())
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in prose:
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    prose, _ = blocks(path.read_text())
    text = INLINE_CODE.sub("", "\n".join(prose))
    return [target for target in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", target)]


def shell_lines(path: Path) -> list[str]:
    """Each shell line of the page's ```sh blocks (continuations joined, here-document bodies left out),
    and the commands its other blocks show."""
    _, fenced = blocks(path.read_text())
    out: list[str] = []
    for info, lines in fenced:
        if info.split()[:1] != ["sh"]:
            # Beyond sh blocks, the commands other blocks show: a transcript's `$ ` lines, and the
            # command a systemd unit starts.
            out += [m.group(1) for line in lines if (m := PROMPT.match(line) or EXEC_START.match(line))]
            continue
        pending = ""
        heredoc_end: str | None = None
        for line in lines:
            if heredoc_end is not None:
                if line.strip() == heredoc_end:
                    heredoc_end = None
                continue
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            whole = pending + line
            pending = ""
            if whole.strip():
                out.append(whole)
            m = HEREDOC.search(whole)
            if m:
                heredoc_end = m.group(2)
        if pending.strip():
            out.append(pending)
    return out


def gpumon_commands(line: str) -> list[list[str]]:
    """The argv of every gpumon that the shell line runs (after the word `gpumon` or `…/gpumon`)."""
    line = re.sub(r"(?<=\s)\d+(?=[<>])", "", line)  # `2>&1`: a file descriptor, not an argument
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    tokens = list(lexer)
    commands: list[list[str]] = []
    words: list[str] = []
    redirected = False

    def finish() -> None:
        nonlocal words, redirected
        while words and ASSIGNMENT.match(words[0]):
            words = words[1:]
        if words and (words[0] == "gpumon" or words[0].endswith("/gpumon")):
            commands.append(words[1:])
        words, redirected = [], False

    for token in tokens:
        if "$(" in token and "gpumon" in token:  # a quoted command substitution: check what it runs
            inner = token[token.index("$(") + 2:token.rindex(")") if ")" in token else len(token)]
            commands.extend(gpumon_commands(inner))
        if set(token) <= PUNCTUATION and ("<" in token or ">" in token):
            redirected = True  # the rest, up to the next separator, is where output goes
        elif set(token) <= PUNCTUATION:  # `|`, `&&`, `;`, `(`, or a run of them: `);`
            if token.startswith("(") and words and words[-1].endswith("$"):
                words[-1] = words[-1][:-1]  # `out=$(…`: the assignment stays a word of its own
            finish()
        elif not redirected:
            words.append(token)
    finish()
    return commands


def parse(argv: list[str]) -> str | None:
    """None when gpumon's parser takes argv, else what it says on stderr."""
    parser = build_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(normalise_argv(list(argv), parser))
    except UsageError as bad:  # what gpumon's parser raises for bad input (main: one line, status 2)
        return str(bad)
    except SystemExit as stop:
        return None if stop.code == 0 else (err.getvalue().strip() or f"exit {stop.code}")
    return None


def documented_commands() -> list[tuple[str, str, list[str]]]:
    out = []
    for page in PAGES:
        for line in shell_lines(page):
            if line.strip() in PLACEHOLDERS:
                continue
            for argv in gpumon_commands(line):
                out.append((page.relative_to(ROOT).as_posix(), line.strip(), argv))
    return out


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        for target in links(page):
            file_part, _, anchor = target.partition("#")
            destination = (page.parent / file_part).resolve() if file_part else page
            where = f"{page.relative_to(ROOT)}: ({target})"
            if not destination.exists():
                broken.append(f"{where}: no such file")
            elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
                broken.append(f"{where}: no heading makes #{anchor}")
    assert not broken, "\n".join(broken)


def test_the_docs_show_gpumon_commands():
    # The check below is worth something only if it finds the commands: the README's first block
    # alone has one, and the guide has many.
    commands = documented_commands()
    assert len(commands) > 30
    assert any(page == "README.md" and argv == ["--demo"] for page, _, argv in commands)


@pytest.mark.parametrize("page,line,argv", documented_commands(), ids=lambda v: v if isinstance(v, str) else None)
def test_every_documented_command_is_accepted(page, line, argv):
    assert parse(argv) is None, f"{page}: `{line}`: {parse(argv)}"


def test_the_checker_tells_good_from_bad():
    # Each part of the reading, on lines of the kinds the docs use.
    assert gpumon_commands("FAKE_NVML_CONFIG=/tmp/f.conf gpumon --nvml-lib /tmp/l.so  # comment") == [
        ["--nvml-lib", "/tmp/l.so"]]
    assert gpumon_commands("out=$(/opt/x/bin/gpumon health --timeout 20 2>&1)") == [["health", "--timeout", "20"]]
    assert gpumon_commands('eval "$(gpumon select --export)"') == [["select", "--export"]]
    assert gpumon_commands("gpumon watch --metrics | head -1; gpumon jobs > out.txt") == [
        ["watch", "--metrics"], ["jobs"]]
    assert gpumon_commands("git clone <this repository> gpumon && pipx install ./gpumon") == []
    assert parse(["watch", "--count", "3"]) is None
    assert gpumon_commands("out=$(gpumon health --timeout 20); status=$?") == [["health", "--timeout", "20"]]
    assert "--no-such-option" in parse(["watch", "--no-such-option"])
    assert parse(["no-such-command"]) is not None
    assert slug("Card health: is this card going bad?") == "card-health-is-this-card-going-bad"
    assert slug("Headless: `gpumon watch` and alerts") == "headless-gpumon-watch-and-alerts"
