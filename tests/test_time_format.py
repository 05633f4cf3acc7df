"""One way to print a time, in every view: the clock today, the weekday within six days either
side, the date further off; the page's script follows the same rule as units.format_time."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from gpumon.units import format_time

NOW = 1_796_845_260.0  # Wed 2026-12-09 19:41:00 UTC (conftest pins TZ=UTC)
APP_JS = Path(__file__).resolve().parent.parent / "gpumon" / "web" / "assets" / "app.js"
CASES = [(NOW, False, "19:41"), (NOW + 5, True, "19:41:05"), (NOW - 19 * 3600, False, "00:41"),
         (NOW + 5 * 3600 + 60, False, "Thu 00:42"), (NOW - 86400, False, "Tue 19:41"),
         (NOW + 6 * 86400, False, "Tue 19:41"), (NOW - 6 * 86400, True, "Thu 19:41:00"),
         (NOW + 7 * 86400, False, "2026-12-16 19:41"), (NOW - 30 * 86400, False, "2026-11-09 19:41")]


@pytest.mark.parametrize(("t", "seconds", "shown"), CASES)
def test_format_time_says_the_day_when_it_is_not_today(t, seconds, shown):
    assert time.strftime("%a %Y-%m-%d %H:%M", time.localtime(NOW)) == "Wed 2026-12-09 19:41"
    assert format_time(t, now=NOW, seconds=seconds) == shown


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the page's script")
def test_the_page_prints_a_time_by_the_same_rule():
    source = APP_JS.read_text()
    start = source.index("  const WEEKDAYS")
    end = source.index("\n  }\n", source.index("function formatTime")) + 4
    script = (source[start:end] + f"\nconst RealDate = Date; const NOW = {NOW * 1000};\n"
              "Date = class extends RealDate { constructor(...a) { super(...(a.length ? a : [NOW])); } };\n"
              "Date.UTC = RealDate.UTC;\n"
              f"console.log(JSON.stringify({json.dumps([[t, s] for t, s, _ in CASES])}"
              ".map(([t, s]) => formatTime(t, s))));")
    out = subprocess.run([shutil.which("node"), "-e", script], capture_output=True, text=True, timeout=30,
                         env={"TZ": "UTC"})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [shown for _, _, shown in CASES]
    assert not re.search(r"toLocale(Time)?String", source), "a time on the page bypasses formatTime"
