"""Colour themes: TOML files of Textual theme fields, shipped in themes/ and added by users in
their config dir (~/.config/gpumon/themes/). A broken file is reported, never fatal."""

from __future__ import annotations

import tomllib

from textual.theme import Theme

from gpumon.config import DEFAULT_THEME, shipped_theme_dir, user_theme_dir

DEFAULT = DEFAULT_THEME
MONOCHROME = "monochrome"
_FIELDS = {"name", "primary", "secondary", "warning", "error", "success", "accent", "foreground",
           "background", "surface", "panel", "boost", "dark", "luminosity_spread", "text_alpha", "variables"}


def _theme_files() -> list[tuple[str, str]]:
    """(label, TOML text) of the shipped themes, then the user's (which may replace them)."""
    found = [(f"themes/{path.name}", path.read_text()) for path in sorted(shipped_theme_dir().glob("*.toml"))]
    user_dir = user_theme_dir()
    if user_dir.is_dir():
        for path in sorted(user_dir.glob("*.toml")):
            try:
                found.append((str(path), path.read_text()))
            except OSError as exc:
                found.append((str(path), f"\0{exc}"))
    return found


def parse_theme(text: str) -> Theme:
    data = tomllib.loads(text)
    unknown = set(data) - _FIELDS
    if unknown:
        raise ValueError(f"unknown key {sorted(unknown)[0]!r}")
    if "name" not in data or "primary" not in data:
        raise ValueError("a theme needs at least 'name' and 'primary'")
    return Theme(**data)


def load_themes() -> tuple[list[Theme], list[str]]:
    """All themes that load, and one message per file that does not."""
    themes: list[Theme] = []
    problems: list[str] = []
    for label, text in _theme_files():
        try:
            if text.startswith("\0"):
                raise ValueError(text[1:])
            themes.append(parse_theme(text))
        except (ValueError, TypeError, tomllib.TOMLDecodeError) as exc:
            problems.append(f"theme {label} not loaded: {exc}")
    return themes, problems
