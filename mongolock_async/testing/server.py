"""An embedded MongoDB wire-protocol server (SecantusDB) for tests and the demo.

``EmbeddedMongo`` runs ``secantusd-py`` on 127.0.0.1 with an OS-assigned port, a temporary data
directory and ``--sync-on-commit`` (without it, a SIGKILL loses acknowledged writes). It can be
restarted on the same data directory and port (after a clean stop or a SIGKILL), paused and resumed
(SIGSTOP/SIGCONT, a stand-in for a network partition), and closed, which stops it, frees the port and
removes the directory.

Nothing is left behind however the process that started it ends: a failed start removes what it
made; and a small reaper process (``sh``) holds the read end of a pipe from this process, so that
when this process ends without ``close()`` (a normal exit, an exception, SIGTERM, SIGKILL), the
pipe closes and the reaper stops the server and removes the directory. Where the reaper dies too
(a SIGKILL of the whole session), the next start removes the directories nobody uses any more.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from urllib.parse import quote_plus

import anyio.to_thread

from .._util.process import die_with_parent

_LISTENING = re.compile(r"listening on ([\d.]+):(\d+)")
_LAUNCH = "import sys; from secantus.cli import main; sys.argv[0] = 'secantusd-py'; sys.exit(main())"
HANDSHAKE_TIMEOUT = 3.0
"""Seconds the embedded server waits for a client's TLS handshake."""
# SecantusDB runs each TLS handshake on its one accept thread with no deadline (secantus/server.py,
# `_serve_forever`): one peer that connects and never sends its ClientHello (a driver task cancelled
# between its TCP connect and its handshake leaks such a socket until garbage collection) stalls
# every later connection, so a healthy server looks unreachable. Bound each handshake.
_BOUNDED_HANDSHAKE = f"""
import ssl
_wrap_socket = ssl.SSLContext.wrap_socket
def _bounded_wrap_socket(self, sock, *args, **kwargs):
    sock.settimeout({HANDSHAKE_TIMEOUT})
    return _wrap_socket(self, sock, *args, **kwargs)
ssl.SSLContext.wrap_socket = _bounded_wrap_socket
"""
# SecantusDB finds where a change stream starts (startAtOperationTime) by decoding its whole oplog,
# under the lock every request takes (secantus/storage.py, `_find_seq_for_ts_scan`), about 30 us an
# entry: with its default cap of 100,000 entries, each stream opened late in a test run stalled the
# server for up to a second. Streams here start a moment back, so a short oplog is enough; one that
# outlives its history fails and the library reopens it, as on a mongod whose oplog rolled over.
OPLOG_ENTRIES = 1000
"""The embedded server's oplog cap, in entries (it prunes every 1,000 writes, so it holds up to 2,000)."""

