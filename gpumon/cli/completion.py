"""`gpumon completion bash|zsh|fish|tcsh`: a static completion script made from the argument parser.

bash, zsh and tcsh come from shtab; shtab has no fish, so fish's `complete` lines are written here from
the same parser. Nothing runs gpumon at completion time: the script lists what the parser knows."""

from __future__ import annotations

import argparse
import sys

# Where bash-completion looks for a command's script on demand (its XDG data folder); shtab's own
# header names ~/.local/share/bash_completion/, which it never reads.
BASH_FOLDER = "~/.local/share/bash-completion/completions"
GPU_SPECS = ("auto", "auto:1", "auto:2", "auto:4", "auto:8")  # SPEC's forms that need no card of this host


def run(args: argparse.Namespace) -> int:
    from gpumon.cli.parser import build_parser

    parser = build_parser()
    _offer_values(parser)
    if args.shell == "fish":
        sys.stdout.write(fish_script(parser))
    else:
        import shtab

        script = shtab.complete(parser, shell=args.shell)
        sys.stdout.write(_bash_header(script) if args.shell == "bash" else script)
    return 0


def _bash_header(script: str) -> str:
    lines = script.split("\n")
    usage = next((i for i, line in enumerate(lines) if line.startswith("# Usage:")), None)
    if usage is None:
        return script
    end = next((i for i in range(usage + 1, len(lines)) if not lines[i].startswith("# ")), len(lines))
    ours = ["# Usage: save it where bash-completion loads it when gpumon is first completed:",
            f"#   mkdir -p {BASH_FOLDER} && gpumon completion bash > {BASH_FOLDER}/gpumon",
            "# (or `source` it from ~/.bashrc)."]
    return "\n".join(lines[:usage] + ours + lines[end:])


def _offer_values(parser: argparse.ArgumentParser) -> None:
    """Values for options whose words the parser checks itself (a type, not choices): `report
    --by`, `--theme` (the theme files' names), `run --gpu` (auto[:N]). shtab reads `.complete`,
    fish_script `.values`."""
    from gpumon.cli.arg_types import REPORT_BY
    from gpumon.config import theme_names

    wanted = {(None, "--theme"): tuple(theme_names()), ("report", "--by"): REPORT_BY, ("run", "--gpu"): GPU_SPECS}
    parsers = [(None, parser), *((name, sub) for name, (sub, _) in _subparsers(parser).items())]
    for name, each in parsers:
        for action in each._actions:
            for option in action.option_strings:
                if (values := wanted.get((name, option))) is not None:
                    function = "_gpumon_values_" + option.strip("-").replace("-", "_") + (f"_{name}" if name else "")
                    words = " ".join(values)
                    action.values = values  # type: ignore[attr-defined]
                    action.complete = {  # type: ignore[attr-defined]
                        "bash": function, "zsh": "(" + words.replace(":", "\\:") + ")",
                        "preamble": {"bash": f"{function}() {{ compgen -W '{words}' -- \"$1\"; }}\n"}}


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _help(action: argparse.Action) -> str:
    text = (action.help or "").replace("%%", "%")
    return text.split(". ")[0][:90]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    found: dict[str, tuple[argparse.ArgumentParser, str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                found[name] = (sub, helps.get(name, ""))
    return found


def _option_lines(parser: argparse.ArgumentParser, condition: str) -> list[str]:
    lines = []
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        spec = []
        for option in action.option_strings:
            spec += ["-l", option[2:]] if option.startswith("--") else ["-s", option[1:]]
        if action.nargs != 0:
            if getattr(action, "values", None):
                spec += ["-x", "-a", _quote(" ".join(action.values))]
            elif action.choices:
                spec += ["-x", "-a", _quote(" ".join(map(str, action.choices)))]
            elif action.metavar in ("FILE", "PATH", "DIR"):
                spec += ["-r", "-F"]
            else:
                spec += ["-x"]
        described = _help(action)
        lines.append(" ".join(["complete -c gpumon", "-n", _quote(condition), *spec]
                              + (["-d", _quote(described)] if described else [])))
    return lines


def fish_script(parser: argparse.ArgumentParser) -> str:
    subs = _subparsers(parser)
    names = " ".join(subs)
    top = "not __fish_seen_subcommand_from " + names
    lines = ["# gpumon completion for fish, made from its argument parser (`gpumon completion fish`)",
             "complete -c gpumon -f"]
    lines += _option_lines(parser, top)
    for name, (sub, described) in subs.items():
        lines.append(f"complete -c gpumon -n {_quote(top)} -a {name} -d {_quote(described.replace('%%', '%')[:90])}")
    for name, (sub, _) in subs.items():
        inner = _subparsers(sub)
        seen = f"__fish_seen_subcommand_from {name}"
        lines += _option_lines(sub, seen)
        for child, (grand, described) in inner.items():
            lines.append(f"complete -c gpumon -n {_quote(seen + '; and not __fish_seen_subcommand_from ' + child)} "
                         f"-a {child} -d {_quote(described[:90])}")
            lines += _option_lines(grand, f"{seen}; and __fish_seen_subcommand_from {child}")
    return "\n".join(lines) + "\n"
