"""The worker extension must import inside vLLM's venv, which has none of our dependencies."""

import subprocess
import sys

from seed_agents.serve import VLLMServer


def test_extension_imports_without_our_dependencies():
    code = ("import sys, seed_agents.vllm_ext as e; "
            "heavy = [m for m in ('langchain_core', 'langgraph', 'transformers', 'httpx') if m in sys.modules]; "
            "assert not heavy, heavy; assert hasattr(e.SeedWorkerExtension, 'seed_reload_weights')")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_public_names_still_resolve_lazily():
    import seed_agents
    import seed_agents.chat_model  # noqa: F401 - importing the submodule must not shadow the function

    assert callable(seed_agents.capture) and not isinstance(seed_agents.capture, type(seed_agents))
    assert seed_agents.SeedChatModel.__name__ == "SeedChatModel"


def test_server_command_loads_the_extension_and_exposes_only_our_package(tmp_path):
    server = VLLMServer(str(tmp_path), work_dir=tmp_path / "w", port=9)
    cmd = server.command()
    assert cmd[cmd.index("--worker-extension-cls") + 1] == "seed_agents.vllm_ext.SeedWorkerExtension"
    shim = server.environment()["PYTHONPATH"].split(":")[0]
    from pathlib import Path

    assert sorted(p.name for p in Path(shim).iterdir()) == ["seed_agents"]
    assert "--worker-extension-cls" not in VLLMServer(str(tmp_path), work_dir=tmp_path / "v", port=9, worker_extension=False).command()