# SecantusDB keeps the reply of every retryable write, keyed by (session, txnNumber), for 30 minutes
# (secantus/transactions.py, `record_retryable`), and scans them all on every retryable write, and
# sorts them all once there are 10,000: a server slows down with the writes it has served (a
# findAndModify took 4 ms on a fresh server, 25 ms after 11,000 writes), until renewals on a shared
# test server miss their deadlines. mongod keeps one record per session, for its newest txnNumber
# (config.transactions; an older txnNumber is refused as TransactionTooOld:
# src/mongo/db/transaction/transaction_participant.cpp), so keep only that one here too.
_ONE_RETRYABLE_RECORD_PER_SESSION = """
from secantus.transactions import TransactionRegistry
_record_retryable = TransactionRegistry.record_retryable
def _record_newest_retryable(self, lsid, txn_number, identity, reply):
    newest = self.__dict__.setdefault("_newest_retryable", {})
    if txn_number < newest.get(lsid, txn_number):
        return
    _record_retryable(self, lsid, txn_number, identity, reply)
    with self._lock:
        if (lsid, txn_number) in self._retryable:
            if newest.get(lsid, txn_number) != txn_number:
                self._retryable.pop((lsid, newest[lsid]), None)
            newest[lsid] = txn_number
TransactionRegistry.record_retryable = _record_newest_retryable
"""
# SecantusDB checks every stage of an update or aggregation pipeline for parse-time problems
# (secantus/aggregate.py, `expression_problem_in_pipeline`: an undefined variable, an operator's
# arity, a literal timezone) on every request, walking every expression: a quarter of its CPU per
# findAndModify of the library's pipelines (a sampling profile of a server answering acquire +
# release). The check of a stage depends on the stage and the names bound (`let`) alone when no
# `let` values are folded, and the pipeline's problem is its first stage's problem, so each stage's
# answer is remembered by its text (at most 4,096, then forgotten at once): the same errors, for a
# fraction of the work. A server answering acquire + release spent 22 ms of CPU per cycle without
# this and 17 ms with it (a semaphore's: 27 and 17 ms), on a loaded machine.
_STAGE_CHECKS_REMEMBERED = """
import secantus.commands as _commands
_check_pipeline = _commands.expression_problem_in_pipeline
_stage_problems = {}
def _check_pipeline_by_stage(pipeline, bound, fold_vars=None):
    if fold_vars is not None or not isinstance(pipeline, list):
        return _check_pipeline(pipeline, bound, fold_vars)
    for stage in pipeline:
        key = (repr(stage), bound)
        found = _stage_problems.get(key, _stage_problems)
        if found is _stage_problems:
            found = _check_pipeline([stage], bound, None)
            if len(_stage_problems) >= 4096:
                _stage_problems.clear()
            _stage_problems[key] = found
        if found is not None:
            return found
    return None
_commands.expression_problem_in_pipeline = _check_pipeline_by_stage
"""
# Reads the server's pid each time it starts; "closed" when close() cleaned up. At end of input
# without "closed" (the starting process is gone), kills the last server (if it still runs in the
# directory), removes its libfaketime objects once no live process has its pid (gone, or a zombie
# not yet reaped: the server may have died with its owner; see _remove_libfaketime_objects), and
# removes the directory.
_REAPER = """
last=''
while read -r line; do
  [ "$line" = closed ] && exit 0
  last=$line
done
if [ -n "$last" ] && [ "$(readlink "/proc/$last/cwd" 2>/dev/null)" = "$1" ]; then kill -9 "$last" 2>/dev/null; fi
sleep 0.5
if [ -n "$last" ]; then
  state=$(sed 's/.*) //' "/proc/$last/stat" 2>/dev/null | cut -c1)
  if [ -z "$state" ] || [ "$state" = Z ]; then rm -f "/dev/shm/sem.faketime_sem_$last" "/dev/shm/faketime_shm_$last"; fi
fi
rm -rf "$1"
"""


def _remove_libfaketime_objects(pid: int) -> None:
    """Remove the POSIX semaphore and shared memory that libfaketime, when ``environment`` preloads
    it, creates for the server and names after its pid. libfaketime removes them only at a normal
    exit (``ft_cleanup``, src/libfaketime.c), and the server is stopped by a signal. Left in
    /dev/shm, they make a later ``faketime`` command that gets the same pid fail with ``sem_open:
    File exists``. Called while the pid is still the server's (before the process is reaped)."""
    for name in (f"sem.faketime_sem_{pid}", f"faketime_shm_{pid}"):
        with contextlib.suppress(OSError):
            os.unlink(Path("/dev/shm") / name)


class EmbeddedServerError(RuntimeError):
    """The embedded server is not installed, or did not start; the message carries its log."""


@dataclass(frozen=True, slots=True)
class EmbeddedTLS:
    """TLS for the embedded server: PEM files of its certificate and key, and of the certificate
    authority that signed them (the URI tells clients to verify the server with it). With
    ``client_ca``, every client must present a certificate signed by that authority."""

    certificate: Path
    key: Path
    ca: Path
    client_ca: Path | None = None


