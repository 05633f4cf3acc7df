"""gpumon(1), written in roff from the argument parser: every command with its options, so the page
can never disagree with `--help`. Made when the package is built (setup.py); nothing of it is kept in git."""

from __future__ import annotations

import argparse

from gpumon import __version__

EXIT_STATUS = [
    ("0", "ok"),
    ("1", "watch --exit-on-alert saw an alert; select found too few free cards; health found a card that "
          "warns; doctor a check that warns"),
    ("2", "bad input (one line on stderr naming the bad part); health found a card that fails; doctor a "
          "check that fails"),
    ("3", "no card of any vendor: no usable NVIDIA driver and no AMD or Intel GPU"),
    ("70", "a bug in gpumon (GPUMON_DEBUG=1 shows the traceback)"),
]
ENVIRONMENT = [
    ("GPUMON_CONFIG", "the config file, as --config"),
    ("GPUMON_NVML_LIB", "the libnvidia-ml.so.1 to load, as --nvml-lib"),
    ("GPUMON_SSH", "the ssh command line, as --ssh"),
    ("NO_COLOR", "no colours, as --no-color"),
    ("GPUMON_DEBUG", "show the traceback of an internal error"),
]


def roff(text: str) -> str:
    """Text as roff reads it literally: backslashes and hyphens escaped, no line starting a request."""
    text = text.replace("\\", "\\e").replace("-", "\\-").replace("%%", "%")
    return "\n".join("\\&" + line if line[:1] in (".", "'") else line for line in text.split("\n"))


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser, str]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            found += [(name, sub, helps.get(name, "")) for name, sub in action.choices.items()]
    return found


def _options(parser: argparse.ArgumentParser) -> list[str]:
    lines = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
            continue
        if action.option_strings:
            value = "" if action.nargs == 0 else " " + (action.metavar or action.dest.upper())
            names = ", ".join(f"\\fB{roff(o)}\\fR" for o in action.option_strings) + (
                f" \\fI{roff(value.strip())}\\fR" if value else "")
        else:
            names = f"\\fI{roff(str(action.metavar or action.dest))}\\fR"
        lines += [".TP", names, roff(action.help or "")]
    return lines


def manpage(parser: argparse.ArgumentParser) -> str:
    out = [f'.TH GPUMON 1 "" "gpumon {__version__}" "User Commands"', ".SH NAME",
           "gpumon \\- " + roff(parser.description or ""), ".SH SYNOPSIS",
           "\\fBgpumon\\fR [\\fIOPTIONS\\fR]", ".br", "\\fBgpumon\\fR \\fICOMMAND\\fR [\\fIOPTIONS\\fR]",
           ".SH DESCRIPTION",
           "Without a command, gpumon is the interactive monitor; each command below is a headless tool.",
           ".SH OPTIONS"]
    out += _options(parser)
    out.append(".SH COMMANDS")
    for name, sub, described in _subparsers(parser):
        out += [f".SS {roff(name)}", roff(sub.description or described)]
        out += _options(sub)
        for child, grand, child_help in _subparsers(sub):
            out += [f".SS {roff(name)} {roff(child)}", roff(grand.description or child_help)]
            out += _options(grand)
    out.append(".SH EXIT STATUS")
    for code, meaning in EXIT_STATUS:
        out += [".TP", f"\\fB{code}\\fR", roff(meaning)]
    out.append(".SH ENVIRONMENT")
    for name, meaning in ENVIRONMENT:
        out += [".TP", f"\\fB{name}\\fR", roff(meaning)]
    out += [".SH FILES", ".TP", roff("~/.config/gpumon/config.toml"), "the user's config", ".SH SEE ALSO",
            "nvidia\\-smi(1), nvtop(1)"]
    return "\n".join(out) + "\n"
