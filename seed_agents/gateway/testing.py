"""A fake vLLM server for gateway tests: deterministic token ids and logprobs, no model.

``FakeVLLM().app`` answers ``/v1/completions`` (token-id prompts, ``return_token_ids``,
``logprobs: 0``, with and without ``stream``), ``/v1/models`` and ``/v1/load_lora_adapter`` (and unload)
the way vLLM 0.32 does (``down`` and ``restart`` play a killed and a restarted server),
so the gateway can be tested in-process through ``httpx.ASGITransport``. The completion
is ``script`` tokenized (plus the eos token), cut at ``max_tokens``; the logprob of
token i is ``-(i + 1) / 100 - len(prompt) / 1e4``, so a test can tell which prompt and
which position a stored logprob came from.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse


def fake_logprob(i: int, n_prompt: int) -> float:
    return -(i + 1) / 100 - n_prompt / 1e4


class FakeVLLM:
    """In-process stand-in for a vLLM server; ``requests`` keeps every completion body."""

    def __init__(self, tokenizer: Any, model: str = "tiny", script: str = "Hello there.") -> None:
        self.tokenizer = tokenizer
        self.served = [model]
        self.script = script
        self.requests: list[dict[str, Any]] = []
        self.fail_status: int | None = None  # answer every completion with this HTTP status
        self.api_key: str | None = None  # when set, requests must carry it
        self.break_after: int | None = None  # end streams after this many events, without [DONE]
        self.auth_headers: list[str | None] = []
        self.down = False  # refuse every connection, as a killed server does
        self.fail_loads = False  # answer adapter loads with HTTP 500
        self.loads: list[dict[str, Any]] = []  # every adapter load asked for
        self.app = self._build()

    def transport(self) -> httpx.AsyncBaseTransport:
        return _Killable(self)

    def restart(self) -> None:
        """Come back up as a restarted vLLM does: runtime adapters forgotten."""
        self.down = False
        self.served = self.served[:1]

    def completion_ids(self, max_tokens: int) -> tuple[list[int], str]:
        ids = list(self.tokenizer(self.script, add_special_tokens=False)["input_ids"]) + [int(self.tokenizer.eos_token_id)]
        return (ids, "stop") if len(ids) <= max_tokens else (ids[:max_tokens], "length")

    def _build(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": m, "object": "model"} for m in self.served]}

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            body = await request.json()
            self.requests.append(body)
            self.auth_headers.append(request.headers.get("authorization"))
            if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
                return JSONResponse({"error": "Unauthorized"}, status_code=401)
            if self.fail_status:
                return JSONResponse({"error": {"message": "fake failure", "type": "X", "code": self.fail_status}}, status_code=self.fail_status)
            if body["model"] not in self.served:
                return JSONResponse({"error": {"message": f"The model `{body['model']}` does not exist.", "code": 404}}, status_code=404)
            prompt = [int(t) for t in body["prompt"]]
            ids, finish = self.completion_ids(int(body["max_tokens"]))
            lps = [fake_logprob(i, len(prompt)) for i in range(len(ids))]
            if body.get("stream"):
                return StreamingResponse(self._events(prompt, ids, lps, finish), media_type="text/event-stream")
            return JSONResponse({"id": "cmpl-fake", "object": "text_completion", "model": body["model"], "choices": [{
                "index": 0, "text": self.tokenizer.decode(ids), "token_ids": ids, "prompt_token_ids": prompt,
                "logprobs": {"token_logprobs": lps}, "finish_reason": finish}]})

        @app.post("/v1/load_lora_adapter")
        async def load(request: Request) -> Response:
            body = await request.json()
            self.loads.append(body)
            if self.fail_loads:
                return JSONResponse({"error": {"message": "fake load failure", "code": 500}}, status_code=500)
            if body["lora_name"] in self.served:
                return JSONResponse({"error": {"message": f"The lora adapter '{body['lora_name']}' has already been loaded."}},
                                    status_code=400)
            self.served.append(body["lora_name"])
            return Response(f"Success: LoRA adapter '{body['lora_name']}' added successfully.")

        @app.post("/v1/unload_lora_adapter")
        async def unload(request: Request) -> Response:
            name = (await request.json())["lora_name"]
            if name not in self.served[1:]:
                return JSONResponse({"error": {"message": f"The lora adapter '{name}' cannot be found."}}, status_code=404)
            self.served.remove(name)
            return Response(f"Success: LoRA adapter '{name}' removed successfully.")

        return app

    def _events(self, prompt: list[int], ids: list[int], lps: list[float], finish: str) -> Iterator[str]:
        for i, (t, lp) in enumerate(zip(ids, lps, strict=True)):
            if self.break_after is not None and i >= self.break_after:
                return
            choice = {"index": 0, "text": self.tokenizer.decode([t]), "token_ids": [t], "logprobs": {"token_logprobs": [lp]},
                      "prompt_token_ids": prompt if i == 0 else None, "finish_reason": finish if i == len(ids) - 1 else None}
            yield "data: " + json.dumps({"id": "cmpl-fake", "object": "text_completion", "choices": [choice]}) + "\n\n"
        yield "data: [DONE]\n\n"


class _Killable(httpx.AsyncBaseTransport):
    """The fake's ASGI app, or a refused connection while the fake is ``down``."""

    def __init__(self, fake: FakeVLLM) -> None:
        self.fake = fake
        self.inner = httpx.ASGITransport(app=fake.app)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.fake.down:
            raise httpx.ConnectError("connection refused", request=request)
        return await self.inner.handle_async_request(request)
