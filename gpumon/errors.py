"""Errors that end gpumon with a one-line message and a documented exit status."""

EXIT_OK = 0
EXIT_ALERT = 1
EXIT_USAGE = 2
EXIT_NO_DRIVER = 3
EXIT_SOME_UNREAD = 4  # a fleet command read some hosts, not all (it printed what it read)
EXIT_NONE_READ = 5  # a fleet command could read no host at all


def answered_status(answered) -> int:
    """A fleet command's exit status from whether each host answered: 0 all, 4 some, 5 none."""
    answered = list(answered)
    if all(answered):
        return EXIT_OK
    return EXIT_SOME_UNREAD if any(answered) else EXIT_NONE_READ


class GpumonError(Exception):
    """A problem the user can act on; `cli.main` prints it as one line."""

    exit_status = EXIT_USAGE


class UsageError(GpumonError):
    """Bad command-line input, config or file (exit status 2)."""


class NoDriverError(GpumonError):
    """The NVIDIA driver or its library cannot be used (exit status 3)."""

    exit_status = EXIT_NO_DRIVER
