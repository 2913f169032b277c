"""Freed heap memory goes back to the OS when asked, and the trainer asks between phases."""

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
