"""Freed heap memory goes back to the OS when asked, and the trainer asks between phases."""

import os

import pytest

from seed_agents import memory


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.skipif(memory._malloc_trim() is None, reason="needs glibc's malloc_trim")
def test_freed_heap_blocks_leave_the_resident_set_only_when_released():
    """64 KiB blocks sit below glibc's mmap threshold, so they live in the heap; one kept
    block near the top stops glibc from trimming it by itself, as a training step's
    surviving tensors do."""
    blocks = [bytearray(64 << 10) for _ in range(4096)]  # 256 MiB, zero-filled: every page touched
    keep = blocks[-1]
    del blocks
    held = _rss_bytes()
    assert memory.release_free_memory() is True
    released = _rss_bytes()
    assert held - released > 128 << 20, (held >> 20, released >> 20)
    assert len(keep) == 64 << 10


def test_without_malloc_trim_it_does_nothing(monkeypatch):
    monkeypatch.setattr(memory, "_malloc_trim", lambda: None)
    assert memory.release_free_memory() is False


def _status(path, hwm_kb: int) -> None:
    path.write_text(f"Name:\tpython\nVmPeak:\t 9999999 kB\nVmHWM:\t {hwm_kb} kB\nVmRSS:\t 1000 kB\n")


def test_a_phase_peak_is_the_high_water_mark_since_its_reset_and_the_process_peak_survives_resets(tmp_path):
    status, clear = tmp_path / "status", tmp_path / "clear_refs"
    peaks = memory.PeakRSS(str(status), str(clear))
    _status(status, 3 * 2**20)
    assert peaks.phase_gb() is None, "no phase before a reset"
    assert peaks.process_gb() == 3.0
    assert peaks.reset() is True and clear.read_text() == "5"
    _status(status, 2**20)  # the kernel's mark, reset to the RSS then, has grown to 1 GiB since
    assert peaks.phase_gb() == 1.0 and peaks.process_gb() == 3.0
    assert peaks.reset() is True
    _status(status, 4 * 2**20)
    assert peaks.phase_gb() == 4.0 and peaks.process_gb() == 4.0


def test_without_proc_or_a_refused_reset_a_phase_reads_none(tmp_path):
    missing = memory.PeakRSS(str(tmp_path / "no-status"), str(tmp_path / "clear_refs"))
    assert missing.reset() is False and missing.phase_gb() is None and missing.process_gb() is None
    status = tmp_path / "status"
    _status(status, 2**20)
    refused = memory.PeakRSS(str(status), str(tmp_path / "no-such-dir" / "clear_refs"))
    assert refused.reset() is False and refused.phase_gb() is None
    assert refused.process_gb() == 1.0, "the process's peak needs no reset"


needs_proc = pytest.mark.skipif(not memory.PeakRSS().reset(), reason="needs Linux's /proc/self/clear_refs")


@needs_proc
def test_this_process_peak_per_phase():
    peaks = memory.PeakRSS()
    assert peaks.reset()
    block = bytearray(256 << 20)  # zero-filled: every page touched
    big = peaks.phase_gb()
    del block
    memory.release_free_memory()
    assert peaks.reset()
    small = peaks.phase_gb()
    assert big - small > 0.2, (big, small)
    assert peaks.process_gb() >= big


@needs_proc
def test_a_batch_keeps_one_decode_steps_logits_at_a_time(tiny_model_dir):
    """The log-probs of a batch's sampled tokens are taken step by step: its (rows, steps, vocab)
    logits are never held at once, nor stacked, nor log-softmaxed whole (here 16 x 48 x 49k fp32,
    150 MB each: holding, stacking and log-softmaxing them grows the heap by three copies; the
    bound, two copies, leaves room for the allocator's noise)."""
    from seed_agents.backends.local import LocalBackend
    from seed_agents.types import SamplingParams

    backend = LocalBackend(tiny_model_dir, max_batch_size=16, turn_cache_bytes=0)
    prompts = [[1, 2, 3, 4 + i] for i in range(16)]
    params = SamplingParams(max_tokens=48, temperature=1.0)
    backend._generate_batch(prompts, params, seeds=list(range(16)))  # warm: the first forward's allocations
    memory.release_free_memory()
    peaks = memory.PeakRSS()
    for drop_finished in (True, False):
        backend.drop_finished = drop_finished
        memory.release_free_memory()
        assert peaks.reset()
        before = peaks.phase_gb()
        comps = backend._generate_batch(prompts, params, seeds=list(range(16)))
        grown = peaks.phase_gb() - before
        assert sum(len(c.token_ids) for c in comps) > 16 * 40, "the batch decoded its steps"
        limit = 2.0 * 16 * 48 * backend.model.config.vocab_size * 4 / 2**30
        assert grown < limit, (drop_finished, grown, limit)


_HOLES = r"""
import ctypes, ctypes.util, json, sys
from seed_agents.memory import limit_heap_growth
took = limit_heap_growth() if sys.argv[1] == "limited" else None
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def rss_mb():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) / 1024
size = 8 << 20
first = libc.malloc(size)
libc.free(first)  # glibc's default then raises its mmap threshold to 8 MB: later blocks come from the heap
blocks, pins = [], []
for _ in range(40):
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    blocks.append(block)
    pins.append(libc.malloc(256 << 10))  # a live block after each (too big for the free lists: from the top) pins the heap
before = rss_mb()
for block in blocks:
    libc.free(block)
print(json.dumps({"took": took, "held_mb": rss_mb() - (before - 40 * 8)}))
"""


@needs_proc
@pytest.mark.parametrize("mode", ["default", "limited"])
def test_a_freed_block_of_megabytes_leaves_no_hole_in_the_heap(mode):
    """The allocator settings the commands start with: 40 freed blocks of 8 MB, each followed
    by a smaller live block, stay resident in glibc's default heap (its threshold rose with the
    first free) and go back to the system under ``limit_heap_growth``."""
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", _HOLES, mode], capture_output=True, text=True, env=env, check=True)
    got = json.loads(out.stdout)
    if mode == "limited":
        assert got["took"] is True
        assert got["held_mb"] < 40, got
    else:
        assert got["held_mb"] > 200, got
