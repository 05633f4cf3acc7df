"""The command line: parse the arguments, run the subcommand's module, and turn every error into
one line on stderr and a documented exit status (never a traceback)."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Sequence

from gpumon.errors import EXIT_OK, EXIT_USAGE, GpumonError
from gpumon.sanitize import printable

EXIT_INTERNAL = 70  # EX_SOFTWARE: a bug in gpumon, not the user's input
# The environment gpumon was started with, before it changes any of it for itself (the TUI sets
# NO_COLOR and drops COLUMNS/LINES): jobs launched from the TUI get this one.
STARTUP_ENVIRONMENT = dict(os.environ)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("GPUMON_LOG", "WARNING").upper(),
                        format="gpumon: %(message)s")
    try:
        from gpumon.cli.parser import build_parser, normalise_argv

        parser = build_parser()
        args = parser.parse_args(normalise_argv(list(sys.argv[1:] if argv is None else argv), parser))
        # `serve` is the one command that serves TLS through asyncio; the TUI imports it after
        # its first frame, which it draws without.
        if args.subcommand not in ("serve", "tui"):
            from gpumon.cli.asyncio_without_tls import import_asyncio_without_tls

            import_asyncio_without_tls()
        # Each subcommand imports only what it needs: `snapshot` never loads the TUI.
        return importlib.import_module(f"gpumon.cli.{args.subcommand}").run(args)
    except GpumonError as exc:
        # Messages quote what the user typed: no control characters (newlines included) may reach
        # the terminal. Only an alert rule's error has lines of its own: the rule and a caret.
        from gpumon.alerting.rules import RuleError

        text = str(exc)
        lines = [printable(line) for line in text.split("\n")] if isinstance(exc, RuleError) else [printable(text)]
        print("gpumon: error: " + "\n".join(lines), file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `gpumon snapshot | head`
        sys.stderr.close()
        return EXIT_OK
    except SystemExit as exc:  # --help / --version
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except Exception as exc:  # a bug: one line for the user, the traceback on request
        if os.environ.get("GPUMON_DEBUG"):
            raise
        print(f"gpumon: internal error: {type(exc).__name__}: {printable(str(exc))} "
              "(GPUMON_DEBUG=1 shows the traceback; please report it)", file=sys.stderr)
        return EXIT_INTERNAL
