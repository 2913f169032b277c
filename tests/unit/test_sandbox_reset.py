"""A sandbox that replays write to starts every episode from the same state.

A URL sandbox (a second running instance of the API) is one shared state: the loop resets
it (``replay.sandbox_reset``: an HTTP request or a command) before every replay and canary
episode that uses it, plays those episodes one at a time, and records an episode whose
reset failed as an infrastructure fault. A ``sandbox_app`` needs no reset: every episode
gets a fresh instance. The API is the clinic (``tests/clinic_service.py``) on loopback;
the model is a ``FakeBackend`` whose every episode joins the waitlist, so the position the
sandbox answers tells whether an earlier episode's write was still there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

pytest.importorskip("trl")

from seed_agents.app.continual import ContinualLoop
from seed_agents.app.continual_config import ContinualConfig
from seed_agents.continual.versions import served_name_of
from seed_agents.store import TraceStore
from seed_agents.testing import FakeBackend
from seed_agents.tool_calls import format_tool_call
from seed_agents.tools.openapi import AuthConfig
from seed_agents.tools.replay import ReplayConfig, ReplayTransport, SandboxResetFailed
from seed_agents.types import FaultKind
from tests.clinic_service import ClinicServer
from tests.gateway_procs import free_port

NAME = "clinic-agent"
SANDBOX_KEY = "sandbox-key-7f3a9c21e4b8"


@pytest.fixture
def prod() -> Iterator[ClinicServer]:
    with ClinicServer() as server:
        yield server


@pytest.fixture
def sandbox(monkeypatch: pytest.MonkeyPatch) -> Iterator[ClinicServer]:
    monkeypatch.setenv("CLINIC_SANDBOX_KEY", SANDBOX_KEY)
    with ClinicServer(api_key=SANDBOX_KEY, resettable=True) as server:
        yield server


class FakeServing:
    """Every version samples from one scripted backend (the loop's ``Serving`` protocol)."""

    def __init__(self, backend: FakeBackend) -> None:
        self.tokenizer, self._backend = backend.tokenizer, backend

    def load(self, version: Any) -> str:
        return served_name_of(version)

    def backend(self, version: Any) -> FakeBackend:
        return self._backend

    def unload(self, version: Any) -> None:
        pass


def waitlist_agent(tokenizer: Any, seen: list[str]) -> FakeBackend:
    """Joins the waitlist, then reports what the API answered (kept in ``seen``)."""
    def reply(prompt_ids: list[int]) -> str:
        prompt = tokenizer.decode(prompt_ids)
        if '"position"' not in prompt:
            return format_tool_call("join_waitlist", {"date": "2025-03-03"})
        answer = prompt.rsplit('"position":', 1)[1].split("}", 1)[0]
        seen.append(answer)
        return f"You are number {answer} on the waitlist."
    return FakeBackend(tokenizer, reply)


def make_loop(tmp_path: Path, tiny_model_dir: str, prod: ClinicServer, replay: dict[str, Any],
              seen: list[str], **canary: Any) -> ContinualLoop:
    tasks = tmp_path / "canary.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": f"wait-{i}", "data": {"question": "Put me on the waitlist."}}) + "\n"
                             for i in range(2)))
    cfg = ContinualConfig.model_validate({
        "name": NAME, "store": f"sqlite:///{tmp_path / 'traces.db'}", "out": str(tmp_path / "run"),
        "backend": {"kind": "local", "model": tiny_model_dir}, "skills": {"source": "none"},
        "trainer": {"lora_r": 4}, "runner": {"concurrency": 4, "progress": False, "episode_timeout_s": 60},
        "agent": {"tools": {"base_url": prod.url, "allow_hosts": ["127.0.0.1"]}, "max_turns": 2,
                  "reward": "tests.clinic_service:clinic_reward"},
        "replay": {"read_source": "recording_only", **replay}, "group_size": 2,
        "canary": {"tasks": str(tasks), "seeds": 1, **canary},
    })
    backend = waitlist_agent(AutoTokenizer.from_pretrained(tiny_model_dir), seen)
    return ContinualLoop(cfg, store=TraceStore.open(cfg.store), serving=FakeServing(backend), log=lambda _: None)


