import asyncio
import json
import threading

from seed_agents.capture import JsonlSink, capture, read_jsonl, record_call
from seed_agents.types import LLMCall


def _call(tag: str) -> LLMCall:
    return LLMCall(messages=[{"role": "user", "content": tag}], prompt_ids=[1, 2], completion_ids=[3], logprobs=[-0.1], text=tag)


def test_nested_scopes_record_in_inner_and_outer_with_labels():
    with capture(run="r") as outer:
        record_call(_call("a"))
        with capture(task_id="t1") as inner:
            record_call(_call("b"))
    record_call(_call("outside"))  # no active scope: ignored, no error
    assert [c.text for c in outer.calls] == ["a", "b"]
    assert [c.text for c in inner.calls] == ["b"]
    assert inner.calls[0].scope == {"run": "r", "task_id": "t1"}


def test_scopes_are_isolated_between_concurrent_asyncio_tasks():
    async def episode(i: int):
        with capture(episode=i) as cap:
            for k in range(3):
                await asyncio.sleep(0.001 * ((i + k) % 3))
                record_call(_call(f"{i}-{k}"))
        return cap

    async def main():
        return await asyncio.gather(*(episode(i) for i in range(8)))

    caps = asyncio.run(main())
    for i, cap in enumerate(caps):
        assert [c.text for c in cap.calls] == [f"{i}-{k}" for k in range(3)]
        assert all(c.scope["episode"] == i for c in cap.calls)


def test_calls_from_worker_threads_reach_the_scope_of_the_copied_context():
    import contextvars

    with capture() as cap:
        ctx = contextvars.copy_context()
        threads = [threading.Thread(target=ctx.copy().run, args=(record_call, _call(str(i)))) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(c.text for c in cap.calls) == ["0", "1", "2", "3"]


def test_jsonl_sink_writes_as_it_happens_and_once_per_sink(tmp_path):
    path = tmp_path / "calls.jsonl"
    with JsonlSink(path) as sink:
        with capture(sink=sink):
            with capture(sink=sink, task_id="t"):  # same sink twice on the chain: one line
                record_call(_call("x"))
            assert len(path.read_text().splitlines()) == 1  # flushed before the scope ends
    rows = read_jsonl(path, LLMCall)
    assert rows[0].text == "x" and rows[0].completion_ids == [3]


def test_read_jsonl_skips_a_truncated_last_line(tmp_path):
    path = tmp_path / "calls.jsonl"
    path.write_text(_call("a").model_dump_json() + "\n" + json.dumps({"call_id": "x"})[:8])
    assert [c.text for c in read_jsonl(path, LLMCall)] == ["a"]


def test_capture_purpose_override_is_inherited():
    with capture(purpose="analyzer") as outer:
        with capture(task_id="t") as inner:
            pass
    assert outer.purpose == inner.purpose == "analyzer"
