"""docs/own_api.md, "Your own API", run as a user would run it, on a service that is not the demo's.

The blocks of the page marked ``<!-- own-api:NAME -->`` are taken from the page itself, so
page and test cannot drift: the gateway command, the agent (tools from the spec, LLM calls
through the gateway, tool calls to the API, rewards), the reward module, the loop's config,
the canary tasks, and the `continual --once` and `status` commands. What the test swaps:

- ports: the clinic (``tests/clinic_service.py``) runs as production and as a resettable
  sandbox on free loopback ports, the gateway on another;
- the project's folder: the page's ``~/clinic_project`` is a folder under the test's temporary
  one, the commands run in it, and its ``PYTHONPATH=~/clinic_project`` names that folder with
  the working directory kept off ``sys.path`` (``PYTHONSAFEPATH``, as for the installed
  ``seed-agents`` command), so the user's package is found through ``PYTHONPATH`` or not at all;
- the model: `seed-agents serve` is replaced by a scripted stand-in for vLLM (the gateway's
  ``FakeVLLM`` answering each turn of the traffic from a script: a tiny random model writes
  no tool call the traffic could show), and the loop gets ``--backend.kind local`` with a
  tiny random Llama, small budgets, ``--agent.tool-choice join_waitlist`` so that every
  replay and canary episode writes to the sandbox (a random model's own choice would not),
  and ``--min-signal-groups 0``: the random model earns no reward, so no group has reward
  variance, and the cycle must train anyway for the page's gate and status to show.

Then it checks what the page promises: the cycle ran and was decided, no mutating request
of the loop reached production (production's own request log), every episode that wrote
to the sandbox found it freshly reset, and `status` shows the cycle's decision.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from seed_agents.gateway.testing import FakeVLLM
from seed_agents.store import TraceStore
from seed_agents.tool_calls import format_tool_call
from tests.clinic_service import ClinicServer
from tests.gateway_procs import free_port, stop, wait_up

pytestmark = pytest.mark.integration
pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "own_api.md"
DOC_PORTS = {"prod": "127.0.0.1:9000", "sandbox": "127.0.0.1:9001", "gateway": "8080", "upstream": "127.0.0.1:8000"}
DOC_PROJECT = "~/clinic_project"  # the user's project on the page
PROD_KEY, SANDBOX_KEY = "clinic-prod-key-5d0c8e1a7b", "clinic-sandbox-key-93fa2c6e1d"
CLIENT_KEY, FEEDBACK_KEY = "gw-client-key-4e9b1f7a02c8", "gw-feedback-key-b83d0c5e91f6"
# the traffic: (question, task key, the first turn's tool call, the answer after its result)
TRAFFIC = [("Please book 09:00 on 2025-03-03 for Ana.", "book",
            ("book_slot", {"patient": "Ana", "date": "2025-03-03", "time": "09:00"}), "Booked: Ana, 09:00 on 2025-03-03."),
           ("Which slots are free on 2025-03-04?", "slots", ("list_slots", {"date": "2025-03-04"}), "11:00 is free.")]
FORCED_PREFILL = '<tool_call>\n{"name": "'  # what the gateway prefills when tool_choice is "required"
TINY_RUN = ["--backend.kind", "local", "--agent.max-turns", "2", "--sampling.max-tokens", "64", "--skills.max-tokens", "16", "--group-size", "2",
            "--canary.seeds", "1", "--agent.tool-choice", "join_waitlist", "--no-trainer.gradient-checkpointing",
            "--min-signal-groups", "0"]


def doc_block(name: str) -> str:
    found = re.search(rf"<!-- own-api:{name} -->\n```\w*\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert found, f"docs/own_api.md lost its block {name!r}"
    return found.group(1)


def doc_commands(text: str) -> list[tuple[dict[str, str], list[str]]]:
    """The ``seed-agents`` commands of a bash block: (VAR=value prefixes, argv run through this Python)."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        env = {}
        while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        if words and words[0].endswith("seed-agents"):
            out.append((env, [sys.executable, "-m", "seed_agents", *words[1:]]))
    return out