def replay_all(loop: ContinualLoop, n_sessions: int) -> list[Any]:
    """Seed ``n_sessions`` rewarded sessions and play the loop's shadow replays of them."""
    sids = []
    for i in range(n_sessions):
        sid = loop.store.create_session(f"s{i}", task_key="wait", metadata={
            "task": {"task_id": f"wait-{i}", "data": {"question": "Put me on the waitlist."}}})
        loop.store.add_reward(sid, 1.0, source="user")
        loop.store.end_session(sid)
        sids.append(sid)
    trajs, _ = asyncio.run(loop._replays(1, sids, loop.store.promoted_version(NAME)))  # type: ignore[arg-type]
    return trajs


def url_sandbox(sandbox: ClinicServer, prod: ClinicServer, **reset: Any) -> dict[str, Any]:
    return {"production_base_url": prod.url, "sandbox_base_url": sandbox.url,
            "sandbox_auth": {"kind": "header", "env": "CLINIC_SANDBOX_KEY"},
            "sandbox_reset": {"method": "POST", "path": "/reset", **reset}}


def test_the_url_sandbox_is_reset_once_before_each_replay_and_no_write_leaks(tmp_path, tiny_model_dir, prod, sandbox):
    seen: list[str] = []
    loop = make_loop(tmp_path, tiny_model_dir, prod, url_sandbox(sandbox, prod), seen)
    trajs = replay_all(loop, 2)  # 2 sessions x G=2, concurrency 4: four episodes writing to one sandbox

    assert [t.fault for t in trajs] == [None] * 4
    assert [t.metadata["replay"]["sandbox_resets"] for t in trajs] == [1] * 4
    assert [t.metadata["replay"]["sandbox_writes"] for t in trajs] == [1] * 4
    # one at a time: each episode's write directly after its own reset (a 401 would mean the key was not sent)
    assert sandbox.app.state.log == [("POST", "/reset"), ("POST", "/waitlist")] * 4
    assert seen == ["1"] * 4  # every episode found an empty waitlist: nothing leaked from the one before
    assert prod.mutating() == 0
    loop.close()


def test_without_a_reset_the_same_replays_see_each_others_writes(tmp_path, tiny_model_dir, prod, sandbox):
    """The control: the check above can fail. A shared sandbox without a reset keeps every write."""
    seen: list[str] = []
    replay = {k: v for k, v in url_sandbox(sandbox, prod).items() if k != "sandbox_reset"}
    loop = make_loop(tmp_path, tiny_model_dir, prod, replay, seen)
    trajs = replay_all(loop, 2)
    assert [t.metadata["replay"]["sandbox_resets"] for t in trajs] == [0] * 4
    assert sorted(seen) == ["1", "2", "3", "4"]
    loop.close()


def test_a_failed_reset_is_the_episodes_fault_and_nothing_is_written(tmp_path, tiny_model_dir, prod, sandbox):
    seen: list[str] = []
    loop = make_loop(tmp_path, tiny_model_dir, prod, url_sandbox(sandbox, prod, path="/no-such-reset"), seen)
    trajs = replay_all(loop, 1)
    assert [t.fault for t in trajs] == [FaultKind.ENV] * 2  # recorded as infrastructure faults, never trained on
    assert all("SandboxResetFailed" in (t.error or "") and "answered HTTP 404" in (t.error or "") for t in trajs)
    assert all(not t.calls for t in trajs)  # the episode never started
    assert sandbox.app.state.log == [] and seen == [] and prod.mutating() == 0
    loop.close()


