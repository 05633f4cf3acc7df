"""The exporter behind TLS and basic auth (`--web-config-file`, the exporter-toolkit's format), read by
a real Prometheus; dcgm-exporter's XID count; framebuffer memory in whole MiB, read back the same."""

from __future__ import annotations

import base64
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest
from conftest import GIB, Card, require_tool
from promlab import Prometheus, end, exposition, free_port, serve_and_scrape, wait_until

from gpumon.exporter.collector import GpumonCollector
from gpumon.model import GpuSample, Snapshot

MIB = 1 << 20


def certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (the CA Prometheus is told to trust)."""
    openssl = require_tool("openssl")
    cert, key = folder / "server.crt", folder / "server.key"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def web_config(folder: Path, users: dict[str, str], tls: bool = True) -> Path:
    """A web config as node_exporter's users write it: relative certificate paths, `$2y$` hashes
    (htpasswd's; bcrypt's cost 4 keeps the test quick)."""
    hashes = {u: bcrypt.hashpw(p.encode(), bcrypt.gensalt(4)).decode().replace("$2b$", "$2y$", 1)
              for u, p in users.items()}
    lines = ["tls_server_config:", "  cert_file: server.crt", "  key_file: server.key"] if tls else []
    lines += ["basic_auth_users:"] + [f"  {u}: {h}" for u, h in hashes.items()]
    path = folder / "web.yml"
    path.write_text("\n".join(lines) + "\n")
    return path


def get(url: str, cafile: Path | None = None, login: tuple[str, str] | None = None) -> tuple[int, str]:
    headers = {"Authorization": "Basic " + base64.b64encode(":".join(login).encode()).decode()} if login else {}
    context = ssl.create_default_context(cafile=str(cafile)) if cafile else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5, context=context) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def start_watch(argv: list[str], env: dict[str, str], port: int, cert: Path) -> subprocess.Popen:
    watch = subprocess.Popen([sys.executable, "-m", "gpumon", "watch", *argv], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)

    def serving() -> bool:
        assert watch.poll() is None, watch.stderr.read()
        try:
            return get(f"https://127.0.0.1:{port}/metrics", cert)[0] == 401
        except OSError:
            return False

    wait_until(serving, 60, "the exporter over TLS")
    return watch


def test_real_prometheus_scrapes_over_tls_with_basic_auth_and_is_refused_without(fake_driver, tmp_path):
    binary = require_tool("prometheus")
    fake_driver.machine.cards = [Card("NVIDIA L4", mem_total=24 * GIB, extra=dict(temp=67)),
                                 Card("NVIDIA L4", mem_total=24 * GIB, extra=dict(temp=41))]
    fake_driver.write()
    cert, _ = certificate(tmp_path)
    config = web_config(tmp_path, {"alice": "s3cret pass", "bob": "other"})
    port = free_port()
    watch = start_watch(["--interval", "0.5", "--prometheus", str(port), "--web-config-file", str(config)],
                        fake_driver.env, port, cert)
    target = {"static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
    tls = {"scheme": "https", "tls_config": {"ca_file": str(cert)}}
    prometheus = Prometheus(binary, tmp_path, [
        {"job_name": "secured", **tls, "basic_auth": {"username": "alice", "password": "s3cret pass"}, **target},
        {"job_name": "no-login", **tls, **target},
        {"job_name": "wrong-password", **tls, "basic_auth": {"username": "alice", "password": "nope"}, **target},
        {"job_name": "plain-http", **target},
    ])
    try:
        prometheus.start()
        temps = prometheus.wait_for_series('DCGM_FI_DEV_GPU_TEMP{job="secured"}', 2)
        assert {r["metric"]["gpu"]: float(r["value"][1]) for r in temps} == {"0": 67.0, "1": 41.0}
        up = {r["metric"]["job"]: r["value"][1] for r in prometheus.wait_for_series("up", 4)}
        assert up == {"secured": "1", "no-login": "0", "wrong-password": "0", "plain-http": "0"}
        assert prometheus.query('DCGM_FI_DEV_GPU_TEMP{job!="secured"}') == []
        # As a client sees it: 401 without a login or with a wrong one, nothing over plain HTTP.
        url = f"https://127.0.0.1:{port}/metrics"
        assert get(url, cert)[0] == 401
        assert get(url, cert, ("alice", "nope"))[0] == 401
        assert get(url, cert, ("mallory", "s3cret pass"))[0] == 401
        status, body = get(url, cert, ("bob", "other"))
        assert status == 200 and "DCGM_FI_DEV_GPU_TEMP{" in body
        with pytest.raises(OSError):
            get(f"http://127.0.0.1:{port}/metrics")
    finally:
        prometheus.stop()
        end(watch)
        watch.stderr.close()


def test_the_fleet_exporter_takes_the_same_web_config(fake_driver, tmp_path):
    fake_driver.machine.cards = [Card("NVIDIA L4")]
    fake_driver.write()
    cert, _ = certificate(tmp_path)
    config = web_config(tmp_path, {"alice": "pw"})
    port = free_port()
    watch = start_watch(["--hosts", "local", "--interval", "0.5", "--prometheus", str(port), "--web-config-file",
                         str(config)], fake_driver.env, port, cert)
    try:
        def host_up() -> str | None:
            status, body = get(f"https://127.0.0.1:{port}/metrics", cert, ("alice", "pw"))
            return body if status == 200 and 'gpumon_host_up{Hostname="local"} 1.0' in body else None

        assert 'DCGM_FI_DEV_GPU_TEMP{' in wait_until(host_up, 60, "the fleet exporter's local host")
        assert get(f"https://127.0.0.1:{port}/metrics", cert)[0] == 401
    finally:
        end(watch)
        watch.stderr.close()


def test_basic_auth_over_plain_http_when_no_tls_is_given_from_the_config_file(fake_driver, tmp_path):
    fake_driver.machine.cards = [Card()]
    fake_driver.write()
    config = tmp_path / "config.toml"
    config.write_text(f'[watch]\nweb_config_file = "{web_config(tmp_path, {"alice": "pw"}, tls=False)}"\n')
    port = free_port()
    watch = subprocess.Popen([sys.executable, "-m", "gpumon", "--config", str(config), "watch", "--interval", "0.5",
                              "--prometheus", str(port)], env=fake_driver.env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/metrics"

        def answers() -> int | None:
            try:
                return get(url)[0]
            except OSError:
                return None

        assert wait_until(answers, 60, "the exporter") == 401
        assert get(url, login=("alice", "pw"))[0] == 200
    finally:
        end(watch)


def test_a_password_over_bcrypts_72_bytes_is_refused_not_an_error(fake_driver, tmp_path):
    fake_driver.machine.cards = [Card()]
    fake_driver.write()
    port = free_port()
    config = web_config(tmp_path, {"alice": "pw"}, tls=False)
    watch = subprocess.Popen([sys.executable, "-m", "gpumon", "watch", "--interval", "0.5", "--prometheus", str(port),
                              "--web-config-file", str(config)], env=fake_driver.env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        assert wait_until(lambda: _answer(url), 60, "the exporter") == 401
        for user in ("alice", "mallory"):
            assert get(url, login=(user, "x" * 73))[0] == 401
        assert get(url, login=("alice", "pw"))[0] == 200
    finally:
        end(watch)
    assert "Traceback" not in watch.stderr.read()
    watch.stderr.close()


def _answer(url: str, login: tuple[str, str] | None = None) -> int | None:
    try:
        return get(url, login=login)[0]
    except OSError:
        return None


def test_a_known_scraper_stays_fast_while_wrong_passwords_are_hammered(fake_driver, tmp_path):
    """bcrypt at the cost htpasswd uses, over TLS: 40 wrong passwords at once must not hold up a
    scrape whose login was already checked (each check takes a core for ~50 ms; unbounded, they
    all run at once and the scrape's handshake waits for a core behind them)."""
    fake_driver.machine.cards = [Card()]
    fake_driver.write()
    cert, _ = certificate(tmp_path)
    port = free_port()
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(10)).decode().replace("$2b$", "$2y$", 1)
    config = tmp_path / "web.yml"
    config.write_text(f"tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                      f"basic_auth_users:\n  alice: {hashed}\n")
    watch = start_watch(["--interval", "0.5", "--prometheus", str(port), "--web-config-file", str(config)],
                        fake_driver.env, port, cert)
    url = f"https://127.0.0.1:{port}/metrics"
    try:
        assert get(url, cert, ("alice", "pw"))[0] == 200  # checked once, then known
        hammering = [threading.Thread(target=get, args=(url, cert, ("alice", f"wrong{i}"))) for i in range(40)]
        for thread in hammering:
            thread.start()
        time.sleep(0.2)  # the wrong passwords are being checked
        took = []
        for _ in range(3):
            began = time.monotonic()
            assert get(url, cert, ("alice", "pw"))[0] == 200
            took.append(time.monotonic() - began)
        for thread in hammering:
            thread.join(60)
        assert min(took) < 0.3, took
    finally:
        end(watch)
        watch.stderr.close()


@pytest.mark.parametrize(("content", "says"), [
    (None, "No such file or directory"),
    ("tls_server_config: [\n", "not YAML"),
    ("- a list\n", "expected a mapping"),
    ("http_server_config:\n  http2: false\n", "'http_server_config' is not supported"),
    ("tls_server_config:\n  cert_file: server.crt\n", "key_file is missing"),
    ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_ca_file: ca.crt\n",
     "'client_ca_file' is not supported"),
    ("tls_server_config:\n  cert_file: missing.crt\n  key_file: server.key\n", "cannot load cert_file"),
    ("basic_auth_users:\n  alice: plaintext\n", "alice's password is not a bcrypt hash"),
    ("basic_auth_users:\n  alice: $2y$10$tooshort\n", "alice's password is not a valid bcrypt hash"),
])
def test_a_bad_web_config_is_one_line_and_exit_status_2(fake_driver, tmp_path, content, says):
    fake_driver.machine.cards = [Card()]
    fake_driver.write()
    path = tmp_path / "web.yml"
    if content is not None:
        path.write_text(content)
    out = fake_driver.run("watch", "--prometheus", str(free_port()), "--web-config-file", str(path), "--count", "1")
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith(f"gpumon: error: bad --web-config-file {path}: ") and says in out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr


