"""A launch on another host: the `LaunchRequest` the run dialog or `gpumon run` builds, as the
arguments of that host's `gpumon run` (its gpumon pins, limits and supervises the job there).

    RemoteGpumon(...).launch(run_args(request))   # or fleet.remote(HOST).launch(...)

Everything after `--` is the command word for word; the transport quotes it for the remote shell.
The working directory is the host's: given only when the request names one (default: the remote
home). A request with `typed` (a command line typed in the TUI) is already `sh -c TYPED`.
"""

from __future__ import annotations

from gpumon.jobs.launch import LaunchRequest


def run_args(request: LaunchRequest) -> list[str]:
    out = ["--gpu", request.gpu_spec]
    for flag, value in (("--mem-limit", request.mem_limit), ("--name", request.name),
                        ("--min-free", request.min_free), ("--cwd", request.cwd)):
        if value is not None:
            out += [flag, str(value)]
    if request.wait_timeout is not None:
        out += ["--wait-timeout", f"{request.wait_timeout:g}s"]
    for flag, number in (("--max-util", request.max_util), ("--interval", request.interval)):
        if number is not None:
            out += [flag, f"{number:g}"]
    if request.failover:
        out += ["--failover", str(request.failover)]
    for flag, on in (("--no-numa", not request.numa), ("--foreground", request.foreground),
                     ("--wait", request.wait), ("--systemd", request.systemd), ("--as-typed", request.as_typed)):
        if on:
            out.append(flag)
    return out + ["--", *request.command]
