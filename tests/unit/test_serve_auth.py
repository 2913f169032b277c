"""Serving safely, without a server: `serve` refuses a reachable host without a key, the key
travels only by environment, and the ASGI middleware refuses every route but /health
without it. The same checks against a real key-protected vLLM: tests/integration/test_vllm_auth.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import httpx
import pytest

from seed_agents.app.commands.serve import is_loopback
from seed_agents.serve import VLLMServer
from seed_agents.vllm_ext import API_KEY_ENV, BearerAuth

KEY = "sk-test-6f1c0b9e2d"


def _serve(*args: str, env_key: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
    if env_key:
        env[API_KEY_ENV] = env_key
    return subprocess.run([sys.executable, "-m", "seed_agents", "serve", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_serve_on_a_reachable_host_without_a_key_is_one_line_and_exit_2():
    done = _serve("--host", "0.0.0.0", "--model", "does-not-matter")
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and API_KEY_ENV in done.stderr and "0.0.0.0" in done.stderr
    # a variable named by --api-key-env that is unset is no key either
    done = _serve("--host", "10.1.2.3", "--api-key-env", "SEED_TEST_NO_SUCH_VAR", "--model", "x", env_key=KEY)
    assert done.returncode == 2 and "SEED_TEST_NO_SUCH_VAR" in done.stderr and KEY not in done.stderr + done.stdout


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("127.3.0.1", True), ("localhost", True),
                                                ("::1", True), ("[::1]", True), ("0.0.0.0", False), ("::", False),
                                                ("10.0.0.5", False), ("myhost.example", False)])
def test_loopback_hosts(host, loopback):
    assert is_loopback(host) is loopback


def test_the_key_reaches_the_server_by_environment_only(tmp_path, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "a-key-from-our-own-environment")
    server = VLLMServer(str(tmp_path), work_dir=tmp_path / "w", port=9, api_key=KEY, worker_extension=False)
    cmd = server.command()
    assert KEY not in " ".join(cmd)
    assert cmd[cmd.index("--middleware") + 1] == "seed_agents.vllm_ext.BearerAuth"
    env = server.environment()
    assert env[API_KEY_ENV] == KEY and "PYTHONPATH" in env  # the middleware's package is importable there
    assert server.headers == {"Authorization": f"Bearer {KEY}"}
    # without a key: no middleware, and a key in our environment is not passed on
    plain = VLLMServer(str(tmp_path), work_dir=tmp_path / "v", port=9)
    assert "--middleware" not in plain.command() and API_KEY_ENV not in plain.environment()


# -- the middleware, on a stand-in app ------------------------------------------------------


async def _ok_app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"reached"})


def _status(method: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, httpx.Response]:
    async def go():
        transport = httpx.ASGITransport(app=BearerAuth(_ok_app))
        async with httpx.AsyncClient(transport=transport, base_url="http://vllm") as client:
            return await client.request(method, path, headers=headers or {})

    r = asyncio.run(go())
    return r.status_code, r


ROUTES = [("POST", "/v1/completions"), ("GET", "/v1/models"), ("POST", "/collective_rpc"),
          ("POST", "/reset_prefix_cache"), ("POST", "/v1/load_lora_adapter"), ("POST", "/v1/unload_lora_adapter"),
          ("POST", "/health"), ("GET", "/metrics"), ("GET", "/"), ("GET", "//health")]


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_middleware_refuses_every_route_without_the_key(method, path, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, KEY)
    for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"X-Api-Key": KEY}):
        code, r = _status(method, path, headers)
        assert code == 401 and r.json()["error"]["code"] == "invalid_api_key" and KEY not in r.text
    assert _status(method, path, {"Authorization": f"Bearer {KEY}"})[0] == 200


def test_middleware_leaves_only_the_health_probe_open(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, KEY)
    assert _status("GET", "/health")[0] == 200


def test_middleware_without_a_key_refuses_to_start(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    with pytest.raises(RuntimeError, match=API_KEY_ENV):
        BearerAuth(_ok_app)
