"""Every character the page draws (its text and its CSS-generated marks) is in a font this machine
has, as Debian's Chromium finds fonts (fontconfig): no missing-glyph boxes, in a real browser, with
a card reserved and a process on another."""

from __future__ import annotations

import subprocess
from functools import cache

from conftest import GIB, Card, require_tool
from test_web_page import serve
from webpage import browser  # noqa: F401 - browser is a fixture

# Text, and each element's ::before and ::after content, as drawn.
DRAWN = """() => {
  const out = [document.body.innerText];
  for (const el of document.querySelectorAll("*")) {
    for (const pseudo of ["::before", "::after"]) {
      const content = getComputedStyle(el, pseudo).content;
      if (content && content !== "none" && content !== "normal") out.push(content);
    }
  }
  return out.join("\\n");
}"""


@cache
def has_glyph(char: str) -> bool:
    found = subprocess.run([require_tool("fc-list"), f":charset={ord(char):x}", "family"],
                           capture_output=True, text=True, check=True)
    return bool(found.stdout.strip())


def test_every_character_on_the_page_has_a_glyph(fake_driver, idle_processes, browser):  # noqa: F811
    holder = idle_processes()
    fake_driver.machine.cards = [Card(mem_total=40 * GIB), Card(mem_total=40 * GIB)]
    fake_driver.machine.procs = [dict(gpu=1, pid=holder.pid, mem=8 * GIB)]
    fake_driver.write()
    assert fake_driver.run("reserve", "--gpu", "0", "--for", "1h", "--note", "deadline").returncode == 0
    with serve(fake_driver) as served:
        page = browser.new_page()
        page.goto(served.url)
        page.wait_for_selector('[data-card="0"] .reservation')
        drawn = page.evaluate(DRAWN)
        page.close()
    missing = sorted({c for c in drawn if ord(c) > 0x7E and not c.isspace() and not has_glyph(c)})
    assert not missing, f"no font has {[f'U+{ord(c):04X} {c}' for c in missing]}"
