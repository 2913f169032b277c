"""Run a vLLM OpenAI-compatible server as a child process.

vLLM lives in its own virtualenv (it pins torch and transformers versions the training
stack does not want), so we never import it: we start
``<vllm python> -m vllm.entrypoints.openai.api_server`` and talk HTTP. The flags
always passed are the ones this project relies on:

- ``--dtype float32``: sampled logprobs must match the trainer's fp32 forward pass;
- ``--logprobs-mode raw_logprobs``: logprobs are the model's log-softmax at T=1,
  whatever the sampling temperature (vLLM's default today; pinned so it stays so);
- ``--enable-lora`` plus ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``: LoRA weight sync;
- ``VLLM_SERVER_DEV_MODE=1``: exposes ``/collective_rpc`` for full-weight reloads.

vLLM's temp files go inside ``work_dir``, and so do its compile caches unless the
environment names them (``VLLM_CACHE_ROOT``, ``TORCHINDUCTOR_CACHE_DIR``): by default a run
leaves nothing behind and parallel servers share nothing; with the variables set, a restart
reuses the kernels torch.compile built at an earlier start (keyed by what they compile), which
shortens the start (docs/benchmarks.md, "Figures behind code comments").
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import httpx

from seed_agents._reaper import group_members
from seed_agents.errors import ConfigError, VLLMServerError
from seed_agents.vllm_ext import API_KEY_ENV

VLLM_PYTHON_ENV = "SEED_AGENTS_VLLM_PYTHON"
_REPO_ROOT = Path(__file__).resolve().parents[1]


def vllm_python(python: str | os.PathLike[str] | None = None) -> str:
    """The interpreter that has vLLM installed.

    In order: the ``python`` argument, ``$SEED_AGENTS_VLLM_PYTHON``,
    ``<repo>/.venv-vllm/bin/python`` if it exists, else the current interpreter.
    """
    if python:
        return _absolute(str(python))
    if env := os.environ.get(VLLM_PYTHON_ENV):
        return _absolute(env)
    repo_venv = _REPO_ROOT / ".venv-vllm" / "bin" / "python"
    if repo_venv.exists():
        return str(repo_venv)
    return sys.executable


def _absolute(exe: str) -> str:
    """A path made absolute (the server starts in a folder of its own); a bare command name as is."""
    return str(Path(exe).absolute()) if os.sep in exe else exe


def vllm_available(python: str | os.PathLike[str] | None = None) -> bool:
    """Whether ``vllm_python(python)`` exists and can find the ``vllm`` package."""
    exe = vllm_python(python)
    if not Path(exe).exists():
        return False
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        return subprocess.run([exe, "-c", probe], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def check_vllm_installed() -> None:
    """One line, before anything runs, where the command would need vLLM and cannot find it."""
    if not vllm_available():
        raise ConfigError(f"backend.kind vllm with no backend.base_url starts a vLLM server, and {vllm_python()} has no "
                          f"vllm package; install it (`bash scripts/setup.sh --with-vllm`, or set ${VLLM_PYTHON_ENV} to "
                          f"a Python that has it), give --backend.base_url of a running server, or use "
                          f"--backend.kind local")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class VLLMServer:
    """One ``vllm`` API server process: start, wait until healthy, stop.

    Use as a context manager (``with VLLMServer(path) as server: server.url``) or call
    ``start()``, ``wait_ready()`` and ``stop()`` yourself. ``startup_s`` is the time from
    ``start()`` until the server answered its warm-up request (on a CPU, a minute or more
    for the tiny model, much of it the warm-up).
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        served_model_name: str | None = None,
        work_dir: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        python: str | os.PathLike[str] | None = None,
        max_model_len: int = 2048,
        enable_lora: bool = True,
        max_lora_rank: int = 16,
        max_loras: int = 2,
        kv_cache_gib: float | None = 1.0,
        enforce_eager: bool = False,
        worker_extension: bool = True,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        stop_grace_s: float = 30.0,
        api_key: str | None = None,
    ) -> None:
        """
        Args:
            model: local folder (or hub id) to serve.
            served_model_name: the ``model`` field requests must use; defaults to the
                folder's name.
            work_dir: holds the log and vLLM's caches; a fresh temp folder by default.
            port: fixed port, or None to pick a free one.
            python: interpreter with vLLM installed (see ``vllm_python``).
            kv_cache_gib: explicit KV-cache size. On CPU vLLM otherwise reserves a
                fraction (default 0.9) of *all* RAM and refuses to start when other
                processes hold some of it; None leaves vLLM's default.
            enforce_eager: skip torch.compile (faster start-up, slower decoding).
            worker_extension: load ``seed_agents.vllm_ext`` (exact full reloads of tied
                embeddings on CPU; ``FullWeightSync(method="seed_reload_weights")``).
            extra_args: further CLI flags, appended last (so they override).
            env: extra environment variables for the server process.
            stop_grace_s: seconds vLLM gets to exit after SIGTERM (from ``stop()``, or from
                the watchdog when this process dies) before its group is SIGKILLed.
            api_key: when set, every route but ``/health`` demands
                ``Authorization: Bearer <api_key>`` (``seed_agents.vllm_ext.BearerAuth``).
                It reaches the server through its environment, never its command line.
        """
        # The server runs with cwd=work_dir, so local paths must be absolute.
        self.model = str(Path(model).resolve()) if Path(model).exists() else str(model)
        self.served_model_name = served_model_name or Path(self.model).name
        self.work_dir = Path(work_dir).resolve() if work_dir else Path(tempfile.mkdtemp(prefix="seed-agents-vllm-"))
        self.host = host
        self.port = port or free_port(host)
        self.python = vllm_python(python)
        self.max_model_len = max_model_len
        self.enable_lora = enable_lora
        self.max_lora_rank = max_lora_rank
        self.max_loras = max_loras
        self.kv_cache_gib = kv_cache_gib
        self.enforce_eager = enforce_eager
        self.worker_extension = worker_extension
        self.extra_args = list(extra_args)
        self.extra_env = dict(env or {})
        self.log_path = self.work_dir / "vllm-server.log"
        self.startup_s: float | None = None  # start() -> ready (incl. warm-up)
        self.healthy_s: float | None = None  # start() -> /health answered 200
        self.stop_grace_s = stop_grace_s
        self._api_key = api_key or None
        self._proc: subprocess.Popen[bytes] | None = None
        self._reaper: subprocess.Popen[bytes] | None = None
        self._pgid = 0
        self._started_at = 0.0

    @property
    def url(self) -> str:
        """Base URL, without ``/v1`` (what ``VLLMBackend`` takes)."""
        return f"http://{self.host}:{self.port}"

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        """The server process while started (None before ``start()``/after ``stop()``)."""
        return self._proc

    def command(self) -> list[str]:
        cmd = [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model,
            "--served-model-name", self.served_model_name,
            "--dtype", "float32",
            "--logprobs-mode", "raw_logprobs",
            "--host", self.host,
            "--port", str(self.port),
            "--max-model-len", str(self.max_model_len),
        ]  # fmt: skip
        if self.enable_lora:
            cmd += ["--enable-lora", "--max-lora-rank", str(self.max_lora_rank), "--max-loras", str(self.max_loras)]
        if self.kv_cache_gib is not None:
            cmd += ["--kv-cache-memory-bytes", str(int(self.kv_cache_gib * 2**30))]
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        if self.worker_extension:  # exact full reloads for tied embeddings (seed_agents/vllm_ext.py)
            cmd += ["--worker-extension-cls", "seed_agents.vllm_ext.SeedWorkerExtension"]
        if self._api_key:  # the key itself travels in the environment (environment())
            cmd += ["--middleware", "seed_agents.vllm_ext.BearerAuth"]
        return cmd + self.extra_args

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        caches = {  # a cache folder the user named is theirs to share across starts
            "VLLM_CACHE_ROOT": Path(env.get("VLLM_CACHE_ROOT") or self.work_dir / "vllm-cache"),
            "TORCHINDUCTOR_CACHE_DIR": Path(env.get("TORCHINDUCTOR_CACHE_DIR") or self.work_dir / "inductor-cache"),
            "TMPDIR": self.work_dir / "tmp",
        }
        for path in caches.values():
            path.mkdir(parents=True, exist_ok=True)
        env.update({k: str(v) for k, v in caches.items()})
        env.update(
            {
                "VLLM_SERVER_DEV_MODE": "1",
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
                "VLLM_NO_USAGE_STATS": "1",  # no phoning home from tests
                "DO_NOT_TRACK": "1",
                "PYTHONUNBUFFERED": "1",  # so the log tail is current when we report it
            }
        )
        if self.worker_extension or self._api_key:
            # vLLM's own python imports the extension: expose our package, and only it (a
            # symlink), so nothing else of this repo can shadow a module in vLLM's venv
            shim = self.work_dir / "pythonpath"
            shim.mkdir(parents=True, exist_ok=True)
            link = shim / "seed_agents"
            if not link.exists():
                link.symlink_to(Path(__file__).resolve().parent, target_is_directory=True)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim), env.get("PYTHONPATH", "")) if p)
        env.update(self.extra_env)
        env.pop(API_KEY_ENV, None)  # a key in our own environment must not switch auth on by accident
        if self._api_key:
            env[API_KEY_ENV] = self._api_key
        return env

    @property
    def headers(self) -> dict[str, str]:
        """What a client of this server must send (the bearer key when one is set)."""
        return {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    def start(self) -> VLLMServer:
        """Launch vLLM in a process group of its own, with a watchdog, and return at once.

        The group holds the api_server and every process it starts (EngineCore, worker,
        multiprocessing's resource tracker): ``stop()`` signals the group, not one pid. Its
        leader is ``seed_agents/_reaper.py``, which kills the group if this process dies
        without calling ``stop()`` (SIGKILL included), so no vLLM outlives its owner.
        """
        if self.is_running():
            return self
        self.work_dir.mkdir(parents=True, exist_ok=True)
        env = self.environment()
        self._reaper = subprocess.Popen(
            [sys.executable, "-I", str(Path(__file__).with_name("_reaper.py")), str(self.stop_grace_s)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            process_group=0,  # a new group in our session (a process may join a group only within its session)
        )
        self._pgid = self._reaper.pid
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(self.command())}\n".encode())
            log.flush()
            self._started_at = time.perf_counter()
            try:
                self._proc = subprocess.Popen(
                    self.command(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    cwd=self.work_dir,
                    process_group=self._pgid,  # the watchdog's group: killpg reaches EngineCore and worker
                )
            except BaseException:
                self._kill_group()
                raise
        return self

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def wait_ready(self, timeout: float = 300.0, *, warmup: bool = True) -> float:
        """Block until ``/health`` answers 200; return the start-up seconds.

        With ``warmup`` one 1-token completion with logprobs is sent before returning:
        the first request that asks for logprobs makes vLLM torch.compile its
        rank-counting op (many seconds on a CPU), which would otherwise land on
        whichever real request comes first and skew its latency and timeout.
        Raises ``VLLMServerError`` at once if the process exits, or after ``timeout``.
        """
        if self._proc is None:
            raise VLLMServerError("server not started; call start() first")
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=5.0, headers=self.headers) as client:
            while True:
                code = self._proc.poll()
                if code is not None:
                    raise VLLMServerError(
                        f"vLLM server exited with code {code} before becoming ready "
                        f"(log: {self.log_path}):\n{self.log_tail()}"
                    )
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise VLLMServerError(
                        f"vLLM server not ready after {timeout:.0f} s (log: {self.log_path}):\n"
                        f"{self.log_tail()}"
                    )
                time.sleep(0.5)
            self.healthy_s = time.perf_counter() - self._started_at
            if warmup:
                self._warm_up(client, max(deadline - time.monotonic(), 30.0))
        self.startup_s = time.perf_counter() - self._started_at
        return self.startup_s

    def _warm_up(self, client: httpx.Client, timeout: float) -> None:
        body = {"model": self.served_model_name, "prompt": [0, 0], "max_tokens": 1, "logprobs": 0, "prompt_logprobs": 0}
        try:
            response = client.post(f"{self.url}/v1/completions", json=body, timeout=timeout)
        except httpx.HTTPError as exc:
            raise VLLMServerError(f"warm-up request failed: {exc!r} (log: {self.log_path}):\n{self.log_tail()}") from exc
        if response.status_code != 200:
            raise VLLMServerError(
                f"warm-up request failed with HTTP {response.status_code}: {response.text[:300]} "
                f"(log: {self.log_path}):\n{self.log_tail()}"
            )

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM to the whole process group; SIGKILL to it once the api_server has exited
        or ``timeout`` (default ``stop_grace_s``) has passed; return when no process of the
        group runs any more (so the port and the KV cache are free again; init reaps the
        orphans' zombies a moment later)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._pgid, signal.SIGTERM)  # the watchdog ignores it
        deadline = time.monotonic() + (self.stop_grace_s if timeout is None else timeout)
        watchdog = {self._pgid}
        while time.monotonic() < deadline and (proc.poll() is None or set(group_members(self._pgid)) - watchdog):
            time.sleep(0.1)
        self._kill_group()
        proc.wait()

    def _kill_group(self) -> None:
        """SIGKILL every process of the group (the watchdog too) and wait until none is left."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._pgid, signal.SIGKILL)
        if self._reaper is not None:
            self._reaper.wait()
            if self._reaper.stdin is not None:
                self._reaper.stdin.close()
            self._reaper = None
        deadline = time.monotonic() + 10.0  # SIGKILLed orphans are reaped by init at once
        while group_members(self._pgid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> VLLMServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"VLLMServer({self.model!r}, url={self.url!r}, {state})"
