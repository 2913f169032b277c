"""``LocalBackend``: transformers in-process, the CPU default.

Concurrent ``agenerate`` calls are gathered into batches (left-padded, KV-cached
``generate``) so a group of episodes shares one forward per token, as a server would.
The prompt tokens every request of a batch begins with (an agent's system prompt and tool
schemas: most of each prompt) run once, as one row, and every row reads their keys and
values (``seed_agents.backends.prefix``; vLLM's prefix cache does the same across requests);
``share_prefix=False`` turns it off. Across the turns of an episode, a call reads the keys
and values of the episode's previous prompt for the tokens the two share
(``seed_agents.backends.turn_cache``: per episode, so an episode's numbers never depend on
its neighbours); ``turn_cache_bytes=0`` turns it off. The default KV cache grows in place
(``seed_agents.backends.growing_cache``); ``kv_cache="concat"`` is transformers' own, which
copies every layer's keys and values at every token, and ``kv_cache="static"`` decodes into
buffers sized for the whole generation. These switches rebuild older paths: they are
``seed_agents.backends.engine.LocalEngineOptions``, set by benchmarks and tests, not by the
user config.

Reproducible runs. A row's logits depend on its batch: on this CPU, the same prompt alone,
in a batch of four, or in the same four in another order gives logits that differ by
~5e-6 (matmul kernels change with the row count; padding changes the attention's
reductions), while the same batch run twice is bit-identical. So, for requests made by
the episodes of a seeded runner (a ``Cohort`` in the capture scope), batches are formed in
lockstep instead of by arrival time: a wave holds one request from every live episode,
sorted by sampling params and seed, then chunked by ``max_batch_size``; its composition
depends only on what the episodes did, so its logits are the same bits in every run. Each
row samples from its own ``torch.Generator`` seeded by the request's seed (Gumbel-max on
the temperature/top-p processed logits, the distribution transformers samples from), so
a row's draw never depends on its neighbours; an unseeded request draws its seed from the
global torch RNG, as sampling did before.

Log-probabilities are the raw log-softmax of the model's logits (temperature 1), the same
quantity vLLM returns, so both backends feed the trainer identical numbers.

The trainer may share the model object (``LocalBackend(model=trainer_model)``): weights
updated in place are live for the next request; ``policy_version`` is bumped by the sync.

Abandoned requests stop costing compute: when every request of a batch has been
cancelled (its episode timed out), generation stops at the next token. At interpreter
exit every in-flight generation is stopped and waited for, because a torch forward still
running on a daemon thread while the interpreter tears down aborts the process
("terminate called without an active exception", exit status 134).

Streaming (``stream``/``astream``) runs each stream as its own batch of one, through the
same ``generate`` call as the batched path (so greedy and seeded streams sample the same
ids): a transformers streamer hands each new token over as it is chosen, paired with the
raw log-softmax row a forward hook saw for that step. A consumer that stops reading ends
the generation at the next token.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from transformers.cache_utils import DynamicCache, StaticCache

from seed_agents.aio import stop_at_exit
from seed_agents.backends.base import BackendError, CompletionPiece
from seed_agents.backends.decode import chosen_logprobs, sample_until_done
from seed_agents.backends.grammar import grammar_mask
from seed_agents.backends.growing_cache import GrowingCache
from seed_agents.backends.prefix import cache_kwarg, prefix_groups, prefix_kv, worth_sharing
from seed_agents.backends.turn_cache import KV, TurnCache, weights_fingerprint
from seed_agents.capture import Cohort, Ticket, current_scope
from seed_agents.precision import compute_in
from seed_agents.types import Completion, SamplingParams

#: ``on_token(token_id, logprob)``: called from the generating thread per sampled token.
OnToken = Callable[[int, float], None]


class _InFlight:
    """Counts generate calls running in this process; at exit, stops and awaits them."""

    def __init__(self) -> None:
        self.shutting_down = threading.Event()
        self._idle = threading.Condition()
        self._running = 0

    def __enter__(self) -> _InFlight:
        with self._idle:
            self._running += 1
        return self

    def __exit__(self, *exc: object) -> None:
        with self._idle:
            self._running -= 1
            self._idle.notify_all()

    def stop_all(self, timeout_s: float = 30.0) -> None:
        self.shutting_down.set()
        with self._idle:
            self._idle.wait_for(lambda: self._running == 0, timeout=timeout_s)


_IN_FLIGHT = _InFlight()
stop_at_exit(_IN_FLIGHT.stop_all)


def _stopping_criteria(should_stop: Callable[[], bool]) -> Any:
    """A transformers stopping criterion that ends the whole batch when ``should_stop()``."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class _Stop(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            stop = should_stop() or _IN_FLIGHT.shutting_down.is_set()
            return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([_Stop()])


