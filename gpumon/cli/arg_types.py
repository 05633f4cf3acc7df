"""The types that check the command line's values: intervals, counts, percentages, sizes,
durations, signal names, times, report spans and demo scenarios, each a one-line usage error when wrong."""

from __future__ import annotations

import argparse

from gpumon.errors import UsageError

MIN_INTERVAL = 0.1
# The demo's scenarios, repeated here so parsing never imports the demo backend (a test checks
# that the two lists agree).
DEMO_SCENARIOS = ("default", "workstation", "hot", "lost", "mixed")


def interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= MIN_INTERVAL:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be at least {MIN_INTERVAL} s, got {text}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def percent(text: str) -> float:
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r}") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"must be between 0 and 100, got {text}")
    return value


def size(text: str) -> str:
    """Checks SIZE syntax now; a percentage is resolved later against each card's total."""
    from gpumon.units import parse_size

    try:
        parse_size(text, total=1 << 40)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


SIGNAL_NAMES = {"term": "terminate", "terminate": "terminate", "kill": "kill", "int": "interrupt",
                 "interrupt": "interrupt"}


def duration(text: str) -> float:
    from gpumon.units import parse_duration

    try:
        return parse_duration(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def signal_name(text: str) -> str:
    name = SIGNAL_NAMES.get(text.lower().removeprefix("sig"))
    if name is None:
        raise argparse.ArgumentTypeError(f"unknown signal {text!r}: choose TERM, KILL or INT")
    return name


def unix_time(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a unix time: {text!r}") from None
    if not 0 < value < 1e11:  # also rejects nan
        raise argparse.ArgumentTypeError(f"not a unix time: {text!r}")
    return value


def scenario(text: str, usage: bool = False) -> str:
    """`usage`: the message stands alone (not after argparse's "argument --scenario:")."""
    if text not in DEMO_SCENARIOS:
        message = f"unknown demo scenario {text!r}; choose from {', '.join(DEMO_SCENARIOS)}"
        raise UsageError(message) if usage else argparse.ArgumentTypeError(message)
    return text


# Subcommands repeat the options that apply to them (so `gpumon snapshot --demo` works as well as
# `gpumon --demo snapshot`); a subparser's defaults are SUPPRESSed so they never overwrite a value
# given before the subcommand.


REPORT_BY = ("user", "job", "card", "day")
SHELLS = ("bash", "zsh", "fish", "tcsh")


def span(text: str) -> float:
    """`report --since`: how far back."""
    from gpumon.units import parse_duration

    try:
        return parse_duration(text, "--since", above_zero=True)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("bad --since ")) from None


def when(text: str) -> float:
    """`report --from/--to`: a date, a local time or unix seconds."""
    from gpumon.usage.settings import parse_when

    try:
        return parse_when(text, "time")
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("bad time ")) from None


def report_by(text: str) -> str:
    if text not in REPORT_BY:
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(REPORT_BY)}")
    return text
