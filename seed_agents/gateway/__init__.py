"""``seed-agents gateway``: capture every LLM call of a deployed agent, token-exactly.

The app lives in ``seed_agents.gateway.app`` (``build_app``, see its docstring for the
HTTP surface) and its config in ``seed_agents.gateway.config``; the command line is
``seed_agents.app.commands.gateway``.

    seed-agents gateway --upstream http://127.0.0.1:8000 --model smollm2-135m \\
        --store sqlite:///runs/traces.db --port 8080 [--config gateway.yaml]

Then point any OpenAI client at ``http://127.0.0.1:8080/v1``.
"""

from __future__ import annotations