def test_canary_episodes_on_the_replay_sandbox_are_reset_too(tmp_path, tiny_model_dir, prod, sandbox):
    seen: list[str] = []
    loop = make_loop(tmp_path, tiny_model_dir, prod, url_sandbox(sandbox, prod), seen, replay_sandbox=True)
    v0 = loop.store.promoted_version(NAME)
    decision, _ = loop.evaluate(v0, v0)  # type: ignore[arg-type]  # 2 versions x 2 tasks x 1 seed
    assert decision.n_tasks == 2  # no canary pair faulted
    assert sandbox.app.state.log == [("POST", "/reset"), ("POST", "/waitlist")] * 4
    assert seen == ["1"] * 4 and prod.mutating() == 0
    loop.close()


def test_a_sandbox_app_gives_every_replay_a_fresh_instance(tmp_path, tiny_model_dir, prod):
    seen: list[str] = []
    loop = make_loop(tmp_path, tiny_model_dir, prod, {"sandbox_app": "tests.clinic_service:create_app"}, seen)
    trajs = replay_all(loop, 2)
    assert [t.fault for t in trajs] == [None] * 4
    assert [t.metadata["replay"]["sandbox_writes"] for t in trajs] == [1] * 4
    assert seen == ["1"] * 4 and prod.mutating() == 0
    loop.close()


# ------------------------------------------------------------------ the transport alone


def test_the_reset_request_carries_the_sandboxs_credentials_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLINIC_SANDBOX_KEY", SANDBOX_KEY)
    sent: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200 if request.url.path == "/v1/admin/reset" else 500, json={})

    config = ReplayConfig(mode="shadow", production_base_url="https://clinic.example/v1",
                          sandbox_base_url="https://sandbox.clinic.example/v1",
                          sandbox_auth=AuthConfig(kind="header", env="CLINIC_SANDBOX_KEY"),
                          sandbox_reset={"method": "PUT", "path": "/admin/reset", "body": {"seed": "fixtures"}})
    transport = ReplayTransport(config, live=httpx.MockTransport(handle))
    assert transport.exclusive_sandbox
    transport.reset_sandbox()
    (request,) = sent
    assert (request.method, str(request.url)) == ("PUT", "https://sandbox.clinic.example/v1/admin/reset")
    assert request.headers["x-api-key"] == SANDBOX_KEY and json.loads(request.content) == {"seed": "fixtures"}
    fork = transport.fork()
    assert (transport.sandbox_resets, fork.sandbox_resets) == (1, 0)  # counted per episode

    broken = ReplayTransport(config.model_copy(update={"sandbox_reset": config.sandbox_reset.model_copy(  # type: ignore[union-attr]
        update={"path": "/other"})}), live=httpx.MockTransport(handle))
    with pytest.raises(SandboxResetFailed, match="answered HTTP 500") as info:
        broken.reset_sandbox()
    assert info.value.kind == FaultKind.ENV

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")
    with pytest.raises(SandboxResetFailed, match="ConnectError"):
        ReplayTransport(config, live=httpx.MockTransport(down)).reset_sandbox()


def test_a_reset_command_must_exit_zero(tmp_path: Path) -> None:
    marker = tmp_path / "reset-ran"
    base = {"mode": "shadow", "production_base_url": "http://127.0.0.1:1", "sandbox_base_url": "http://127.0.0.1:2"}
    ok = ReplayConfig.model_validate({**base, "sandbox_reset": {"command": [sys.executable, "-c",
                                                                            f"open({str(marker)!r}, 'w').write('x')"]}})
    transport = ReplayTransport(ok, live=httpx.MockTransport(lambda r: httpx.Response(599)))
    transport.reset_sandbox()
    assert marker.read_text() == "x" and transport.sandbox_resets == 1
    failing = ReplayConfig.model_validate({**base, "sandbox_reset": {"command": [
        sys.executable, "-c", "import sys; sys.exit('database dump not found')"]}})
    with pytest.raises(SandboxResetFailed, match="exited with status 1: database dump not found"):
        ReplayTransport(failing, live=httpx.MockTransport(lambda r: httpx.Response(599))).reset_sandbox()


