"""What the benchmark and soak scripts share: a server to run on, and worker processes that get
the URI on stdin and report JSON counts when they end."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

import mongolock_async
from mongolock_async._util.process import die_with_parent
from mongolock_async.testing import EmbeddedMongo


def environment(uri: str | None, *more: str) -> str:
    """One line saying where a run happened: date, Python, platform, cores, load, the library (and
    where it was imported from: ``PYTHONPATH`` can point at another checkout), the driver, the
    server, then ``more``."""
    server = "MongoDB at --uri" if uri else f"embedded SecantusDB {version('secantusdb')}"
    return " | ".join(
        (
            f"date {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
            f"python {platform.python_version()}",
            platform.platform(),
            f"{os.cpu_count()} cores",
            f"load average {os.getloadavg()[0]:.2f}",
            f"mongolock-async {mongolock_async.__version__} from {Path(mongolock_async.__file__).parent}",
            f"pymongo {version('pymongo')}",
            f"server {server}",
            *more,
        )
    )


@contextlib.contextmanager
def mongodb(uri: str | None) -> Iterator[str]:
    """The given server, or a fresh embedded one (it slows down as writes accumulate)."""
    if uri:
        yield uri
        return
    with EmbeddedMongo() as server:
        yield server.uri


def start_worker(script: Path, arguments: Sequence[str], uri: str) -> subprocess.Popen[str]:
    """Start ``script`` with ``arguments``; the URI goes on its stdin, never its command line. It
    dies with this process."""
    worker = subprocess.Popen(
        [sys.executable, str(script), *arguments],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=script.parent.parent,
        preexec_fn=die_with_parent,
    )  # fmt: skip
    assert worker.stdin is not None
    worker.stdin.write(uri + "\n")
    worker.stdin.close()
    return worker


def collect_counts(workers: Sequence[subprocess.Popen[str]]) -> Counter[str]:
    """Wait for every worker and add up the JSON counts each printed last; RuntimeError if one failed."""
    counts: Counter[str] = Counter()
    for worker in workers:
        assert worker.stdout is not None
        out = worker.stdout.read()
        if worker.wait(timeout=300) != 0:
            raise RuntimeError(f"worker {worker.args[1]} failed (exit {worker.returncode})")
        counts.update(json.loads(out))
    return counts


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of process ``pid`` so far (0 when there is none to read)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
