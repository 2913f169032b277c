"""Give freed heap memory back to the operating system between a training step's phases.

glibc's malloc keeps what a process frees in its heap, to hand out again; only the top of
the heap is returned by itself. A training step frees gigabytes in blocks of many sizes
(each decode step's key/value tensors grow by one token, scoring's logits, the loss
forward's activations), and the next phase's blocks rarely fit the holes, so the heap grows
and the memory stays resident: in a long learning run most of what the training process
held between updates was such freed heap, its peak grew over the run, and one
``malloc_trim(0)`` called into the live process gave most of it back (docs/benchmarks.md,
"Framework costs").
``malloc_trim`` walks the free chunks and releases their whole pages (``madvise``): no
value any tensor holds changes, only which pages stay mapped.

Why by hand: no maintained Python package wraps it (it is one libc call, reached through
ctypes); where the C library has no ``malloc_trim`` (musl, macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """libc's ``malloc_trim``, or None where the C library lacks it."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_free_memory() -> bool:
    """Return the heap's free pages to the OS; whether this C library can (glibc: yes).
    Costs a walk over the free chunks, and the pages are faulted in (zeroed) again when
    the next phase grows the heap back."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
"""``mallopt`` parameters (glibc's malloc.h)."""


def limit_heap_growth(arenas: int = 2, mmap_threshold: int = 4 << 20) -> bool:
    """Keep the heap from growing with holes; whether this C library took the settings.

    glibc gives each thread that allocates at once an arena of its own (up to eight per core),
    and raises its mmap threshold each time a large block is freed, so that later blocks of
    that size come from the heap. A training process has both: the rollouts' worker threads
    allocate in parallel, and every phase frees and allocates tensors of many megabytes. The
    heap then holds freed blocks that the next phase's sizes do not fit, in several arenas,
    and ``malloc_trim`` between phases cannot reach what a live block pins. Two arenas and a
    fixed threshold send every block of ``mmap_threshold`` bytes or more to its own mapping,
    returned to the system the moment it is freed. Not lower: a decode step's logits and
    keys are blocks of one to a few MB, and mapping each anew (its pages faulted in and zeroed)
    made the rollouts much slower at 1 MB and one arena. Called before the work allocates
    (glibc reads the same settings from ``MALLOC_ARENA_MAX`` and ``MALLOC_MMAP_THRESHOLD_``,
    which a user's environment may set instead: then this leaves both alone). The numbers the
    process computes do not change, only where its blocks live (docs/benchmarks.md, the main
    job's memory)."""
    if os.environ.get("MALLOC_ARENA_MAX") or os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, arenas)) and bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold))


# -- peak resident memory per phase ----------------------------------------------------------

class PeakRSS:
    """The peak resident memory of each phase of a process, exactly and for free: Linux keeps
    a process's high-water mark (``VmHWM`` in ``/proc/self/status``) and writing ``5`` to
    ``/proc/self/clear_refs`` resets it to the current RSS. Sampling RSS from a thread would
    miss a peak between samples; ``tracemalloc`` sees no torch tensor.

    A reset also resets what ``getrusage`` reports (``ru_maxrss``, and so ``/usr/bin/time`` and
    a parent's ``RUSAGE_CHILDREN``): those read the peak since the last reset. ``process_gb``
    is the whole process's peak, carried across resets. Where ``/proc`` has no such files, or
    the reset is refused, every reading is None."""

    def __init__(self, status: str = "/proc/self/status", clear_refs: str = "/proc/self/clear_refs") -> None:
        self.status, self.clear_refs = status, clear_refs
        # the largest high-water mark read so far: the kernel's counters are approximate by a few
        # pages, so a later reading may fall just short of an earlier one
        self._seen_kb = 0
        self._reset = False  # whether a reset has worked: only then is a reading a phase's

    def _hwm_kb(self) -> int | None:
        try:
            with open(self.status, encoding="ascii") as file:
                for line in file:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1])
        except (OSError, ValueError, IndexError):
            return None
        return None

    def reset(self) -> bool:
        """Start a phase: the high-water mark from now on. Whether it could."""
        hwm = self._hwm_kb()
        if hwm is None:
            return False
        try:
            with open(self.clear_refs, "w", encoding="ascii") as file:
                file.write("5")
        except OSError:
            self._reset = False
            return False
        self._seen_kb = max(self._seen_kb, hwm)
        self._reset = True
        return True

    def phase_gb(self) -> float | None:
        """The peak RSS since the last ``reset``, in GB of 2**30 bytes (the project's peaks are
        ``ru_maxrss`` KiB / 2**20, so the figures compare); None without a reset."""
        hwm = self._hwm_kb() if self._reset else None
        if hwm is None:
            return None
        self._seen_kb = max(self._seen_kb, hwm)
        return hwm / 2**20

    def process_gb(self) -> float | None:
        """The process's peak RSS (GB of 2**30 bytes) since it started, across resets; None
        without ``/proc``."""
        hwm = self._hwm_kb()
        return None if hwm is None else max(hwm, self._seen_kb) / 2**20


PEAK_RSS = PeakRSS()
"""This process's: the trainer resets it at each phase, whose peaks go to metrics.jsonl."""