@contextlib.contextmanager
def _token_streamer(model: torch.nn.Module, on_token: OnToken | None, batch_size: int) -> Iterator[Any]:
    """A transformers streamer calling ``on_token(id, raw logprob)`` per sampled token.

    The streamer sees only the chosen ids, so a forward hook keeps each step's raw
    log-softmax row (the same logits ``output_logits`` returns) in a FIFO: the k-th
    forward of a generation scores the k-th sampled token. Yields None without ``on_token``.
    """
    if on_token is None:
        yield None
        return
    if batch_size != 1:
        raise ValueError("token streaming runs one request at a time")
    from transformers.generation.streamers import BaseStreamer

    rows: collections.deque[torch.Tensor] = collections.deque()

    def keep_logits(module: Any, args: Any, output: Any) -> None:
        rows.append(output.logits[0, -1].float().log_softmax(-1))

    class _Streamer(BaseStreamer):
        prompt_seen = False

        def put(self, value: torch.Tensor) -> None:
            if not self.prompt_seen:  # generate() first hands over the prompt
                self.prompt_seen = True
                return
            token = int(value.reshape(-1)[0])
            on_token(token, float(rows.popleft()[token]))

        def end(self) -> None:
            pass

    handle = model.register_forward_hook(keep_logits)
    try:
        yield _Streamer()
    finally:
        handle.remove()


class _RowSampler:
    """Samples row ``i`` of a batch with its own generator (seeded by ``seeds[i]``): Gumbel
    noise added to the processed logits, then transformers' greedy argmax takes the
    sample. Hand-written because ``generate`` samples every row from the one global RNG,
    so a row's draw would depend on its neighbours and on everything else using that RNG."""

    def __init__(self, seeds: list[int]) -> None:
        self.generators = [torch.Generator().manual_seed(s) for s in seeds]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        uniform_B_V = torch.stack([torch.rand(scores.shape[-1], generator=g) for g in self.generators])
        return scores - torch.log(-torch.log(uniform_B_V))  # + Gumbel(0, 1); log(0) gives -inf: never picked


def _batch_key(params: SamplingParams) -> str:
    """Requests batch together when their params agree but for the seed (each row has its own)."""
    return params.model_copy(update={"seed": None}).model_dump_json()


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future[Completion]
    t0: float = field(default_factory=time.perf_counter)
    cohort: Cohort | None = None
    ticket: Ticket | None = None
    owner: Any = None  # the capture scope (episode) that asked: whose turn cache it reads

    def order(self) -> tuple[str, int, list[int]]:
        """Where the request goes in its wave: by params, then seed (its episode and call)."""
        return _batch_key(self.params), -1 if self.params.seed is None else self.params.seed, self.prompt_ids


