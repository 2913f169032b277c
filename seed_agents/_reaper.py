"""Kill a process group when its owner dies, however it dies (SIGKILL included).

``VLLMServer`` starts this watchdog first, as the leader of a new process group (in its
owner's session), then vLLM inside that group (api_server, and the EngineCore and worker processes it
starts). The watchdog's stdin is a pipe from the owner, who never writes to it: the kernel
closes the pipe when the owner exits for any reason, so EOF on stdin means "owner gone":
SIGTERM to the group, up to ``GRACE_S`` seconds for it to exit, then SIGKILL to the group
(the watchdog included, last).

Why not ``prctl(PR_SET_PDEATHSIG)`` alone: it reaches only the direct child (the
api_server); vLLM's EngineCore and worker are grandchildren that keep running, and the
port, after their api_server is SIGKILLed; and it fires when the *thread* that started the
child exits, not the process, so a server started from a worker thread would die with it.

The watchdog ignores SIGTERM and SIGINT: the owner's own ``killpg(SIGTERM)`` is meant for
vLLM, and the owner ends with ``killpg(SIGKILL)``, which ends the watchdog too. Its pid is
the group id, so the id cannot be reused while any member lives.

Stdlib only, run as ``python -I _reaper.py GRACE_S``: quick to start, with none of
seed_agents' dependencies.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def group_members(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes in process group ``pgid``, read from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # exited while we looked
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses
        fields = stat[stat.rfind(b")") + 2 :].split()
        if fields[0] not in (b"Z", b"X") and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def main(grace_s: float) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:  # block until the owner is gone
        try:
            if not os.read(0, 4096):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    pgid, me = os.getpgrp(), os.getpid()
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and [p for p in group_members(pgid) if p != me]:
        time.sleep(0.2)
    os.killpg(pgid, signal.SIGKILL)


if __name__ == "__main__":
    main(float(sys.argv[1]))
