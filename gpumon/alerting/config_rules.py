"""The config file's alert rules, checked when any command reads the config (not only by the commands
that use them), so a broken rule is found by the first command run after it was written."""

from __future__ import annotations

from gpumon.alerting.grammar import RuleError
from gpumon.alerting.kinds import parse_rule
from gpumon.config import Config, line_of
from gpumon.errors import UsageError


def check_config_rules(config: Config) -> None:
    """UsageError, one line naming the file, the line and the rule, for the first rule that does not parse."""
    for key, rules in (("rules", config.rules), ("watch.rules", config.watch_rules)):
        for rule in rules:
            try:
                parse_rule(rule)
            except RuleError as exc:
                message = str(exc).split("\n", 1)[0].removeprefix("alert rule: ")
                file, line = config.origins.get(key, (config.path, None))
                line = line_of(config.texts.get(file, ""), rule) or line
                where = f"line {line}: " if line else ""
                raise UsageError(f"config {file}: {where}bad alert rule {rule!r}: {message}") from None