class LocalBackend:
    """In-process generation with a transformers causal LM."""

    def __init__(
        self,
        model: str | torch.nn.Module,
        *,
        tokenizer: Any = None,
        dtype: torch.dtype = torch.float32,
        compute_dtype: torch.dtype | None = None,
        max_batch_size: int = 8,
        batch_wait_s: float = 0.005,
        policy_version: int = 0,
        share_prefix: bool = True,
        prefix_groups: bool = True,
        turn_cache_bytes: int = 1 << 30,
        kv_cache: Literal["dynamic", "static", "concat"] = "dynamic",
        fp32_attention: bool = False,
        drop_finished: bool = True,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(model, str):
            from seed_agents.models import resolve_model

            path = resolve_model(model)
            self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
            self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
        else:
            self.model = model
            if tokenizer is None:
                raise ValueError("pass tokenizer= when giving LocalBackend a model object")
            self.tokenizer = tokenizer
        self.model.eval()
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        if kv_cache not in ("dynamic", "static", "concat"):
            raise ValueError(f"kv_cache must be 'dynamic', 'static' or 'concat', got {kv_cache!r}")
        # static: each batch's keys and values in buffers sized for its whole generation, so a
        # decode step writes one column in place where the dynamic cache concatenates every
        # layer's whole cache (a large share of a batched step: docs/benchmarks.md, "Decode taken
        # apart"). Attention then spans the buffer, masked: the same tokens up to float rounding.
        self.kv_cache = kv_cache
        self.max_batch_size = max_batch_size
        # bf16 where the CPU is fast at it: autocast over the (shared, fp32) weights
        # (``seed_agents.precision``); None or float32 computes in the weights' own dtype.
        self.compute_dtype = compute_dtype
        # dynamic: the cache grows in place (seed_agents.backends.growing_cache), its values stored
        # in fp32 where attention upcasts them anyway; concat: transformers' own
        self._value_dtype = (torch.float32 if fp32_attention and compute_dtype not in (None, torch.float32)
                             else None)
        if fp32_attention and compute_dtype not in (None, torch.float32):
            from seed_agents.precision import attention_in_fp32

            attention_in_fp32(self.model)  # the model's (shared with the trainer: the update's too)
        self.batch_wait_s = batch_wait_s
        # a finished row leaves the forward (seed_agents.backends.decode); false: transformers' generate
        self.drop_finished = drop_finished
        self.share_prefix = share_prefix  # compute a batch's common prompt prefix once (seed_agents.backends.prefix)
        self.prefix_groups = prefix_groups  # ... once per group of rows that share more than the batch (prefix_groups)
        # an episode's next turn reads its last prompt's keys and values (seed_agents.backends.turn_cache)
        self.turn_cache = TurnCache(turn_cache_bytes)
        self._policy_version = policy_version
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.tokenizer.eos_token_id)
        self._lock = threading.Lock()  # one forward at a time; the trainer may share the model
        self._queues: dict[int, list[_Request]] = {}
        self._workers: set[int] = set()

    @property
    def policy_version(self) -> int:
        return self._policy_version

    @policy_version.setter
    def policy_version(self, version: int) -> None:
        """A weight sync: the turn cache is stale (and its memory is freed now, not at the
        next request)."""
        self._policy_version = version
        self.turn_cache.check(-1)

    # -- public API ------------------------------------------------------------------
    def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        t0 = time.perf_counter()
        comp = self._generate_batch([prompt_ids], params, owners=[current_scope()])[0]
        comp.latency_s = time.perf_counter() - t0
        return comp

    async def agenerate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        loop = asyncio.get_running_loop()
        scope = current_scope()
        req = _Request(list(prompt_ids), params, loop.create_future(), cohort=scope.cohort if scope else None,
                       owner=scope)
        key = id(loop)
        self._queues.setdefault(key, []).append(req)
        if req.cohort is not None:
            req.ticket = req.cohort.join()
        if key not in self._workers:
            self._workers.add(key)
            loop.create_task(self._drain(key))
        try:
            return await req.future
        finally:
            if req.cohort is not None and req.ticket is not None and req.ticket.wave is None:
                req.cohort.withdraw(req.ticket)  # abandoned before its wave: it no longer counts

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[CompletionPiece]:
        """One piece per sampled token, then a last (empty) piece with the finish reason.
        Closing the iterator stops the generation at the next token and waits for it."""
        pieces: queue.Queue[CompletionPiece | BaseException] = queue.Queue()
        stop = threading.Event()
        version, owner = self.policy_version, current_scope()

        def run() -> None:
            try:
                pieces.put(self._stream_one(list(prompt_ids), params, stop.is_set, pieces.put, version, owner))
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                pieces.put(e)

        worker = threading.Thread(target=run, name="seed-agents-local-stream", daemon=True)
        worker.start()
        try:
            while True:
                item = pieces.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            stop.set()
            worker.join()

    async def astream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[CompletionPiece]:
        """Async ``stream``: the generation runs in a worker thread; ``aclose()`` (or a
        cancelled consumer) stops it at the next token."""
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue[CompletionPiece | BaseException] = asyncio.Queue()
        stop = threading.Event()
        version, owner = self.policy_version, current_scope()

        def put(item: CompletionPiece | BaseException) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody is listening
                loop.call_soon_threadsafe(pieces.put_nowait, item)

        def run() -> None:
            try:
                put(self._stream_one(list(prompt_ids), params, stop.is_set, put, version, owner))
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                put(e)

        worker = asyncio.ensure_future(asyncio.to_thread(run))
        try:
            while True:
                item = await pieces.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            stop.set()
            # The thread ends within one token; its errors were handed over (or nobody listens).
            with contextlib.suppress(Exception):
                await asyncio.shield(worker)

    def _stream_one(self, prompt_ids: list[int], params: SamplingParams, should_stop: Callable[[], bool],
                    put: Callable[[CompletionPiece], None], version: int, owner: Any = None) -> CompletionPiece:
        """Generate one stream, ``put`` a piece per token; return the last piece."""
        streamed: list[int] = []

        def on_token(token_id: int, logprob: float) -> None:
            streamed.append(token_id)
            put(CompletionPiece([token_id], [logprob], None, version))

        comp = self._generate_batch([prompt_ids], params, should_stop, on_token, owners=[owner])[0]
        if comp.token_ids[: len(streamed)] != streamed:
            raise BackendError(f"streamed ids {streamed} disagree with the generated {comp.token_ids}")
        # Normally nothing is left: every id was streamed as it was sampled.
        rest = len(streamed)
        return CompletionPiece(comp.token_ids[rest:], comp.logprobs[rest:], comp.finish_reason, version)

    def score(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        from seed_agents.scoring import sequence_logprobs

        with self._lock, torch.no_grad(), compute_in(self.compute_dtype):
            return sequence_logprobs(self.model, prompt_ids, completion_ids).tolist()

    async def ascore(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        return await asyncio.to_thread(self.score, prompt_ids, completion_ids)

    def close(self) -> None:
        pass

    # -- batching ----------------------------------------------------------------------
    async def _drain(self, key: int) -> None:
        """Serve queued requests in batches until the queue is empty, then exit."""
        try:
            while self._queues.get(key):
                await asyncio.sleep(self.batch_wait_s)  # let concurrent callers join the batch
                batch = self._next_batch(key)
                if not batch:  # a cohort's wave is still forming
                    continue
                def abandoned(batch: list[_Request] = batch) -> bool:
                    return all(r.future.cancelled() for r in batch)

                try:
                    comps = await asyncio.to_thread(self._generate_batch, [r.prompt_ids for r in batch],
                                                    batch[0].params, abandoned, None,
                                                    [r.params.seed for r in batch], [r.owner for r in batch])
                except BaseException as e:
                    for r in batch:
                        if not r.future.done():
                            r.future.set_exception(e)
                    if isinstance(e, asyncio.CancelledError):
                        raise
                    continue
                finally:
                    for r in batch:
                        if r.cohort is not None and r.ticket is not None:
                            r.cohort.done(r.ticket)
                now = time.perf_counter()
                for r, c in zip(batch, comps):
                    c.latency_s = now - r.t0
                    if not r.future.done():
                        r.future.set_result(c)
        finally:
            self._workers.discard(key)
            if not self._queues.get(key):
                self._queues.pop(key, None)

    def _next_batch(self, key: int) -> list[_Request]:
        """The next batch to run: requests outside any cohort by arrival (params agreeing but
        for the seed); else the first chunk of a released cohort wave, in wave order."""
        # a cohort request abandoned before its wave was released will never be run
        queue = self._queues[key] = [r for r in self._queues[key]
                                     if not (r.future.done() and r.ticket is not None and r.ticket.wave is None)]
        free = [r for r in queue if r.cohort is None]
        if free:
            batch = [r for r in free if _batch_key(r.params) == _batch_key(free[0].params)][: self.max_batch_size]
        else:
            for cohort in {id(r.cohort): r.cohort for r in queue if r.cohort is not None}.values():
                cohort.release_overdue()
            ready = sorted((r for r in queue if r.ticket is not None and r.ticket.wave is not None),
                           key=lambda r: (r.ticket.wave, *r.order()))  # type: ignore[union-attr]
            if not ready:
                return []
            head = ready[0]
            batch = [r for r in ready if r.ticket.wave == head.ticket.wave and r.cohort is head.cohort  # type: ignore[union-attr]
                     and _batch_key(r.params) == _batch_key(head.params)][: self.max_batch_size]
        self._queues[key] = [r for r in queue if not any(r is b for b in batch)]
        return batch

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams,
                        should_stop: Callable[[], bool] = lambda: False,
                        on_token: OnToken | None = None, seeds: list[int | None] | None = None,
                        owners: list[Any] | None = None) -> list[Completion]:
        """Every torch op of a batch runs inside ``_IN_FLIGHT``, so exit waits for all of it.
        ``seeds``: each row's sampling seed (default: ``params.seed`` for every row);
        ``owners``: each row's episode (its capture scope), whose turn cache it reads."""
        if _IN_FLIGHT.shutting_down.is_set():
            raise RuntimeError("the process is exiting: no new generation")
        with _IN_FLIGHT:
            return self._generate_tracked(prompts, params, should_stop, on_token,
                                          seeds if seeds is not None else [params.seed] * len(prompts),
                                          owners if owners is not None else [None] * len(prompts))

    def _generate_tracked(self, prompts: list[list[int]], params: SamplingParams,
                          should_stop: Callable[[], bool], on_token: OnToken | None,
                          seeds: list[int | None], owners: list[Any]) -> list[Completion]:
        from transformers import (
            GenerationConfig,
            LogitsProcessorList,
            TemperatureLogitsWarper,
            TopPLogitsWarper,
        )

        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt")
        stop = set(params.stop_token_ids)
        if self.tokenizer.eos_token_id is not None:
            stop.add(int(self.tokenizer.eos_token_id))
        input_ids, attention, extra = self._layout(prompts, owners, params.max_tokens)
        mask = grammar_mask(params.structural_tag, self.tokenizer, self.model.config.vocab_size, len(prompts), stop)
        if mask is not None and on_token is not None:
            on_token = mask.streamed(on_token)
        processors = LogitsProcessorList([mask] if mask is not None else [])
        with (self._lock, torch.no_grad(), compute_in(self.compute_dtype),
              _token_streamer(self.model, on_token, len(prompts)) as streamer):
            if params.temperature > 0:  # the warpers (and order) transformers' own sampling applies
                processors.append(TemperatureLogitsWarper(params.temperature))
                if params.top_p < 1.0:
                    processors.append(TopPLogitsWarper(params.top_p))
                processors.append(_RowSampler([int(torch.randint(0, 2**62, ())) if s is None else s for s in seeds]))
            if self.drop_finished:
                key = cache_kwarg(self.model)
                new, tok_logps = sample_until_done(
                    self.model, input_ids, attention, cache=extra.get(key), cache_kwarg=key,
                    position_ids=extra.get("position_ids"), processors=processors, stop_ids=sorted(stop),
                    max_new=params.max_tokens, pad_id=self.pad_id, streamer=streamer,
                    should_stop=lambda: should_stop() or _IN_FLIGHT.shutting_down.is_set(),
                    after_prefill=lambda cache: self._store_turns(cache, attention, prompts, owners))
            else:
                # A fresh GenerationConfig: the checkpoint's defaults (top_k=50, repetition
                # penalty, ...) would silently change the distribution we claim to sample from.
                # Greedy decoding throughout: sampling is the processors' (``_RowSampler``).
                cfg = GenerationConfig(
                    max_new_tokens=params.max_tokens, do_sample=False, temperature=None, top_p=None,
                    top_k=None, eos_token_id=sorted(stop), pad_token_id=self.pad_id,
                    output_logits=True, return_dict_in_generate=True, disable_compile=True,
                )
                out = self.model.generate(input_ids=input_ids, attention_mask=attention, generation_config=cfg,
                                          stopping_criteria=_stopping_criteria(should_stop), streamer=streamer,
                                          logits_processor=processors, **extra)
                self._store_turns(out.past_key_values, attention, prompts, owners)
                new = out.sequences[:, input_ids.shape[1]:]
                tok_logps = chosen_logprobs(out.logits, new)
                del out  # every step's logits
        if mask is not None:  # the logprob under the mask the token was sampled from, as vLLM reports it
            tok_logps = tok_logps - mask.log_mass_B_T(tok_logps.shape[1])
        comps = []
        for i in range(len(prompts)):
            ids = new[i].tolist()
            finish = "length"
            for j, t in enumerate(ids):
                if t in stop:
                    ids, finish = ids[: j + 1], "stop"
                    break
            comps.append(Completion(
                token_ids=ids, logprobs=tok_logps[i, : len(ids)].tolist(),
                finish_reason=finish, policy_version=self.policy_version,
            ))
        return comps

    def _layout(self, prompts: list[list[int]], owners: list[Any],
                max_new: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """(input ids, attention mask, generate's extra kwargs) of a batch whose rows start
        from keys and values already computed: the row's episode's last prompt (the turn
        cache) or, where longer, the prefix its group of the batch shares (computed once per
        group: ``prefix_groups``, e.g. one task's hindsight prompts, which share far more than
        the batch does).

        Rows are laid out [pad | cached tokens | pad | own tokens]: the cached columns are
        the cache's, right-aligned so that every row's own tokens start at the same column,
        and explicit positions (the count of real tokens before) keep each token where it
        sits in its own prompt. A batch whose rows all read one shared prefix reads it
        without copying it per row (the dynamic cache; a static one holds ``max_new`` more
        columns a row, for the tokens to come, and copies it in)."""
        n_rows = len(prompts)
        if not self.share_prefix:
            groups = []
        elif self.prefix_groups:
            groups = prefix_groups(prompts)
        else:  # prefix_groups off (an engine option benchmarks set): one prefix, the one the whole batch shares
            groups = [(list(range(n_rows)), shared)] if (shared := worth_sharing(prompts)) else []
        with (self._lock, torch.no_grad(), compute_in(self.compute_dtype)):
            self.turn_cache.check(weights_fingerprint(self.model, self._policy_version, self.compute_dtype))
            reused = [self.turn_cache.lookup(o, p) for o, p in zip(owners, prompts)]
            sources: list[tuple[int, KV | None]] = list(reused)
            for members, shared in groups:  # each group's prefix once, for the rows whose turn cache holds less
                wanting = [i for i in members if reused[i][0] < shared]
                if wanting:
                    group_kv = prefix_kv(self.model, torch.tensor([prompts[wanting[0]][:shared]]))
                    for i in wanting:
                        sources[i] = (shared, group_kv)
        cached = [n for n, _ in sources]
        cache_width = max(cached)
        width = cache_width + max(len(p) - n for p, n in zip(prompts, cached))
        input_ids = torch.full((n_rows, width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((n_rows, width), dtype=torch.long)
        for i, (p, n) in enumerate(zip(prompts, cached)):
            input_ids[i, cache_width - n:cache_width] = torch.tensor(p[:n], dtype=torch.long)
            input_ids[i, width - (len(p) - n):] = torch.tensor(p[n:], dtype=torch.long)
            attention[i, cache_width - n:cache_width] = 1
            attention[i, width - (len(p) - n):] = 1
        if not cache_width:
            if self.kv_cache == "static":
                return input_ids, attention, {cache_kwarg(self.model): self._static_cache(width + max_new, [])}
            if self.kv_cache == "dynamic":
                return input_ids, attention, {cache_kwarg(self.model): GrowingCache(value_dtype=self._value_dtype,
                                                                                    reserve=max_new)}
            return input_ids, attention, {}
        one = sources[0][1]
        if one is not None and all(kv is one for _, kv in sources):  # one prefix for every row: read, not copied
            layers = [(k.expand(n_rows, -1, -1, -1), v.expand(n_rows, -1, -1, -1)) for k, v in one]
        else:
            layers = []
            for layer, (k0, v0) in enumerate(next(kv for _, kv in sources if kv is not None)):
                k = k0.new_zeros((n_rows, k0.shape[1], cache_width, k0.shape[3]))
                v = v0.new_zeros((n_rows, v0.shape[1], cache_width, v0.shape[3]))
                for i, (n, kv) in enumerate(sources):
                    if n and kv is not None:
                        k[i, :, cache_width - n:] = kv[layer][0][0]
                        v[i, :, cache_width - n:] = kv[layer][1][0]
                layers.append((k, v))
        positions = (attention.cumsum(1) - 1).clamp(min=0)
        if self.kv_cache == "static":
            cache = self._static_cache(width + max_new, layers)
        elif self.kv_cache == "dynamic":
            cache = GrowingCache(layers, value_dtype=self._value_dtype, reserve=max_new)
        else:
            cache = DynamicCache(ddp_cache_data=layers)
        return input_ids, attention, {cache_kwarg(self.model): cache, "position_ids": positions}

    def _static_cache(self, length: int, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        """A cache of ``length`` columns a row, its first columns the given keys and values."""
        cache = StaticCache(config=self.model.config, max_cache_len=length)
        with torch.no_grad():
            for i, (k, v) in enumerate(layers):
                cache.update(k, v, i)
        return cache

    def _store_turns(self, past: Any, attention: torch.Tensor, prompts: list[list[int]], owners: list[Any]) -> None:
        """Each row's prompt keys and values, copied out of the batch's cache, as its
        episode's turn-cache entry (the columns its mask marks real, in order). Called with
        the lock held, right after the prefill (before any finished row leaves the cache)."""
        if self.turn_cache.max_bytes == 0 or all(o is None for o in owners) or not isinstance(past, (DynamicCache, StaticCache)):
            return
        width = attention.shape[1]
        for i, (owner, prompt) in enumerate(zip(owners, prompts)):
            if owner is None:
                continue
            real = attention[i].bool()
            # boolean indexing copies: the entry owns its memory, the batch's cache can go
            kv = [(layer.keys[i:i + 1, :, :width][:, :, real], layer.values[i:i + 1, :, :width][:, :, real])
                  for layer in past.layers]
            if kv and kv[0][0].shape[2] == len(prompt):
                self.turn_cache.store(owner, prompt, kv)