def test_web_config_without_an_exporter_is_a_usage_error(fake_driver, tmp_path):
    (tmp_path / "web.yml").write_text("basic_auth_users: {}\n")
    out = fake_driver.run("watch", "--web-config-file", str(tmp_path / "web.yml"), "--count", "1")
    assert out.returncode == 2 and out.stderr == ("gpumon: error: --web-config-file secures the exporter: give "
                                                  "--prometheus ADDR too\n")


def test_xids_are_counted_per_code_within_dcgm_exporters_window(fake_driver):
    """DCGM_EXP_XID_ERRORS_COUNT as dcgm-exporter's: the card's labels, the window (5 minutes) in ms
    and the code; two XID 79 and one XID 48 on card 1 within it."""
    fake_driver.machine.cards = [Card(), Card()]
    fake_driver.machine.xids = [dict(gpu=1, at=0.3, code=79), dict(gpu=1, at=0.6, code=48),
                                dict(gpu=1, at=0.9, code=79)]
    fake_driver.write()
    port = free_port()
    argv = [sys.executable, "-m", "gpumon", "watch", "--interval", "0.3", "--prometheus", str(port)]
    body = serve_and_scrape(argv, fake_driver.env, port, lambda b: 'xid="79"} 2.0' in b and 'xid="48"} 1.0' in b)
    counts = [line for line in body.splitlines() if line.startswith("DCGM_EXP_XID_ERRORS_COUNT{")]
    assert len(counts) == 2 and all('gpu="1",' in line and 'window_size_in_ms="300000"' in line for line in counts)
    assert "# TYPE DCGM_EXP_XID_ERRORS_COUNT gauge" in body


