"""Host lists: what `--hosts`, `--hostfile` and the config's `[fleet]` name.

An entry is an ssh destination exactly as the user's own `ssh` takes it (`gpu01`, `me@gpu01`, an
alias from ~/.ssh/config), `ssh://[user@]host[:port]` (`host:port` is not ssh syntax), or `local`
(this machine, read without ssh). `gpu[01-08]` expands to gpu01 … gpu08 (padding kept; also
`gpu[1-3,7]`), `@NAME` to the group NAME of `[fleet.groups]` (groups may name groups). Entries are
separated by commas or whitespace, `#` starts a comment in a host file.

A name that starts with `-` is refused (ssh would read it as an option), and so is anything but the
characters host names, users and aliases are made of: a host list is often pasted from elsewhere.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from gpumon.errors import UsageError

LOCAL = "local"
MAX_HOSTS = 4096
_NAME = re.compile(r"^[A-Za-z0-9_.@%+:-]+$")  # host, user@host, alias, IPv6 (fe80::1%eth0)
_RANGE = re.compile(r"\[([0-9,\-]+)\]")
_GROUP = re.compile(r"^@[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class HostSpec:
    name: str  # as listed: shown to people, and the HOST of HOST:INDEX card ids
    destination: str  # what ssh is given ("local": none)
    port: int | None = None  # from ssh://host:port

    @property
    def is_local(self) -> bool:
        return self.name == LOCAL


def split_entries(text: str) -> list[str]:
    """Entries separated by commas or whitespace, except the commas inside `[...]` ranges."""
    entries, current, depth = [], [], 0
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth = max(0, depth - 1)
        if depth == 0 and (char == "," or char.isspace()):
            entries.append("".join(current))
            current = []
        else:
            current.append(char)
    entries.append("".join(current))
    return [e for e in entries if e]


def expand_ranges(entry: str) -> list[str]:
    """`gpu[01-03]` -> gpu01, gpu02, gpu03; several ranges multiply (`r[1-2]n[1-2]`: four hosts)."""
    match = _RANGE.search(entry)
    if match is None:
        return [entry]
    numbers: list[str] = []
    for part in match.group(1).split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise UsageError(f"bad host range {entry!r}: expected e.g. gpu[01-08] or gpu[1-3,7]")
        if not dash:
            numbers.append(low)
            continue
        if int(high) < int(low):
            raise UsageError(f"bad host range {entry!r}: {low}-{high} counts down")
        if int(high) - int(low) >= MAX_HOSTS:
            raise UsageError(f"host range {entry!r} is too large (at most {MAX_HOSTS} hosts)")
        width = len(low) if low.startswith("0") else 0
        numbers += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    head, tail = entry[:match.start()], entry[match.end():]
    return [head + number + rest for number in numbers for rest in expand_ranges(tail)]


def parse_entry(entry: str) -> HostSpec:
    """One host, checked: what ssh will be given, never an option."""
    if entry.startswith("-"):
        raise UsageError(f"bad host {entry!r}: a host name cannot start with '-'")
    if entry == LOCAL:
        return HostSpec(LOCAL, "")
    if entry.startswith("ssh://"):
        try:
            url = urlsplit(entry)
            port = url.port
        except ValueError:
            raise UsageError(f"bad host {entry!r}: expected ssh://[user@]host[:port]") from None
        if not url.hostname or url.path not in ("", "/") or url.query or url.fragment or url.password:
            raise UsageError(f"bad host {entry!r}: expected ssh://[user@]host[:port]")
        host = url.hostname
        destination = f"{url.username}@{host}" if url.username else host
        if destination.startswith("-") or not _NAME.match(destination):
            raise UsageError(f"bad host {entry!r}: unexpected characters in the user or host name")
        return HostSpec(entry, destination, port)
    if not _NAME.match(entry):
        raise UsageError(f"bad host {entry!r}: expected an ssh destination like gpu01, me@gpu01, "
                         "ssh://me@gpu01:2222 or local")
    host, colon, port = entry.rpartition(":")
    if colon and port.isdigit() and ":" not in host:  # one colon: not an IPv6 address
        raise UsageError(f"bad host {entry!r}: ssh takes no host:port; write ssh://{entry}")
    if "@" in entry and (entry.startswith("@") or entry.endswith("@") or entry.split("@", 1)[1].startswith("-")):
        raise UsageError(f"bad host {entry!r}: expected user@host")
    return HostSpec(entry, entry)


def resolve(entries: Iterable[str], groups: Mapping[str, list[str]] | None = None) -> list[HostSpec]:
    """Expand groups and ranges, check every name, drop repeats (first one wins)."""
    groups = groups or {}
    out: dict[str, HostSpec] = {}

    def add(entry: str, seen_groups: tuple[str, ...]) -> None:
        if entry.startswith("@"):
            name = entry[1:]
            if not _GROUP.match(entry):
                raise UsageError(f"bad host group {entry!r}: expected @NAME")
            if name in seen_groups:
                raise UsageError(f"host group @{name} includes itself")
            if name not in groups:
                known = ", ".join("@" + g for g in sorted(groups)) or "none: add [fleet.groups] to the config"
                raise UsageError(f"unknown host group @{name} (groups: {known})")
            for member in groups[name]:
                for item in split_entries(member):
                    add(item, seen_groups + (name,))
            return
        for name in expand_ranges(entry):
            spec = parse_entry(name)
            out.setdefault(spec.name, spec)
            if len(out) > MAX_HOSTS:
                raise UsageError(f"too many hosts (at most {MAX_HOSTS})")

    for entry in entries:
        add(entry, ())
    return list(out.values())


def parse_hosts(text: str, groups: Mapping[str, list[str]] | None = None) -> list[HostSpec]:
    """`--hosts gpu01,gpu[02-04],@lab,local`."""
    if not split_entries(text):
        raise UsageError("--hosts is empty: expected e.g. gpu01,gpu02 or @lab")
    hosts = resolve(split_entries(text), groups)
    if not hosts:
        raise UsageError("--hosts is empty: expected e.g. gpu01,gpu02 or @lab")
    return hosts


def read_hostfile(path: str, groups: Mapping[str, list[str]] | None = None) -> list[HostSpec]:
    """One or more entries per line; `#` starts a comment."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read host file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    entries = [entry for line in text.splitlines() for entry in split_entries(line.split("#", 1)[0])]
    hosts = resolve(entries, groups)
    if not hosts:
        raise UsageError(f"host file {path} lists no hosts")
    return hosts
