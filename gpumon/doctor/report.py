"""Every check, in the order a newcomer fixes things: the driver, this machine, the config, the hosts."""

from __future__ import annotations

from gpumon.config import Config, load_config
from gpumon.doctor.check import FAIL, OK, Check
from gpumon.doctor.claims import claims_folder
from gpumon.doctor.hosts import host_checks
from gpumon.doctor.local import cgroup_layout, driver_checks, exporter_port, other_processes, textual_range
from gpumon.errors import UsageError


def config_check(path: str | None) -> tuple[Check, Config]:
    from gpumon.alerting.config_rules import check_config_rules
    from gpumon.health.rules import parse_settings

    try:
        config = load_config(path)
        check_config_rules(config)
        parse_settings(config.health, f"config {config.path}")
    except UsageError as exc:
        return Check("config.valid", FAIL, str(exc), "correct that line of the config"), Config()
    found = f"{config.path} is valid" if config.path else "no config file: the defaults are used"
    return Check("config.valid", OK, found), config


def all_checks(config_path: str | None, nvml_lib: str | None) -> list[Check]:
    checked, config = config_check(config_path)
    checks = driver_checks(nvml_lib)
    checks += [other_processes(), cgroup_layout(), checked, claims_folder(config)]
    checks += host_checks(config)
    checks += [exporter_port(config.prometheus), textual_range()]
    return checks


__all__ = ["FAIL", "OK", "all_checks", "config_check"]
