"""`gpumon completion bash|zsh|fish|tcsh`: a static completion script made from the argument parser.

bash, zsh and tcsh come from shtab; shtab has no fish, so fish's `complete` lines are written here from
the same parser. Nothing runs gpumon at completion time: the script lists what the parser knows."""

from __future__ import annotations

import argparse
import sys


def run(args: argparse.Namespace) -> int:
    from gpumon.cli.parser import build_parser

    parser = build_parser()
    if args.shell == "fish":
        sys.stdout.write(fish_script(parser))
    else:
        import shtab

        sys.stdout.write(shtab.complete(parser, shell=args.shell))
    return 0


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
            if action.choices:
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