def test_the_configs_say_which_sandbox_settings_go_together(tmp_path: Path) -> None:
    base = {"mode": "shadow", "production_base_url": "http://127.0.0.1:1", "sandbox_base_url": "http://127.0.0.1:2"}
    with pytest.raises(ValueError, match="exactly one of path"):
        ReplayConfig.model_validate({**base, "sandbox_reset": {}})
    with pytest.raises(ValueError, match="must start with '/'"):
        ReplayConfig.model_validate({**base, "sandbox_reset": {"path": "reset"}})
    with pytest.raises(ValueError, match="sandbox_reset resets a sandbox_base_url"):
        ReplayConfig.model_validate({"mode": "shadow", "sandbox_reset": {"path": "/reset"}})
    with pytest.raises(ValueError, match="two sandboxes"):
        ReplayConfig.model_validate({**base, "sandbox_app": "tests.clinic_service:create_app"})
    assert ReplayConfig(mode="shadow").sandbox_reset is None  # no sandbox: writes answered from the recording

    raw = {"store": "sqlite:///x.db", "trainer": {"lora_r": 4},
           "agent": {"tools": {"base_url": "http://127.0.0.1:1", "allow_hosts": ["127.0.0.1"]}, "reward": "m:f"},
           "canary": {"tasks": "t.jsonl", "replay_sandbox": True}}
    with pytest.raises(ValueError, match="needs a sandbox in the replay section"):
        ContinualConfig.model_validate(raw)
    with pytest.raises(ValueError, match="needs replay.sandbox_reset"):
        ContinualConfig.model_validate({**raw, "replay": base})
    cfg = ContinualConfig.model_validate({**raw, "replay": {**base, "sandbox_reset": {"path": "/reset"}}})
    assert cfg.canary.replay_sandbox and cfg.replay.mode == "shadow"


# ------------------------------------------------------------------ reset commands: how they run

ROOT = Path(__file__).resolve().parents[2]
PROD_KEY = "prod-key-0c4e8b2d9a17"
STAND_IN_API = """import os

from tests.clinic_service import create_app

assert os.path.isfile(os.environ["CLINIC_DB"])  # the fresh copy the script made
app = create_app(api_key=os.environ["CLINIC_API_KEY"], resettable=True)
"""


def command_reset(command: list[str], timeout_s: float = 30.0) -> ReplayTransport:
    config = ReplayConfig.model_validate({"mode": "shadow", "production_base_url": "http://127.0.0.1:1",
                                          "sandbox_base_url": "http://127.0.0.1:2",
                                          "sandbox_reset": {"command": command, "timeout_s": timeout_s}})
    return ReplayTransport(config, live=httpx.MockTransport(lambda r: httpx.Response(599)))


def kill_from(pidfile: Path) -> None:
    """End a process a test's reset command started (its pid in ``pidfile``), and wait for it."""
    if not pidfile.exists():
        return
    pid = int(pidfile.read_text())
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