def with_flags(argv: list[str], **values: str) -> list[str]:
    """``argv`` with the values of flags it already has replaced (``upstream=`` -> ``--upstream``)."""
    argv = list(argv)
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        assert flag in argv, f"the page's command has no {flag}"
        argv[argv.index(flag) + 1] = value
    return argv


def on_pythonpath(prefix: dict[str, str], project: Path) -> dict[str, str]:
    """The page's ``PYTHONPATH=~/clinic_project`` with the project's folder here, the suite's own
    PYTHONPATH (when it has one) behind it, and the working directory off ``sys.path``."""
    assert prefix == {"PYTHONPATH": DOC_PROJECT}, f"the page's command puts {prefix} in front, not the user's project"
    paths = [str(project), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"PYTHONPATH": os.pathsep.join(paths), "PYTHONSAFEPATH": "1"}


def local(text: str, ports: dict[str, str]) -> str:
    for key, port in ports.items():
        text = text.replace(DOC_PORTS[key], port)
    return text


class ScriptedModel(FakeVLLM):
    """Stands in for `seed-agents serve`: turn 1 of traffic session k continues the gateway's
    forced-call prefill with TRAFFIC[k]'s call, turn 2 is its answer."""

    def completion_ids(self, max_tokens: int) -> tuple[list[int], str]:
        n = len(self.requests) - 1
        _, _, call, answer = TRAFFIC[n // 2]
        text = format_tool_call(*call)
        assert text.startswith(FORCED_PREFILL)
        self.script = text[len(FORCED_PREFILL):] if n % 2 == 0 else answer
        return super().completion_ids(max_tokens)


@contextmanager
def served(app: Any) -> Iterator[str]:
    """An ASGI app under uvicorn on a free loopback port, in a thread; yields its URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the stand-in model server did not start"
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def gateway(argv: list[str], env: dict[str, str], cwd: Path) -> Iterator[str]:
    port = argv[argv.index("--port") + 1]
    log = cwd / "gateway.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_up(url, proc, log, "/health")
        yield url
    finally:
        stop(proc)


def test_the_own_api_walkthrough_runs_as_written(tmp_path: Path, tiny_model_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoTokenizer

    t0 = time.perf_counter()
    # the user's project, outside this checkout: the reward module, the agent, the loop's config and canary tasks
    project = tmp_path / "clinic_project"
    (project / "my_clinic").mkdir(parents=True)
    (project / "my_clinic" / "__init__.py").write_text("")
    (project / "my_clinic" / "rewards.py").write_text(doc_block("rewards"))
    env = {**os.environ, "CLINIC_API_KEY": PROD_KEY, "CLINIC_SANDBOX_KEY": SANDBOX_KEY, "TOKENIZERS_PARALLELISM": "false",
           "SEED_GATEWAY_CLIENT_KEYS": CLIENT_KEY, "SEED_GATEWAY_FEEDBACK_KEYS": FEEDBACK_KEY}
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    model = ScriptedModel(AutoTokenizer.from_pretrained(tiny_model_dir), model="smollm2-135m")
    with ClinicServer(api_key=PROD_KEY) as prod, ClinicServer(api_key=SANDBOX_KEY, resettable=True) as sandbox, \
            served(model.app) as upstream:
        ports = {"prod": prod.url.removeprefix("http://"), "sandbox": sandbox.url.removeprefix("http://"),
                 "upstream": upstream.removeprefix("http://")}
        (project / "clinic.yaml").write_text(local(doc_block("config"), ports))
        (project / "clinic_canary.jsonl").write_text(doc_block("canary"))
        agent_code = local(doc_block("agent"), ports)
        (project / "my_clinic" / "agent.py").write_text(agent_code)

        # 1-3. the gateway in front of the model, the agent behind it, users' traffic with rewards
        commands = doc_commands(local(doc_block("gateway"), ports))
        assert [argv[3] for _, argv in commands] == ["serve", "gateway"]  # serve: the scripted stand-in above
        prefix, argv = commands[1]
        argv = with_flags(argv, upstream=upstream, tokenizer=tiny_model_dir, port=str(free_port()))
        with gateway(argv, {**env, **on_pythonpath(prefix, project)}, project) as gateway_url:
            monkeypatch.setenv("GATEWAY_URL", gateway_url)
            monkeypatch.setenv("GATEWAY_CLIENT_KEY", CLIENT_KEY)
            monkeypatch.setenv("GATEWAY_FEEDBACK_KEY", FEEDBACK_KEY)
            agent: dict[str, Any] = {"__name__": "my_clinic.agent"}
            exec(compile(agent_code, str(DOC), "exec"), agent)  # noqa: S102 - the page's own code, as written
            for question, key, _, answer in TRAFFIC:
                session, said = agent["ask"](question, task_key=key)
                assert said == answer
                agent["rate"](session, 1.0)
            agent["feedback"].close()
        assert prod.mutating() == 1  # the users' booking: production traffic writes, as it should
        traffic_s = time.perf_counter() - t0

        store = TraceStore.open(f"sqlite:///{project / 'runs' / 'clinic' / 'traces.db'}")
        sessions = store.sessions()
        assert len(sessions) == 2 and {s.task_key for s in sessions} == {"book", "slots"}
        rewards = {s.task_key: {r.source: r.value for r in store.rewards(s.session_id)} for s in sessions}
        assert rewards == {"book": {"user": 1.0, "verifier": 1.0}, "slots": {"user": 1.0, "verifier": 0.0}}

        # 4-5. one cycle of the loop, then status, as the page runs them
        (run_prefix, continual), (_, status) = doc_commands(doc_block("loop"))
        assert continual[3:] == ["continual", "--config", "clinic.yaml", "--once"] and status[3] == "status"
        started = time.perf_counter()
        run = subprocess.run([*continual, *TINY_RUN, "--backend.model", tiny_model_dir], cwd=project,
                             env={**env, **on_pythonpath(run_prefix, project)}, capture_output=True, text=True,
                             timeout=900, check=False)
        wall = time.perf_counter() - started
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        (line,) = [x for x in run.stdout.splitlines() if x.startswith("cycle ")]
        assert line.startswith("cycle 1: 2 sessions -> 4 replays") and "decided" in line, line

    # the cycle ran: both sessions trained, a candidate decided with its evidence
    (cycle,) = store.cycles("clinic-agent")
    assert cycle.state == "decided" and cycle.candidate_version == 1
    assert sorted(state for _, state, _ in store.claim_states().values()) == ["trained", "trained"]
    versions = {v.version: v.status for v in store.model_versions("clinic-agent")}
    assert versions[1] in ("promoted", "rejected") and len(versions) == 2

    # production: not one mutating request from the loop (its only write is the users' booking)
    assert prod.mutating() == 1
    replays = [json.loads(x) for x in (project / "runs" / "clinic" / "cycles" / "1" / "replays.jsonl")
               .read_text().splitlines()]
    assert len(replays) == 4 and all(r["fault"] is None for r in replays), [r.get("error") for r in replays]
    counts = [r["metadata"]["replay"] for r in replays]
    assert [c["live_writes"] for c in counts] == [0] * 4 and [c["sandbox_resets"] for c in counts] == [1] * 4
    assert sum(c["sandbox_writes"] for c in counts) >= 1  # (a forced call cut by max_tokens writes nothing)

    # the sandbox: every episode (4 replays, 2 versions x 4 canary tasks) reset it before it wrote
    log = sandbox.app.state.log
    episodes = " ".join(f"{m} {p}" for m, p in log).split("POST /reset")
    assert episodes[0] == "" and len(episodes) - 1 == 4 + 2 * 4, log
    assert all(e.strip() == "" or e.strip().startswith("POST /waitlist") for e in episodes[1:]), log
    assert sum("POST /waitlist" in e for e in episodes) >= 4, log

    # status shows the cycle's decision
    shown = subprocess.run(status, cwd=project, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert re.search(r"#2 .* clinic-agent (PROMOTE|REJECT) v1 by gate", shown.stdout), shown.stdout
    assert re.search(r"\n  trained +2 ", shown.stdout), shown.stdout  # both sessions consumed, once
    store.close()
    print(f"own-api walkthrough: gateway + traffic {traffic_s:.0f} s, `continual --once` {wall:.0f} s, "
          f"all {time.perf_counter() - t0:.0f} s; {line}")
