"""The atlas's tools as a deployed HTTP API: the atlas task family for the continual loop.

``examples/atlas_tasks.py`` gives its agent LangChain tools in process; the continual loop
(``seed-agents continual``) only takes tools from an OpenAPI spec. This service serves the
same three tools over HTTP, one operation each, with the tools' names as operation ids and
their arguments as query parameters, and answers with the same text the LangChain tool
returns (``lookup`` as plain text, ``add`` and ``multiply`` as a bare integer), so an agent
over the generated tools sees what the in-process atlas agent sees.

Every operation is a GET: they read the atlas or compute, change nothing, so shadow
replays may call production live (``replay.read_source: live``). ``atlas_reward`` is the
loop's reward: the atlas's own answer check (``score_levels``'s ``right_answer``).

    python -m examples.atlas_service --port 8010     # serves http://127.0.0.1:8010/openapi.json
"""

from __future__ import annotations

import argparse
from typing import Annotated, Any

from fastapi import FastAPI, Query
from fastapi.responses import PlainTextResponse

from examples.atlas_tasks import answer_reward, places
from examples.knowledge_base import Field, lookup_fact

__all__ = ["atlas_reward", "create_app", "main"]

# The LangChain tools' docstrings: the description the model is shown for each tool.
LOOKUP_DOC = "Look up a fact about a place in the atlas: its population, area or founding year."
ADD_DOC = "Add two integers exactly."
MULTIPLY_DOC = "Multiply two integers exactly."


def create_app() -> FastAPI:
    """The atlas API (stateless: every instance answers the same, so a fresh one is also the
    canary's sandbox)."""
    app = FastAPI(title="Atlas", version="1.0",
                  description="Facts about invented places and exact integer arithmetic (examples.atlas_tasks).")
    facts = places()

    # The generated tools' schemas equal the LangChain tools' (no parameter descriptions),
    # and their description is the summary alone (no docstrings): the model reads the same prompt.
    @app.get("/lookup", operation_id="lookup", summary=LOOKUP_DOC, response_class=PlainTextResponse)
    def lookup(place: Annotated[str, Query()], field: Annotated[Field, Query()]) -> str:
        return lookup_fact(place, field, facts)

    @app.get("/add", operation_id="add", summary=ADD_DOC)
    def add(a: Annotated[int, Query()], b: Annotated[int, Query()]) -> int:
        return a + b

    @app.get("/multiply", operation_id="multiply", summary=MULTIPLY_DOC)
    def multiply(a: Annotated[int, Query()], b: Annotated[int, Query()]) -> int:
        return a * b

    return app


def atlas_reward(task: Any, state: dict[str, Any]) -> float:
    """1.0 when the episode's final answer is the task's integer (``answer_reward``, what
    ``score_levels`` calls ``right_answer``), else 0.0. The loop's form: ``reward(task, state)``."""
    return answer_reward(task, state)


def main(argv: list[str] | None = None) -> None:
    """Serve the atlas in the foreground."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8010)
    parser.add_argument("--log-level", default="warning", help="uvicorn's log level")
    args = parser.parse_args(argv)
    uvicorn.run(create_app(), host=args.host, port=args.port, log_level=args.log_level, access_log=False)


if __name__ == "__main__":
    main()
