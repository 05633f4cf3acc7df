"""Who may read `gpumon serve`, and what it answers: the access token beyond loopback (made once,
kept 0600, or read from the config's file), GET only, local names only on loopback, TLS, the same
JSON as `snapshot --json` and `health --json`, and bad input as one line with status 2."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

from conftest import Card, require_tool
from webpage import Served, browser, get  # noqa: F401 - browser is a fixture

A100 = "NVIDIA A100-SXM4-40GB"


def serve_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpumon", "serve", "--interval", "0.5", *args]


def one_line_error(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpumon: error: ") and "Traceback" not in result.stderr, lines
    for word in words:
        assert word in lines[0], lines[0]


def test_beyond_loopback_every_request_needs_the_token(fake_driver, browser):  # noqa: F811
    fake_driver.machine.cards = [Card(A100), Card(A100)]
    fake_driver.write()
    state = Path(os.environ["XDG_STATE_HOME"]) / "gpumon" / "serve-token"
    with Served(serve_argv("--listen", "0.0.0.0:0"), fake_driver.env) as served:
        assert served.token and "printed this once" in served.line
        assert state.read_text().strip() == served.token and state.stat().st_mode & 0o777 == 0o600
        for path in ("/", "/events", "/api/snapshot", "/api/health", "/app.js", "/nowhere"):
            status, _, body = get(served.base + path)
            assert status == 401 and body.count(b"\n") == 1 and b"token" in body, (path, status, body)
            assert get(served.base + path + "?token=" + served.token[:-1] + "x")[0] == 401
            assert get(served.base + path, {"Authorization": "Bearer nottheone"})[0] == 401
        status, headers, body = get(f"{served.base}/api/snapshot?token={served.token}")
        assert status == 200 and headers["Content-Type"].startswith("application/json")
        ours = json.loads(body)
        status, _, body = get(served.base + "/api/health", {"Authorization": f"Bearer {served.token}"})
        assert status == 200 and json.loads(body)["verdict"] == "ok"
        # Read-only: nothing but GET, with the token or without.
        for method in ("POST", "PUT", "DELETE", "HEAD"):
            assert get(f"{served.base}/api/snapshot?token={served.token}", method=method)[0] == 405
        # The same document as `gpumon snapshot --json` (times and moving values aside).
        theirs = json.loads(fake_driver.run("snapshot", "--json").stdout)
        assert set(ours) == set(theirs) and [set(g) for g in ours["gpus"]] == [set(g) for g in theirs["gpus"]]
        assert [(g["uuid"], g["name"]) for g in ours["gpus"]] == [(g["uuid"], g["name"]) for g in theirs["gpus"]]

        # The printed URL in a browser: the page, and its event stream through the cookie it was given.
        context = browser.new_context()
        page = context.new_page()
        page.goto(f"{served.base}/?token={served.token}")
        page.wait_for_selector('[data-card="1"]')
        cookie = next(c for c in context.cookies() if c["name"] == "gpumon_token")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        # Without it, a page gets nothing.
        stranger = browser.new_page()
        response = stranger.goto(served.base + "/")
        assert response.status == 401 and stranger.locator(".card").count() == 0
        context.close()
        stranger.close()

    # The next start keeps the token, and does not print it again.
    with Served(serve_argv("--listen", "0.0.0.0:0"), fake_driver.env) as again:
        assert again.token is None and str(state) in again.line
        assert get(f"{again.base}/api/health?token={served.token}")[0] == 200


def test_the_configs_token_file_and_tls(fake_driver, tmp_path):
    require_tool("openssl")
    fake_driver.machine.cards = [Card(A100)]
    fake_driver.write()
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost"], check=True, capture_output=True)
    (tmp_path / "token").write_text("a-token-the-admin-chose-0123456789\n")
    config = tmp_path / "config.toml"
    config.write_text('[serve]\nlisten = "0.0.0.0:0"\ntoken_file = "token"\n'
                      'tls_cert = "cert.pem"\ntls_key = "key.pem"\n')
    trusting = ssl.create_default_context(cafile=str(cert))
    trusting.check_hostname = False
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=trusting))
    with Served(serve_argv("--config", str(config)), fake_driver.env) as served:
        assert served.url.startswith("https://") and served.token == "a-token-the-admin-chose-0123456789"
        request = urllib.request.Request(f"{served.base}/api/health",
                                         headers={"Authorization": f"Bearer {served.token}"})
        with opener.open(request, timeout=10) as response:
            assert response.status == 200 and json.loads(response.read())["verdict"] == "ok"
    assert not (Path(os.environ["XDG_STATE_HOME"]) / "gpumon" / "serve-token").exists()

    (tmp_path / "token").write_text("short\n")
    one_line_error(fake_driver.run("serve", "--config", str(config)), "token file", "at least 16")
    config.write_text('[serve]\ntls_cert = "missing.pem"\ntls_key = "key.pem"\n')
    one_line_error(fake_driver.run("serve", "--config", str(config)), "missing.pem")
    config.write_text('[serve]\ntls_cert = "key.pem"\ntls_key = "cert.pem"\n')
    one_line_error(fake_driver.run("serve", "--config", str(config)), "tls_cert")
    config.write_text('[serve]\ntls_cert = "cert.pem"\n')
    one_line_error(fake_driver.run("serve", "--config", str(config)), "tls_key")


def test_on_loopback_no_token_but_only_local_names(fake_driver):
    fake_driver.machine.cards = [Card(A100)]
    fake_driver.write()
    with Served(serve_argv("--listen", "127.0.0.1:0"), fake_driver.env) as served:
        assert served.token is None and "this machine only" in served.line
        status, headers, _ = get(served.base + "/")
        assert status == 200 and "script-src 'self'" in headers["Content-Security-Policy"]
        assert get(served.base + "/api/health", {"Host": f"localhost:{served.port}"})[0] == 200
        # A site whose name points at 127.0.0.1 (DNS rebinding) is not this machine's page.
        assert get(served.base + "/api/snapshot", {"Host": f"attacker.example:{served.port}"})[0] == 403


def test_bad_addresses_a_port_in_use_and_signals(fake_driver):
    fake_driver.machine.cards = [Card(A100)]
    fake_driver.write()
    for bad, word in (("nonsense", "nonsense"), ("::1:8080", "brackets"), ("[nothost]:80", "IPv6"),
                      ("127.0.0.1:70000", "70000"), ("no.such.host.invalid:8080", "cannot listen")):
        one_line_error(fake_driver.run("serve", "--listen", bad), word)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        one_line_error(fake_driver.run("serve", "--listen", f"127.0.0.1:{port}"), "cannot listen", str(port))
    finally:
        taken.close()
    # Ctrl-C ends it as cleanly as SIGTERM (Served checks SIGTERM on leaving).
    served = Served(serve_argv("--listen", "[::1]:0" if socket.has_ipv6 else "127.0.0.1:0"), fake_driver.env)
    status, errors = served.stop(signal.SIGINT)
    assert status == 0 and not errors.strip(), errors
