"""The gateway as the CLI runs it, in front of a fake vLLM, as real processes on loopback.

Shared by the load test and the soak: the gateway (``python -m seed_agents.gateway``:
uvicorn, keep-alive, the in-flight limit) and a fake vLLM served by uvicorn in its own
process (no model, so the gateway's own work is what gets loaded), both stopped, children
included, when the context ends.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

MODEL = "tiny"
FAKE_UPSTREAM = """
import sys, uvicorn
from transformers import AutoTokenizer
from seed_agents.gateway.testing import FakeVLLM
uvicorn.run(FakeVLLM(AutoTokenizer.from_pretrained(sys.argv[1]), model="tiny").app,
            host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""
BUSY_LOOP = "import time\nend = time.monotonic() + float(__import__('sys').argv[1])\nwhile time.monotonic() < end: pass"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, proc: subprocess.Popen[bytes], log: Path, path: str) -> None:
    deadline = time.monotonic() + 120  # generous: a loaded 2-core machine imports torch slowly
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"not up: {log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def busy_loop(seconds: float) -> subprocess.Popen[bytes]:
    """A process that keeps one core busy for a bounded time (stop it with ``stop``)."""
    return subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(seconds)])


@contextlib.contextmanager
def gateway_on_fake_vllm(tokenizer_dir: str, work: Path, *extra: str) -> Iterator[tuple[str, Path, subprocess.Popen[bytes]]]:
    """(gateway URL, its SQLite store file, the gateway process); ``extra`` are gateway flags."""
    up_port, gw_port = free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with open(work / "upstream.log", "ab") as log:
            procs.append(up := subprocess.Popen([sys.executable, "-c", FAKE_UPSTREAM, tokenizer_dir, str(up_port)],
                                                stdout=log, stderr=subprocess.STDOUT))
        wait_up(f"http://127.0.0.1:{up_port}", up, work / "upstream.log", "/v1/models")
        db = work / "traces.db"
        with open(work / "gateway.log", "ab") as log:
            procs.append(gw := subprocess.Popen(
                [sys.executable, "-m", "seed_agents.gateway", "--upstream", f"http://127.0.0.1:{up_port}", "--model", MODEL,
                 "--tokenizer", tokenizer_dir, "--store", f"sqlite:///{db}", "--port", str(gw_port), *extra],
                stdout=log, stderr=subprocess.STDOUT, cwd=work))
        wait_up(f"http://127.0.0.1:{gw_port}", gw, work / "gateway.log", "/health")
        yield f"http://127.0.0.1:{gw_port}", db, gw
    finally:
        for p in reversed(procs):
            stop(p)
