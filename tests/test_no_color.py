"""--no-color and NO_COLOR: not one colour code reaches the terminal (bold and reverse may), read
byte for byte from a pseudo-terminal."""

from __future__ import annotations

import os
import re
import select
import time

import pytest
from terminal import gpumon_on_pty

SGR = re.compile(rb"\x1b\[([0-9;:]*)m")


def colour_codes(data: bytes) -> set[bytes]:
    found = set()
    for params in SGR.findall(data):
        parts = params.replace(b":", b";").split(b";")
        i = 0
        while i < len(parts):
            part = parts[i]
            if part in (b"38", b"48", b"58"):  # extended colours: 5;N or 2;R;G;B follow
                found.add(b";".join(parts[i:i + 3]))
                i += 5 if i + 1 < len(parts) and parts[i + 1] == b"2" else 3
                continue
            code = int(part) if part else 0
            if 30 <= code <= 37 or 40 <= code <= 47 or 90 <= code <= 97 or 100 <= code <= 107:
                found.add(part)
            i += 1
    return found


def _screen_bytes(env: dict[str, str], *args: str) -> bytes:
    data = b""
    with gpumon_on_pty(env, (120, 40), "--demo", "--interval", "0.2", *args) as (_, master):
        deadline = time.monotonic() + 30
        seen_at = None
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data += os.read(master, 65536)
                except OSError:
                    break
            if seen_at is None and b"GPU MEM" in data:
                seen_at = data.count(b"\x1b[")
            # A few samples' redraws after the first full screen, not a fixed wait.
            if seen_at is not None and data.count(b"\x1b[") > seen_at + 200:
                break
    assert b"GPU MEM" in data
    return data


@pytest.mark.parametrize("how", ["--no-color", "NO_COLOR"])
def test_no_colour_code_at_all(how):
    env = dict(os.environ, TERM="xterm-256color")
    args = ()
    if how == "NO_COLOR":
        env["NO_COLOR"] = "1"
    else:
        args = ("--no-color",)
    data = _screen_bytes(env, *args)
    assert colour_codes(data) == set()
    attributes = {p for params in SGR.findall(data) for p in params.split(b";")}
    assert attributes & {b"1", b"7"}, "bold or reverse still mark what is selected"


def test_colours_are_sent_otherwise():
    assert colour_codes(_screen_bytes(dict(os.environ, TERM="xterm-256color")))
