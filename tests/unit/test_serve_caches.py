"""Where a vLLM server keeps its compile caches: inside its work folder by default (a run
leaves nothing behind), in the folders the environment names when it names them (restarts
then reuse the kernels torch.compile built; the test suite shares one for all its servers, tests/conftest.py)."""

from __future__ import annotations

from seed_agents.serve import VLLMServer


def test_caches_default_to_the_work_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    env = VLLMServer(str(tmp_path), work_dir=tmp_path / "w", port=9).environment()
    assert env["VLLM_CACHE_ROOT"] == str(tmp_path / "w" / "vllm-cache")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "w" / "inductor-cache")
    assert env["TMPDIR"] == str(tmp_path / "w" / "tmp")


def test_cache_folders_named_by_the_environment_are_kept_and_created(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "shared" / "vllm"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "shared" / "inductor"))
    env = VLLMServer(str(tmp_path), work_dir=tmp_path / "w", port=9).environment()
    assert env["VLLM_CACHE_ROOT"] == str(tmp_path / "shared" / "vllm")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "shared" / "inductor")
    assert (tmp_path / "shared" / "vllm").is_dir() and (tmp_path / "shared" / "inductor").is_dir()
    assert env["TMPDIR"] == str(tmp_path / "w" / "tmp")  # temp files stay the run's own