@pytest.mark.skipif(not (shutil.which("setsid") and shutil.which("curl")), reason="the page's script uses setsid and curl")
def test_the_pages_restart_script_detaches_its_server_and_sees_the_loops_environment(tmp_path, monkeypatch):
    """docs/own_api.md's ``restart_sandbox.sh``, as written but for the port, in a user's project:
    the server it starts outlives the reset, gets the sandbox key from the loop's environment,
    writes its files in the loop's directory, and a second reset starts it afresh."""
    found = re.search(r"<!-- own-api:reset -->\n```sh\n(.*?)```", (ROOT / "docs" / "own_api.md").read_text(), re.DOTALL)
    assert found, "docs/own_api.md lost its block reset"
    port = free_port()
    project = tmp_path / "clinic_project"
    (project / "my_clinic").mkdir(parents=True)
    (project / "my_clinic" / "__init__.py").write_text("")
    (project / "my_clinic" / "api.py").write_text(STAND_IN_API)
    (project / "fixtures").mkdir()
    (project / "fixtures" / "clinic.db").write_text("fixtures")
    (project / "restart_sandbox.sh").write_text(found.group(1).replace("9001", str(port)))
    monkeypatch.chdir(project)  # the loop's working directory
    monkeypatch.setenv("CLINIC_API_KEY", PROD_KEY)
    monkeypatch.setenv("CLINIC_SANDBOX_KEY", SANDBOX_KEY)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # uvicorn
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(project), str(ROOT)]))  # the user's package, tests/
    transport = command_reset(["sh", "restart_sandbox.sh"], timeout_s=60)
    url = f"http://127.0.0.1:{port}/waitlist"
    try:
        transport.reset_sandbox()  # returns once the server answers, which goes on serving
        first = (project / "sandbox.pid").read_text()
        join = httpx.post(url, json={"date": "2025-03-04"}, headers={"X-Api-Key": SANDBOX_KEY})
        assert join.json()["position"] == 1
        assert httpx.post(url, json={"date": "2025-03-04"}, headers={"X-Api-Key": PROD_KEY}).status_code == 401
        assert (project / "sandbox.db").read_text() == "fixtures" and (project / "sandbox.log").exists()

        transport.reset_sandbox()  # stops that server, starts a new one: the write above is gone
        assert (project / "sandbox.pid").read_text() != first
        assert httpx.post(url, json={"date": "2025-03-04"}, headers={"X-Api-Key": SANDBOX_KEY}).json()["position"] == 1
        assert transport.sandbox_resets == 2
    finally:
        kill_from(project / "sandbox.pid")


def test_a_reset_command_sees_the_loops_environment_and_directory_and_an_empty_stdin(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CLINIC_SANDBOX_KEY", SANDBOX_KEY)
    monkeypatch.setenv("CLINIC_API_KEY", PROD_KEY)
    command_reset(["sh", "-c", 'pwd > where; printf %s "$CLINIC_SANDBOX_KEY/$CLINIC_API_KEY" > keys; cat > stdin'],
                  timeout_s=10).reset_sandbox()
    assert Path((tmp_path / "where").read_text().strip()).resolve() == tmp_path.resolve()
    assert (tmp_path / "keys").read_text() == f"{SANDBOX_KEY}/{PROD_KEY}"  # every variable, as it is
    assert (tmp_path / "stdin").read_text() == ""  # end of file at once: a prompt cannot hang the reset


def test_a_server_left_attached_fails_the_reset_in_one_line_soon_after_the_command_exits(tmp_path):
    pidfile = tmp_path / "attached.pid"
    transport = command_reset(["sh", "-c", f"sleep 30 & echo $! > {pidfile}"], timeout_s=20)
    started = time.monotonic()
    try:
        with pytest.raises(SandboxResetFailed) as info:
            transport.reset_sandbox()
    finally:
        kill_from(pidfile)
    assert time.monotonic() - started < 10  # DETACH_GRACE_S after the exit, not timeout_s
    message = str(info.value)
    assert "exited with status 0, but a process it started still holds its output" in message and "\n" not in message
    assert "setsid server > sandbox.log 2>&1 < /dev/null &" in message
    assert transport.sandbox_resets == 0 and info.value.kind == FaultKind.ENV


def test_a_reset_command_that_does_not_end_is_stopped_at_its_timeout(tmp_path):
    transport = command_reset(["sh", "-c", f"echo $$ > {tmp_path / 'pid'}; exec sleep 30"], timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(SandboxResetFailed, match=r"`sh -c .*` did not finish within 0.5 s$"):
        transport.reset_sandbox()
    assert time.monotonic() - started < 5
    pid = int((tmp_path / "pid").read_text())
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(pid, 0)
