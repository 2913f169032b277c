"""`seed-agents serve` owns its vLLM processes: after a SIGTERM to `serve`, or a SIGKILL of
`serve` itself, no process of vLLM's group (api_server, EngineCore, worker, resource
tracker) is left and the port binds again. Two real server starts, one per signal.

The group is read from /proc, independently of ``seed_agents._reaper.group_members``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from seed_agents.serve import free_port
from tests.conftest import require_vllm

pytestmark = pytest.mark.integration

GRACE_S = 20  # serve's --stop-grace-s
SETTLE_S = 60  # beyond the grace: a loaded 2-core machine is slow to tear down 1 GB of KV cache


def _group(pgid: int) -> dict[int, str]:
    """Every process (zombies included) whose process group is ``pgid``: pid -> comm."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        comm = stat[stat.index(b"(") + 1 : stat.rindex(b")")].decode(errors="replace")
        if int(stat[stat.rindex(b")") + 2 :].split()[2]) == pgid:
            found[int(entry)] = comm
    return found


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _port_binds(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server would; a LISTEN socket still blocks
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _until(check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


# SIGKILL (serve cannot clean up; its children must still go) in the default suite, SIGTERM
# (the graceful path) in the slow tier: each starts a vLLM server (~50 s).
@pytest.mark.parametrize("sig", [pytest.param(signal.SIGTERM, marks=pytest.mark.slow), signal.SIGKILL],
                         ids=["sigterm", "sigkill"])
def test_stopping_serve_leaves_no_vllm_process(sig, tiny_model_dir, tmp_path):
    require_vllm()
    port = free_port()
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        serve = subprocess.Popen(
            [sys.executable, "-m", "seed_agents", "serve", "--model", tiny_model_dir, "--port", str(port),
             "--work-dir", str(tmp_path / "work"), "--max-model-len", "2048", "--stop-grace-s", str(GRACE_S)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
    pgid = None
    try:
        deadline = time.monotonic() + 600
        while True:  # healthy, and the server's own processes started
            assert serve.poll() is None, f"serve exited early:\n{log_path.read_text()[-3000:]}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            assert time.monotonic() < deadline, f"vLLM not healthy after 600 s:\n{log_path.read_text()[-3000:]}"
            time.sleep(1)
        (pgid,) = {os.getpgid(c) for c in _children(serve.pid)}
        assert pgid != os.getpgid(serve.pid)  # vLLM runs in a group of its own
        running = _group(pgid)
        assert any(c.startswith("VLLM::EngineCor") for c in running.values()), running  # grandchildren are in it

        serve.send_signal(sig)
        code = serve.wait(timeout=GRACE_S + SETTLE_S)
        if sig == signal.SIGTERM:
            assert code == 0, log_path.read_text()[-3000:]
        gone = _until(lambda: not _group(pgid), GRACE_S + SETTLE_S)
        assert gone, f"left running after {sig.name} to serve: {_group(pgid)} (was {running})"
        assert _until(lambda: _port_binds(port), 30), f"port {port} still held after {sig.name}"
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
        if pgid is not None:  # never leak a server into the rest of the session
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
