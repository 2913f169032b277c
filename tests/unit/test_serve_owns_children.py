"""``VLLMServer`` owns its process group, checked in seconds with a stand-in for vLLM (a
shell that leaves a grandchild behind, as vLLM's EngineCore does). The same with a real
vLLM and real signals: tests/integration/test_serve_lifecycle.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from seed_agents.serve import VLLMServer


def _fake_vllm(tmp_path: Path) -> str:
    script = tmp_path / "fake-python"
    script.write_text("#!/bin/sh\nsleep 300 &\nexec sleep 301\n")  # a grandchild, then the "api_server"
    script.chmod(0o755)
    return str(script)


def _live(pgid: int) -> list[int]:
    out = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            out.append(int(entry))
    return out


def _until(check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_stop_ends_the_grandchildren_too(tmp_path):
    server = VLLMServer(str(tmp_path), work_dir=tmp_path / "w", port=9, python=_fake_vllm(tmp_path), stop_grace_s=5)
    server.start()
    pgid = os.getpgid(server.process.pid)
    assert pgid != os.getpgrp() and _until(lambda: len(_live(pgid)) == 3, 30)  # watchdog, sleep, sleep
    server.stop()
    assert _live(pgid) == []


def test_a_sigkilled_owner_takes_its_server_group_along(tmp_path):
    code = (f"from seed_agents.serve import VLLMServer; import time; "
            f"s = VLLMServer({str(tmp_path)!r}, work_dir={str(tmp_path / 'w')!r}, port=9, "
            f"python={_fake_vllm(tmp_path)!r}, stop_grace_s=2); s.start(); print(s.process.pid, flush=True); "
            f"time.sleep(300)")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pgid = os.getpgid(int(owner.stdout.readline()))
    try:
        assert _until(lambda: len(_live(pgid)) == 3, 30)
        owner.kill()  # no cleanup code of the owner runs
        owner.wait()
        assert _until(lambda: _live(pgid) == [], 30), f"left running: {_live(pgid)}"
    finally:
        owner.kill()
        owner.wait()
        owner.stdout.close()
        if _live(pgid):
            os.killpg(pgid, 9)