class EmbeddedMongo:
    """A SecantusDB server process. Use as a (sync or async) context manager, or ``start``/``close``.

    - ``replica_set``: advertise a single-node replica set (default; change streams and
      transactions work). False starts it ``--standalone``.
    - ``test_commands``: enable ``configureFailPoint`` (``--enable-test-commands``).
    - ``auth``: ``(user, password)`` to require SCRAM authentication; the user is created with the
      ``root`` role and the URI carries the credentials.
    - ``port``: listen on this port (default: one the OS assigns).
    - ``tls``: serve TLS only ([`EmbeddedTLS`][mongolock_async.testing.EmbeddedTLS]); the URI then
      asks for TLS, verified with the server's certificate authority.
    - ``oplog_entries``: the oplog's cap (default ``OPLOG_ENTRIES``); each change stream's opening
      costs the server about 30 us an entry kept.
    - ``environment``: variables set for the server process, over this process's environment
      (libfaketime's ``LD_PRELOAD`` and ``FAKETIME_TIMESTAMP_FILE``, say, to set the server's clock;
      the semaphore and shared memory libfaketime makes for the server go with it).
    """

    def __init__(
        self,
        *,
        replica_set: bool = True,
        test_commands: bool = False,
        auth: tuple[str, str] | None = None,
        startup_timeout: float = 60.0,
        cache_size: str = "128M",
        port: int | None = None,
        tls: EmbeddedTLS | None = None,
        oplog_entries: int = OPLOG_ENTRIES,
        environment: Mapping[str, str] | None = None,
    ) -> None:
        if importlib.util.find_spec("secantus") is None:
            raise EmbeddedServerError(
                "the embedded MongoDB server needs SecantusDB: install the embedded extra (from a checkout: "
                "pip install '.[embedded]')"
            )
        self.replica_set = replica_set
        self.test_commands = test_commands
        self.auth = auth
        self.startup_timeout = startup_timeout
        self.cache_size = cache_size
        self.port: int | None = port
        """The port: OS-assigned at the first start unless given."""
        self.tls = tls
        self.oplog_entries = oplog_entries
        self.environment = dict(environment or {})
        self._workdir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._paused = False
        self._reaper: subprocess.Popen[bytes] | None = None

    # -- life cycle -------------------------------------------------------------------------------

    def start(self) -> str:
        """Start the server (on a new temporary directory the first time) and return its URI."""
        if self.running:
            return self.uri
        if self._workdir is not None:
            self._launch(auth=self.auth is not None, tls=self.tls is not None)
            return self.uri
        _remove_abandoned_directories()
        self._workdir = Path(tempfile.mkdtemp(prefix=_DIRECTORY_PREFIX))
        try:
            (self._workdir / "data").mkdir()
            self._reaper = subprocess.Popen(
                ["sh", "-c", _REAPER, f"{_DIRECTORY_PREFIX}reaper", str(self._workdir)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # not stopped by a Ctrl-C meant for this process
            )
            if self.auth is not None:
                self._launch(auth=False, tls=False)
                self._create_user(*self.auth)
                self.stop()
            self._launch(auth=self.auth is not None, tls=self.tls is not None)
        except BaseException:
            self.close()  # a failed first start leaves nothing behind
            raise
        return self.uri

    def stop(self) -> None:
        """Stop the server cleanly (SIGTERM, then SIGKILL after 10 s); keep its data for a restart."""
        process = self._process
        if process is None:
            return
        if self._paused:
            self.resume()
        if process.poll() is None:
            _remove_libfaketime_objects(process.pid)
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._process = None

    def kill(self) -> None:
        """SIGKILL the server, as a crash would; keep its data for a restart."""
        process = self._process
        if process is None:
            return
        _remove_libfaketime_objects(process.pid)
        process.kill()
        process.wait()
        self._process = None
        self._paused = False

    def restart(self, *, crash: bool = False) -> str:
        """Stop (or with ``crash=True`` SIGKILL) and start again on the same data directory and port."""
        self.kill() if crash else self.stop()
        return self.start()

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open but nothing answers, like a network partition."""
        self._require_process().send_signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT a paused server."""
        self._require_process().send_signal(signal.SIGCONT)
        self._paused = False

    def close(self) -> None:
        """Stop the server, free its port and remove its temporary directory."""
        # SIGKILL, not a clean stop: the data goes with the directory, and SecantusDB's clean stop
        # waits up to 2 s for its accept thread and 5 s for its connections (secantus/server.py,
        # `stop`), seconds per server that a test suite starting one per test pays many times.
        self.kill()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        if self._reaper is not None:
            self._tell_reaper("closed")
            with contextlib.suppress(OSError, ValueError):
                self._reaper.stdin.close()  # type: ignore[union-attr]
            self._reaper.wait()
            self._reaper = None
        self.port = None

    # -- facts ------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def storage_path(self) -> Path | None:
        return None if self._workdir is None else self._workdir / "data"

    @property
    def log_path(self) -> Path | None:
        return None if self._workdir is None else self._workdir / "server.log"

    @property
    def uri(self) -> str:
        """``mongodb://`` URI of the server (with credentials when ``auth`` is set)."""
        return self._uri(bare=False)

    def _uri(self, *, bare: bool) -> str:
        """The URI; ``bare``: without credentials and TLS, for the launch that creates the user."""
        if self.port is None:
            raise EmbeddedServerError("the embedded server has not been started")
        credentials = ""
        options = "directConnection=true"
        if self.auth is not None and not bare:
            credentials = f"{quote_plus(self.auth[0])}:{quote_plus(self.auth[1])}@"
            options += "&authSource=admin"
        if self.tls is not None and not bare:
            options += f"&tls=true&tlsCAFile={quote_plus(str(self.tls.ca))}"
        return f"mongodb://{credentials}127.0.0.1:{self.port}/?{options}"

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    # -- context managers -------------------------------------------------------------------------

    def __enter__(self) -> EmbeddedMongo:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> EmbeddedMongo:
        try:
            await anyio.to_thread.run_sync(self.start)
        except BaseException:
            self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self.close)

    # -- internals --------------------------------------------------------------------------------

    def _launch(self, *, auth: bool, tls: bool) -> None:
        if self._workdir is None or self.log_path is None:
            raise EmbeddedServerError("the embedded server was launched without its directory")
        command = [
            sys.executable, "-c", self._launch_code(tls=tls),
            "--host", "127.0.0.1",
            "--port", str(self.port or 0),
            "--storage-path", str(self._workdir / "data"),
            "--sync-on-commit",
            "--cache-size", self.cache_size,
            "--oplog-max-entries", str(self.oplog_entries),
        ]  # fmt: skip
        if not self.replica_set:
            command.append("--standalone")
        if self.test_commands:
            command.append("--enable-test-commands")
        if auth:
            command.append("--auth")
        if tls and self.tls is not None:
            command += ["--tls-cert-file", str(self.tls.certificate), "--tls-key-file", str(self.tls.key)]
            if self.tls.client_ca is not None:
                command += ["--tls-ca-file", str(self.tls.client_ca), "--tls-require-client-cert"]
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._workdir,
                env={**os.environ, **self.environment},
                # PR_SET_PDEATHSIG follows the thread that forks; only the main thread lives as long
                # as the process. Servers started elsewhere rely on the reaper alone.
                preexec_fn=die_with_parent if threading.current_thread() is threading.main_thread() else os.setpgrp,
            )
        self._tell_reaper(str(self._process.pid))
        self._wait_until_listening(log_start)

    def _launch_code(self, *, tls: bool) -> str:
        """The Python program the server process runs: SecantusDB's command line, after the
        patches above."""
        patches = _ONE_RETRYABLE_RECORD_PER_SESSION + _STAGE_CHECKS_REMEMBERED
        return (_BOUNDED_HANDSHAKE if tls else "") + patches + _LAUNCH

    def _tell_reaper(self, line: str) -> None:
        if self._reaper is not None and self._reaper.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                self._reaper.stdin.write(f"{line}\n".encode())
                self._reaper.stdin.flush()

    def _wait_until_listening(self, log_start: int) -> None:
        if self._process is None or self.log_path is None:
            raise EmbeddedServerError("waited for an embedded server that was not launched")
        give_up_at = time.monotonic() + self.startup_timeout
        while time.monotonic() < give_up_at:
            if self._process.poll() is not None:
                self._process = None
                raise EmbeddedServerError(f"the embedded server exited during start-up; its log:\n{self.log_tail()}")
            with self.log_path.open("rb") as log:
                log.seek(log_start)
                match = _LISTENING.search(log.read().decode(errors="replace"))
            if match and _accepts_connections(int(match.group(2))):
                self.port = int(match.group(2))
                return
            time.sleep(0.05)
        self.kill()
        raise EmbeddedServerError(
            f"the embedded server did not listen within {self.startup_timeout:g} s; its log:\n{self.log_tail()}"
        )

    def _create_user(self, user: str, password: str) -> None:
        from pymongo import MongoClient

        client: MongoClient[dict[str, object]]
        with MongoClient(self._uri(bare=True), serverSelectionTimeoutMS=10_000) as client:
            client.admin.command("createUser", user, pwd=password, roles=["root"])

    def _require_process(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            raise EmbeddedServerError("the embedded server is not running")
        return self._process


_DIRECTORY_PREFIX = "mongolock-embedded-"
_ABANDONED_AFTER = 60.0
"""Seconds after which a directory without a process is abandoned, not one a start is setting up."""


def _remove_abandoned_directories() -> None:
    """Remove embedded servers' directories that neither a server (its working directory) nor a
    reaper (its arguments) uses any more: left when the reaper was killed along with its owner
    (a SIGKILL of the whole session), as it otherwise removes the directory itself. Linux only."""
    root = Path(tempfile.gettempdir())
    stale_before = time.time() - _ABANDONED_AFTER
    candidates = [
        directory
        for directory in root.glob(f"{_DIRECTORY_PREFIX}*")
        if directory.is_dir() and directory.stat().st_mtime < stale_before
    ]
    if not candidates or not Path("/proc/self").exists():
        return
    in_use: set[str] = set()
    for process in Path("/proc").iterdir():
        if not process.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            in_use.add(os.readlink(process / "cwd"))
        with contextlib.suppress(OSError):
            in_use.update(os.fsdecode(argument) for argument in (process / "cmdline").read_bytes().split(b"\0"))
    for directory in candidates:
        if str(directory) not in in_use:
            shutil.rmtree(directory, ignore_errors=True)


def _accepts_connections(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False
