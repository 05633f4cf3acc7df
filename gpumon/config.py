"""The config file: TOML in the user's config dir (~/.config/gpumon/config.toml), or --config FILE,
or $GPUMON_CONFIG. Command-line options win over it; rules from both are used together.

    interval = 1.0
    theme = "gpumon-dark"

    [watch]
    rules = ["temp > 85 for 30s", "lost", "xid"]
    on_alert = "logger -t gpumon"
    hook_timeout = 10
    format = "jsonl"
    prometheus = "127.0.0.1:9400"
    prometheus_processes = false
    prometheus_hostname = "gpu01"     # the exported Hostname label (default: this machine's name)
    web_config_file = "/etc/gpumon/web.yml"   # TLS and basic auth for the exporter (--web-config-file)

    [fleet]
    hosts = ["gpu01", "gpu[02-08]"]   # the TUI's hosts when no --hosts is given
    ssh = "ssh -F ~/.ssh/lab_config"
    remote = "~/.local/bin/gpumon"
    prometheus_url = "http://prometheus:9090"   # the TUI reads this cluster when no --hosts is given
    prometheus_user = "gpumon"                  # a Prometheus that demands a login: the user,
    prometheus_password_file = "~/.config/gpumon/prometheus-password"   # and the password's file

    [fleet.groups]
    lab = ["gpu01", "gpu02", "me@gpu03"]   # --hosts @lab

    [paths]                           # where the kernel's file systems are (--path.sysfs, --path.procfs)
    sysfs = "/host/sys"
    procfs = "/host/proc"

    [owners]                          # where this host's records of who runs what are
    pods_dir = "/host/var/log/pods"   # the kubelet's pod log directories
    docker_dir = "/host/var/lib/docker"
    podman_dir = "/host/var/lib/containers/storage"
    nerdctl_dir = "/host/var/lib/nerdctl"
    job_map_dir = "/run/gpu-jobs"     # a file per card (index or UUID) with its jobs, from the prolog

    [serve]                           # `gpumon serve`, the web page
    listen = "0.0.0.0:8080"           # default 127.0.0.1:8080 (beyond loopback a token is required)
    token_file = "~/.config/gpumon/serve-token"   # the access token (default: generated, in the state dir)
    tls_cert = "/etc/gpumon/cert.pem"             # HTTPS with this certificate
    tls_key = "/etc/gpumon/key.pem"               # and its key

    [claims]                          # sharing this host's cards (gpumon/sharing)
    dir = "/run/lock/gpumon"          # the shared sticky folder (default /tmp/gpumon-claims)
    idle_release = "30m"              # a reservation whose holder has no process on the card this long ends:
                                      # the system file's is the host's, for everyone; a user's own may only
                                      # shorten it, for the reservations that user makes
    [history]                 # the usage ledger (gpumon report; gpumon/usage/settings.py checks it)
    path = "/var/lib/gpumon/usage.sqlite"   # default: usage.HOST.sqlite in the state folder
    keep = "90d"
    keep_minutes = "2d"                    # then one row per hour
    price_per_kwh = 0.25

    [health]                  # the card health rules (gpumon/health/rules.py checks this table)
    window = "10m"
    [health.rules.pcie_replays]
    threshold = 20

A bad file is a usage error naming the file, the line and the key.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs

from gpumon.errors import UsageError
from gpumon.units import parse_duration

SYSTEM_PATH = "/etc/gpumon/config.toml"
DEFAULT_THEME = "gpumon-dark"  # the TUI's colours when neither the config nor --theme name others

# section -> key -> accepted types
SCHEMA: dict[str, dict[str, tuple[type, ...]]] = {
    "": {"interval": (int, float), "theme": (str,), "readonly": (bool,), "rules": (list,)},
    "watch": {"rules": (list,), "on_alert": (str,), "hook_timeout": (int, float), "format": (str,),
              "prometheus": (str,), "prometheus_processes": (bool,), "prometheus_hostname": (str,),
              "web_config_file": (str,)},
    "fleet": {"hosts": (list,), "ssh": (str,), "remote": (str,), "groups": (dict,), "prometheus_url": (str,),
              "prometheus_user": (str,), "prometheus_password_file": (str,)},
    "owners": {"pods_dir": (str,), "docker_dir": (str,), "podman_dir": (str,), "nerdctl_dir": (str,),
               "job_map_dir": (str,)},
    "paths": {"sysfs": (str,), "procfs": (str,)},
    "health": {"window": (str,), "interval": (str,), "rules": (dict,), "xid": (dict,), "xid_state": (str,)},
    "serve": {"listen": (str,), "token_file": (str,), "tls_cert": (str,), "tls_key": (str,)},
    "claims": {"dir": (str,), "idle_release": (str,)},
    "history": {"path": (str,), "keep": (str,), "keep_minutes": (str,), "price_per_kwh": (int, float),
                "record": (bool,)},
    "jobs": {"keep": (int,), "keep_for": (str,)},
}
JOBS_KEEP = 200  # finished jobs whose records are kept (the newest), and for how long
JOBS_KEEP_FOR_S = 30 * 86400.0


@dataclass
class Config:
    path: Path | None = None
    # Where each key in force came from: "section.key" -> (file, line); absent keys are defaults.
    origins: dict[str, tuple[Path, int | None]] = field(default_factory=dict)
    texts: dict[Path, str] = field(default_factory=dict)  # each file as read: later checks find a value's line
    interval: float | None = None
    theme: str | None = None
    readonly: bool = False
    rules: list[str] = field(default_factory=list)  # shown as badges in the TUI
    watch_rules: list[str] = field(default_factory=list)
    on_alert: str | None = None
    hook_timeout: float = 10.0
    format: str | None = None
    prometheus: str | None = None
    prometheus_processes: bool = False
    prometheus_hostname: str | None = None
    web_config_file: str | None = None
    fleet_hosts: list[str] = field(default_factory=list)
    fleet_ssh: str | None = None
    fleet_remote: str | None = None
    fleet_groups: dict[str, list[str]] = field(default_factory=dict)
    fleet_prometheus_url: str | None = None
    fleet_prometheus_user: str | None = None
    fleet_prometheus_password_file: str | None = None  # ~ expanded; relative to the config file's folder
    owners: dict[str, str] = field(default_factory=dict)  # [owners]: where the host's records are
    path_sysfs: str | None = None  # [paths]: where /sys and /proc are (AMD and Intel cards, processes)
    path_procfs: str | None = None
    health: dict = field(default_factory=dict)  # the [health] table, as written
    serve_listen: str | None = None  # [serve]: the web page's address, and (paths, ~ expanded,
    serve_token_file: str | None = None  # relative to the config file's folder) its token and TLS files
    serve_tls_cert: str | None = None
    serve_tls_key: str | None = None
    claims_dir: str | None = None  # [claims]: the host's shared place for claims, the queue, reservations
    claims_idle_release: str | None = None  # a reservation unused this long is released (default 30m)
    # The system file's: the host's limit, the same for every user (the user's may only shorten theirs).
    claims_idle_release_host: str | None = None
    history: dict = field(default_factory=dict)  # the [history] table, as written (path: ~ expanded, relative
    # to the config file's folder)
    jobs_keep: int = JOBS_KEEP  # [jobs]: finished jobs kept, the newest, and for how long
    jobs_keep_for: float = JOBS_KEEP_FOR_S


def default_path() -> Path:
    return Path(platformdirs.user_config_dir("gpumon")) / "config.toml"


def system_path() -> Path:
    """The admin's file, read before the user's ($GPUMON_SYSTEM_CONFIG: for tests and packagers)."""
    return Path(os.environ.get("GPUMON_SYSTEM_CONFIG") or SYSTEM_PATH)


def user_theme_dir() -> Path:
    return Path(platformdirs.user_config_dir("gpumon")) / "themes"


def shipped_theme_dir() -> Path:
    """The repo's themes/ folder: inside the package when installed from a wheel (pyproject maps
    it to gpumon/themes), at the top of the checkout when run from source or installed editable."""
    package = Path(__file__).resolve().parent
    installed = package / "themes"
    return installed if installed.is_dir() else package.parent / "themes"


def theme_names() -> list[str]:
    """The names the theme files give (shipped, then the user's), read without Textual: what the
    config's `theme` must name, checked by every command, the TUI's or not."""
    names = []
    for folder in (shipped_theme_dir(), user_theme_dir()):
        for path in sorted(folder.glob("*.toml")) if folder.is_dir() else ():
            try:
                name = tomllib.loads(path.read_text()).get("name")
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
                continue
            if isinstance(name, str) and name not in names:
                names.append(name)
    return names


def _group_cycle(groups: dict[str, list[str]]) -> str | None:
    """A group of [fleet.groups] that includes itself, directly or through others, or None."""
    def members(group: str) -> list[str]:
        return [entry[1:] for text in groups.get(group, []) for entry in re.split(r"[\s,]+", text)
                if entry.startswith("@")]

    def reaches(start: str) -> bool:
        seen, todo = set(), members(start)
        while todo:
            group = todo.pop()
            if group == start:
                return True
            if group not in seen:
                seen.add(group)
                todo += members(group)
        return False

    return next((group for group in groups if reaches(group)), None)


def _line_of(text: str, key: str, section: str | None = None) -> int | None:
    """The line where `key =` is written; inside [section] when it is given ("" the top, before any table)."""
    start, stop = 0, len(text)
    if section is not None:
        if section:
            header = re.search(rf"^\s*\[{re.escape(section)}\]", text, re.MULTILINE)
            if header is None:
                return _line_of(text, key)
            start = header.end()
        following = re.compile(r"^\s*\[", re.MULTILINE).search(text, start)
        stop = following.start() if following else len(text)
    match = re.compile(rf"^\s*{re.escape(key)}\s*=", re.MULTILINE).search(text, start, stop)
    return text.count("\n", 0, match.start()) + 1 if match else None


def line_of(text: str, value: str) -> int | None:
    """The line of the file where a string value is written (its first occurrence)."""
    at = text.find(value)
    return text.count("\n", 0, at) + 1 if at >= 0 else None


def _read(file: Path) -> tuple[str, dict]:
    """The file's text and its tables, each key checked against SCHEMA (errors name this file)."""
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read config {file}: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"config {file}: TOML syntax error: {exc}") from None

    def bad(key: str, message: str) -> UsageError:
        line = _line_of(text, key.rsplit(".", 1)[-1])
        where = f"line {line}: " if line else ""
        return UsageError(f"config {file}: {where}{message}")

    for section, schema in SCHEMA.items():
        table = data if section == "" else data.get(section, {})
        if section and not isinstance(table, dict):
            raise bad(section, f"[{section}] must be a table")
        for key, value in table.items():
            name = f"{section}.{key}" if section else key
            if section == "" and key in SCHEMA and isinstance(value, dict):
                continue
            if key not in schema:
                raise bad(key, f"unknown key {name!r}")
            if not isinstance(value, schema[key]) or (isinstance(value, bool) and bool not in schema[key]):
                wanted = " or ".join(t.__name__ for t in schema[key])
                raise bad(key, f"{name!r} must be {wanted}, not {type(value).__name__}")
            if key in ("rules", "hosts") and not all(isinstance(r, str) for r in value):
                raise bad(key, f"{name!r} must be a list of strings")
            for group, members in (value.items() if key == "groups" else ()):
                if not isinstance(members, list) or not all(isinstance(h, str) for h in members):
                    raise bad(group, f"group {group!r} of [fleet.groups] must be a list of host names")
    return text, data


