"""libfaketime (Debian's faketime package), preloaded into a child process to shift its wall clock.

Preloaded directly (``LD_PRELOAD`` and ``FAKETIME``), not through the ``faketime`` command: both make
a POSIX semaphore and shared memory named after the pid, and where /dev/shm still holds a pair of
that pid (left by a process killed under libfaketime), the command exits 1 (``sem_open: File
exists``, src/faketime.c) while the library goes on without them (``ft_shm_create``,
src/libfaketime.c).
"""

from __future__ import annotations

import glob
from pathlib import Path

LIBFAKETIME = next(
    (path for pattern in ("/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1")
     for path in sorted(glob.glob(pattern))),
    None,
)  # fmt: skip
LIBFAKETIME_MISSING = "this test runs a process under libfaketime (Debian's faketime package; `make test` installs it)"


def preloaded(**variables: str) -> dict[str, str]:
    """The variables that run a child process under libfaketime, with ``variables`` (libfaketime's
    settings: ``FAKETIME="+40s"``, ``FAKETIME_TIMESTAMP_FILE=...``); its monotonic clocks are left
    alone, so that timeouts and the job workers' run times measure real time."""
    assert LIBFAKETIME is not None, LIBFAKETIME_MISSING
    return {"LD_PRELOAD": LIBFAKETIME, "FAKETIME_DONT_FAKE_MONOTONIC": "1", **variables}


def objects_of(pid: int) -> list[Path]:
    """The semaphore and shared memory in /dev/shm that libfaketime made for process ``pid``."""
    names = (f"sem.faketime_sem_{pid}", f"faketime_shm_{pid}")
    return [path for path in (Path("/dev/shm") / name for name in names) if path.exists()]
