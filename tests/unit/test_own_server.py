"""A vLLM server the command starts for itself (``backend.kind: vllm`` with no ``base_url``):
started for the run's weights, stopped when the command ends, refused in one line where it
cannot be started."""

from __future__ import annotations

from typing import ClassVar

import pytest

from seed_agents.app import own_server
from seed_agents.app.cli import main
from seed_agents.backends import make_backend
from seed_agents.config import BackendConfig
from seed_agents.errors import ConfigError
from seed_agents.preflight import check_backend


class FakeServer:
    """Records what the context manager does with the server; starts nothing."""

    made: ClassVar[list[FakeServer]] = []

    def __init__(self, model, *, served_model_name, max_lora_rank, enable_lora, work_dir):
        self.model, self.served_model_name, self.max_lora_rank = model, served_model_name, max_lora_rank
        self.enable_lora = enable_lora
        self.work_dir = work_dir
        self.work_dir.mkdir()
        self.log_path = work_dir / "vllm-server.log"
        self.url = "http://127.0.0.1:4321"
        self.startup_s = 1.0
        self.events: list[str] = []
        FakeServer.made.append(self)

    def start(self):
        self.events.append("start")
        return self

    def wait_ready(self, timeout):
        self.events.append("ready")

    def stop(self):
        self.events.append("stop")


@pytest.fixture
def fake_server(monkeypatch, tmp_path):
    import seed_agents.serve

    FakeServer.made = []
    folders = iter(tmp_path / f"server{i}" for i in range(10))
    monkeypatch.setattr(seed_agents.serve, "VLLMServer",
                        lambda model, **kw: FakeServer(model, work_dir=next(folders), **kw))
    return FakeServer


def test_a_given_url_or_the_local_backend_starts_nothing(fake_server):
    for backend in (BackendConfig(kind="vllm", base_url="http://127.0.0.1:8000"), BackendConfig(kind="local")):
        with own_server.served(backend, "/weights") as got:
            assert got is backend
    assert fake_server.made == []


def test_the_owned_server_serves_the_weights_under_the_model_name_and_stops_on_leaving(fake_server):
    backend = BackendConfig(kind="vllm", model="smollm2-135m")
    with own_server.served(backend, "/weights/stage1", lora_r=8) as got:
        server = fake_server.made[0]
        assert server.events == ["start", "ready"]
        assert got.base_url == server.url and got.model == "smollm2-135m" and backend.base_url is None
    assert server.model == "/weights/stage1" and server.served_model_name == "smollm2-135m"
    assert server.enable_lora and server.max_lora_rank == 16
    assert server.events == ["start", "ready", "stop"]
    assert not server.work_dir.exists(), "its temporary folder is removed after a clean end"


def test_a_failed_run_still_stops_the_server_and_keeps_its_log(fake_server):
    with pytest.raises(RuntimeError, match="boom"), own_server.served(BackendConfig(kind="vllm"), "/w"):
        raise RuntimeError("boom")
    server = fake_server.made[0]
    assert server.events[-1] == "stop" and server.work_dir.exists()


@pytest.mark.parametrize("lora_r,rank", [(None, 16), (8, 16), (16, 16), (17, 32), (64, 64), (300, 320)])
def test_the_lora_rank_is_one_vllm_accepts_and_holds_the_adapter(lora_r, rank):
    assert own_server.max_lora_rank(lora_r) == rank


def test_an_adapter_above_vllms_largest_rank_is_one_line():
    with pytest.raises(ConfigError, match="largest LoRA rank"):
        own_server.max_lora_rank(1024)


def test_a_command_that_needs_a_running_server_says_so(tiny_model_dir):
    with pytest.raises(ConfigError, match="backend.base_url is unset.*seed-agents serve"):
        check_backend(BackendConfig(kind="vllm", model=tiny_model_dir), flag="backend.model")


def test_make_backend_without_a_url_names_the_fix():
    with pytest.raises(ConfigError, match="base_url is unset"):
        make_backend(BackendConfig(kind="vllm"))


def test_without_vllm_installed_the_owned_server_is_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("SEED_AGENTS_VLLM_PYTHON", str(tmp_path / "no-python"))
    code = main(["eval", "--backend", "vllm", "--out", str(tmp_path / "run"), "--episodes", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "starts a vLLM server" in err[0] and "--backend.kind local" in err[0]
    assert not (tmp_path / "run").exists()


def test_weight_sync_names_its_folder_absolutely(tmp_path, monkeypatch):
    """A server the command started runs in a folder of its own: a run's relative ``--out``
    must reach it as an absolute path, or the first adapter load names nothing."""
    from seed_agents.trainers.weight_sync import FullWeightSync, LoRASync

    monkeypatch.chdir(tmp_path)
    for sync in (LoRASync(object(), "run/weights"), FullWeightSync(object(), "run/weights")):
        assert sync.save_root == tmp_path / "run" / "weights"


def test_a_relative_vllm_python_is_made_absolute(tmp_path, monkeypatch):
    """The server starts in a folder of its own: ``.venv-vllm/bin/python`` must name the
    checkout's, not one under that folder."""
    from seed_agents.serve import VLLM_PYTHON_ENV, vllm_python

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(VLLM_PYTHON_ENV, ".venv-vllm/bin/python")
    assert vllm_python() == str(tmp_path / ".venv-vllm" / "bin" / "python")
    monkeypatch.setenv(VLLM_PYTHON_ENV, "python3")
    assert vllm_python() == "python3"