def load_config(path: str | None = None) -> Config:
    """The system file (when present), then the explicit file (which must exist), else $GPUMON_CONFIG,
    else the user's default if present: each key from the last file that sets it."""
    explicit = path or os.environ.get("GPUMON_CONFIG")
    user = Path(explicit) if explicit else default_path()
    files = [f for f in (system_path(),) if f.exists() and f.resolve() != user.resolve()]
    if user.exists():
        files.append(user)
    elif explicit:
        raise UsageError(f"config file not found: {user}")
    if not files:
        return Config()
    data: dict = {}
    config = Config(path=files[-1])
    for file in files:
        text, layer = _read(file)
        config.texts[file] = text
        if file.resolve() == system_path().resolve():
            config.claims_idle_release_host = layer.get("claims", {}).get("idle_release") or None
        for section in SCHEMA:
            table = layer if section == "" else layer.get(section, {})
            for key, value in table.items():
                if section == "" and key in SCHEMA and isinstance(value, dict):
                    continue
                (data if section == "" else data.setdefault(section, {}))[key] = value
                config.origins[f"{section}.{key}" if section else key] = (file, _line_of(text, key, section))

    def bad(key: str, message: str) -> UsageError:
        file, line = config.origins.get(key, (config.path, None))
        where = f"line {line}: " if line else ""
        return UsageError(f"config {file}: {where}{message}")

    def folder(key: str) -> Path:  # paths in a file are relative to its folder
        return config.origins.get(key, (config.path, None))[0].parent

    top, watch = data, data.get("watch", {})
    config.interval = float(top["interval"]) if "interval" in top else None
    if config.interval is not None and not config.interval >= 0.1:
        raise bad("interval", f"'interval' must be at least 0.1 s, got {config.interval}")
    config.theme = top.get("theme")
    if config.theme is not None and config.theme not in (names := theme_names()):
        raise bad("theme", f"unknown theme {config.theme!r}; choose from {', '.join(names)}")
    config.readonly = top.get("readonly", False)
    config.rules = list(top.get("rules", []))
    config.watch_rules = list(watch.get("rules", []))
    config.on_alert = watch.get("on_alert")
    if config.on_alert is not None and not config.on_alert.strip():
        raise bad("watch.on_alert", "'watch.on_alert' is empty: give a shell command line, or leave the key out")
    config.hook_timeout = float(watch.get("hook_timeout", 10.0))
    config.format = watch.get("format")
    if config.format not in (None, "jsonl", "text"):
        raise bad("watch.format", f"'watch.format' must be \"jsonl\" or \"text\", not {config.format!r}")
    config.prometheus = watch.get("prometheus")
    config.prometheus_processes = watch.get("prometheus_processes", False)
    config.prometheus_hostname = watch.get("prometheus_hostname")
    config.web_config_file = watch.get("web_config_file")
    fleet = data.get("fleet", {})
    config.fleet_hosts = list(fleet.get("hosts", []))
    config.fleet_ssh = fleet.get("ssh")
    config.fleet_remote = fleet.get("remote")
    config.fleet_groups = {str(k): list(v) for k, v in fleet.get("groups", {}).items()}
    if (looped := _group_cycle(config.fleet_groups)) is not None:
        raise bad("fleet.groups", f"host group @{looped} includes itself (through [fleet.groups])")
    config.fleet_prometheus_url = fleet.get("prometheus_url")
    config.fleet_prometheus_user = fleet.get("prometheus_user") or None
    config.health = dict(data.get("health", {}))
    if fleet.get("prometheus_password_file"):
        config.fleet_prometheus_password_file = str(folder("fleet.prometheus_password_file")
                                                    / Path(fleet["prometheus_password_file"]).expanduser())
    config.history = dict(data.get("history", {}))
    if config.history.get("path"):
        config.history["path"] = str(folder("history.path") / Path(config.history["path"]).expanduser())
    config.owners = {key: value for key, value in data.get("owners", {}).items() if value}
    paths = data.get("paths", {})
    config.path_sysfs, config.path_procfs = paths.get("sysfs") or None, paths.get("procfs") or None
    serve = data.get("serve", {})
    config.serve_listen = serve.get("listen") or None
    config.serve_token_file, config.serve_tls_cert, config.serve_tls_key = (
        str(folder(f"serve.{key}") / Path(serve[key]).expanduser()) if serve.get(key) else None
        for key in ("token_file", "tls_cert", "tls_key"))
    jobs = data.get("jobs", {})
    config.jobs_keep = jobs.get("keep", JOBS_KEEP)
    if config.jobs_keep < 0:
        raise bad("jobs.keep", f"'jobs.keep' must be 0 or more, got {config.jobs_keep}")
    if "keep_for" in jobs:
        try:
            config.jobs_keep_for = parse_duration(jobs["keep_for"])
        except UsageError:
            raise bad("jobs.keep_for", f"'jobs.keep_for' must be a duration like \"720h\" or \"30d\", "
                                  f"not {jobs['keep_for']!r}") from None
    if bool(config.serve_tls_cert) != bool(config.serve_tls_key):
        raise bad("serve.tls_cert" if config.serve_tls_cert else "serve.tls_key",
                  "[serve] needs both tls_cert and tls_key (the certificate and its private key)")
    claims = data.get("claims", {})
    config.claims_dir = claims.get("dir") or None
    config.claims_idle_release = claims.get("idle_release") or None
    return config