def test_framebuffer_is_whole_mib_as_dcgm_gives_it_and_reads_back_the_same():
    """DCGM divides NVML's bytes by 2^20 and drops the rest: 62739.2 MiB used is 62739, never
    62739.199999809265; the Prometheus source reads back what was exported."""
    from gpumon.fleet.prometheus.dcgm import read_cluster

    used, free, total = int(62739.2 * MIB), int(18179.7 * MIB), 81559 * MIB
    card = GpuSample(index=0, uuid="GPU-0", name="NVIDIA H100", pci_bus_id="00000000:17:00.0", memory_used=used,
                     memory_free=free, memory_total=total)
    snap = Snapshot(time=0.0, host="node1", backend="nvml", driver_version=None, cuda_driver_version=None,
                    gpus=(card,))
    body = exposition(GpumonCollector(lambda: snap)).decode()
    values = {line.split("{", 1)[0]: line.rsplit(" ", 1)[1] for line in body.splitlines()
              if line.startswith("DCGM_FI_DEV_FB_")}
    assert values == {"DCGM_FI_DEV_FB_USED": "62739.0", "DCGM_FI_DEV_FB_FREE": "18179.0",
                      "DCGM_FI_DEV_FB_RESERVED": "640.0"}
    labels = {"gpu": "0", "UUID": "GPU-0", "modelName": "NVIDIA H100", "Hostname": "node1"}
    readings = [({**labels, "__name__": name}, float(v)) for name, v in values.items()]
    back = read_cluster(0.0, [(labels, 0.0)], readings, [], []).hosts["node1"].snapshot().gpus[0]
    assert (back.memory_used, back.memory_free, back.memory_total) == (62739 * MIB, 18179 * MIB, 81558 * MIB)
