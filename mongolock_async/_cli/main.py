"""The ``mongolock`` command: the demo, operator commands to list, inspect and break locks, and
``check``, which judges a deployment against the library's contract.

Exit codes: 0 success; 1 a demo check failed, the operator declined, or MongoDB refused a command;
2 usage error (``release --holder`` that selects several holders); 3 MongoDB unreachable or the URI
is invalid; 4 the collection, lock or ``--holder`` does not exist; 5 refused (plain ``release`` of a
lease this command does not own); 6 authentication failed. A command whose output pipe closes
early (``mongolock list | head -1``) stops without a traceback and exits 1. ``check`` exits 0 when
every check passed, 1 with a warning, 2 with a failure (3 and 6 as above; 130 after Ctrl-C and 143
after SIGTERM, once its scratch documents are removed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import logging
import os
import secrets
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError
from pymongo.write_concern import WriteConcern

from .._util import validation
from .._util.collection_types import AsyncCollection
from .._util.inert import printable, shell_word
from .._version import __version__
from ..admin import operations
from ..admin.dashboard_guard import LOOPBACK_HOSTS, MIN_SECRET_LENGTH, is_loopback
from ..admin.operations import LockInfo
from ..store import ForcedRelease, store_for
from ..store.documents import LockReport
from . import report_view as view
from .commandline import EXIT_FAILED, EXIT_MISSING, EXIT_REFUSED, EXIT_USAGE, UserError, connect, explain

DEFAULT_DATABASE = "mongolock"


def _server_class() -> Any:
    """uvicorn's server, with this command's own Ctrl-C and SIGTERM handling: uvicorn's would
    raise the signal again once it stopped, and the command would end as interrupted (130)."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return Server
DEFAULT_COLLECTION = "locks"


def _add_uri_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--uri",
        default=os.environ.get("MONGODB_URI"),
        help="MongoDB URI (default: env MONGODB_URI, which is safer for a URI with a password: "
        "command lines are visible to every user of the machine)",
    )


def build_parser() -> argparse.ArgumentParser:
    connection = argparse.ArgumentParser(add_help=False)
    _add_uri_option(connection)
    connection.add_argument(
        "--db",
        default=os.environ.get("MONGOLOCK_DB", DEFAULT_DATABASE),
        help=f"database of the lock collection (env MONGOLOCK_DB, default {DEFAULT_DATABASE})",
    )
    connection.add_argument(
        "--collection",
        default=os.environ.get("MONGOLOCK_COLLECTION", DEFAULT_COLLECTION),
        help=f"lock collection (env MONGOLOCK_COLLECTION, default {DEFAULT_COLLECTION})",
    )
    parser = argparse.ArgumentParser(prog="mongolock", description="Distributed locks on MongoDB.")
    parser.add_argument("--version", action="version", version=f"mongolock {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser(
        "demo",
        help="run the demo scenarios (on an embedded server unless --uri is given)",
        description="Seven scenarios with several OS processes, checked at the end: a flash sale, a run-once job, "
        "crash and takeover, a paused holder and fenced writes, a rate limit shared by processes (a semaphore), "
        "leader failover (an election), and a job once per period whose killed run is retried; then "
        "`mongolock check` on the same deployment. "
        "Uses a database of its own (mongolock_demo_<random>) and drops it afterwards.",
    )
    _add_uri_option(demo)
    demo.add_argument("--workers", type=int, default=4, help="processes in the flash sale (default 4)")
    demo.add_argument("--tasks", type=int, default=6, help="buyer tasks per process (default 6)")
    demo.add_argument("--items", type=int, default=3, help="products on sale (default 3)")
    demo.add_argument("--stock", type=int, default=40, help="units of each product (default 40)")
    demo.add_argument("--schedulers", type=int, default=3, help="processes racing for the run-once job (default 3)")
    demo.add_argument("--ttl", type=float, default=2.0, help="lease TTL in the job scenarios, seconds (default 2)")
    demo.add_argument("--job-ttls", type=float, default=3.0, help="length of the run-once job in TTLs (default 3)")
    demo.add_argument("--limit", type=int, default=3, help="calls at once the rate-limited API allows (default 3)")
    demo.add_argument("--plain", action="store_true", help="plain text output even on a terminal")

    server = commands.add_parser(
        "server",
        help="run the embedded MongoDB server in the foreground (for development and tests)",
        description="Runs SecantusDB on 127.0.0.1 until interrupted (Ctrl-C or SIGTERM), then stops it and "
        "removes its data directory. Prints its URI first. "
        "It is a test double, not MongoDB: its findAndModify scans the whole collection even for an _id "
        "equality, so every acquire and release costs more as the collection holds more lock documents "
        "(released ones included); MongoDB answers those requests from the _id index whatever the "
        "collection's size. Keep its collections small: a fresh one per test.",
    )
    server.add_argument("--port", type=int, default=27017, help="port to listen on (default 27017; 0: any free one)")
    server.add_argument("--standalone", action="store_true", help="no replica set (and so no change streams)")
    server.add_argument("--test-commands", action="store_true", help="enable configureFailPoint")

    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--json", action="store_true", help="machine-readable output (UTF-8 JSON)")

    listing = commands.add_parser(
        "list",
        parents=[connection, output],
        help="list locks: state, holder, time left, waiters (fencing tokens: inspect or --json)"
    )
    listing.add_argument("--held", action="store_true", help="only locks whose lease is live")
    listing.add_argument("--prefix", default="", help="only locks whose name starts with this")
    listing.add_argument(
        "--limit", type=int, default=None, help="at most this many locks; stderr then says how to ask for the next page"
    )
    listing.add_argument("--after", default=None, metavar="NAME", help="start after this name (the last of a page)")

    inspect = commands.add_parser("inspect", parents=[connection, output], help="show one lock in detail")
    inspect.add_argument("name", help="the lock's name (its document's _id)")

    release = commands.add_parser("release", parents=[connection, output], help="break-glass release of a lock")
    release.add_argument("name", help="the lock's name (its document's _id)")
    release.add_argument("--force", action="store_true", help="release a lease this command does not own")
    release.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    release.add_argument(
        "--holder",
        metavar="TOKEN",
        help="break only the lease whose owner token (shown by inspect and by the confirmation) is TOKEN, or "
        "the only one that starts with it; refused if it selects none or several. Default: every live lease "
        "shown. Either way, a lease that ended or changed hands before the release is left alone",
    )
    _add_check_parser(commands, connection, output)
    _add_view_parsers(commands, connection, output)
    return parser


def _add_view_parsers(commands: Any, connection: argparse.ArgumentParser, output: argparse.ArgumentParser) -> None:
    views = argparse.ArgumentParser(add_help=False)
    views.add_argument("--prefix", default="", help="only locks whose name starts with this")
    views.add_argument(
        "--poll-interval",
        type=float,
        default=2.0,
        help="seconds between reads where there is no change stream (a standalone server; default 2)",
    )
    watch = commands.add_parser(
        "watch",
        parents=[connection, output, views],
        help="a live view of the locks: holders, time left, waiters, events (Ctrl-C stops)",
        description="Every lock, semaphore, read-write lock, election and job with its holders, time left, waiting "
        "processes and fencing token or term, and the events (acquired, handed off, released, expired, lost, forced) "
        "as they happen, from one change stream (reading every --poll-interval seconds where there is none). On a "
        "terminal with rich installed, a live screen; else (or with --plain or --json) one line per event, after one "
        "'held' line per holder at the start. It only reads. Ctrl-C or SIGTERM stops it (exit 0).",
    )
    watch.add_argument("--held", action="store_true", help="on the screen, only locks whose lease is live")
    watch.add_argument("--plain", action="store_true", help="one line per event even on a terminal")
    dashboard = commands.add_parser(
        "dashboard",
        parents=[connection, views],
        help="serve the live dashboard page (needs uvicorn: the dashboard or fastapi extra)",
        description="Serves the dashboard of the lock collection: the same view as watch, live, with a timeline of "
        "the last minutes per lock. Read-only unless --allow-release. Binds to 127.0.0.1 unless --host says "
        "otherwise: the page has no authentication of its own. Ctrl-C or SIGTERM stops it (exit 0).",
    )
    dashboard.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    dashboard.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0: any free one)")
    dashboard.add_argument("--title", default="locks", help="the page's heading")
    dashboard.add_argument(
        "--allow-release",
        action="store_true",
        help="show a button that breaks a lease (confirmed in the page, logged at WARNING); off by default",
    )
    dashboard.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests for this host name (as the Host header names it: the name a proxy or "
        "browser uses); repeatable. Default: localhost, 127.0.0.1, ::1 and --host; any other is refused (403)",
    )
    dashboard.add_argument(
        "--secret-file",
        default=os.environ.get("MONGOLOCK_DASHBOARD_SECRET_FILE"),
        metavar="PATH",
        help="derive the page's release token from the secret in PATH (created, readable by its owner only, "
        "when missing; env MONGOLOCK_DASHBOARD_SECRET_FILE), so that it outlives a restart and is the same in "
        "every process serving this dashboard; default: a random token per process",
    )


def _add_check_parser(commands: Any, connection: argparse.ArgumentParser, output: argparse.ArgumentParser) -> None:
    check = commands.add_parser(
        "check",
        parents=[connection, output],
        help="is this deployment fit for the locks, and what does a lock cost on it (--perf)",
        description="Checks the server (version and its support, topology, change streams, transactions, "
        "wake-ups, the Stable API), majority-write latency, the replica set (members, lag, oplog window, failover "
        "time, arbiters, journaling), the clocks that decide expiry, this user's privileges and the lock "
        "collection (its documents and options); with --perf, what a lock costs against the raw driver. Each "
        "line: pass, warn, fail or skip, what was measured, and the fix. Exit code 0 all passed, 1 a warning, "
        "2 a failure. Writes only lock names "
        "under a scratch prefix (mongolock-check-<random>:) and removes them before it exits, also on Ctrl-C.",
    )
    check.add_argument(
        "--ttl",
        type=float,
        default=30.0,
        help="the smallest TTL your locks use, seconds (default 30): majority writes and clocks are judged "
        "against it and its safety margin",
    )
    check.add_argument(
        "--safety-margin",
        type=float,
        default=None,
        help="your locks' safety_margin, seconds (default: the library's, 10%% of the TTL, at most 1 s)",
    )
    check.add_argument("--read-only", action="store_true", help="skip every check that writes: nothing is written")
    check.add_argument("--writes", type=int, default=20, help="majority writes timed (default 20)")
    check.add_argument(
        "--scan-limit", type=int, default=10_000, help="lock documents read for the collection checks (default 10000)"
    )
    check.add_argument(
        "--perf", action="store_true", help="also measure what a lock costs here, on scratch locks (under a minute)"
    )
    check.add_argument("--perf-cycles", type=int, default=100, help="uncontended cycles (default 100)")
    check.add_argument("--perf-hand-offs", type=int, default=30, help="hand-offs across connections (default 30)")
    check.add_argument(
        "--perf-seconds", type=float, default=2.0, help="length of each hot-lock window, seconds (default 2)"
    )
    check.add_argument("--perf-leases", type=int, default=1000, help="leases renewed by the heartbeat (default 1000)")
    check.add_argument(
        "--perf-duration",
        type=float,
        default=10.0,
        help="seconds of the sustained load (4 tasks taking and releasing scratch locks, against the raw "
        "requests): its p99 is a percentile, not the slowest of a few samples (default 10)",
    )


def main(argv: Sequence[str] | None = None) -> NoReturn:
    code: int | str | None = EXIT_FAILED
    parsed_only = False
    try:
        try:
            code = _run(argv)
        except SystemExit as exit_:  # argparse's --help, --version and usage errors
            code, parsed_only = exit_.code, True
        # A reader that went away shows here, not in the interpreter's own flush at exit.
        sys.stdout.flush()
    except BrokenPipeError:
        # `mongolock list | head -1`: the reader has gone. Python's recipe (the signal module's
        # docs): stdout pointed at devnull, so the flush at exit cannot fail again; no traceback.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        # A command cut short failed; help and version end as argparse ends them, whether their
        # text was lost at its write (stdout unbuffered) or at this flush (buffered, the default).
        if not parsed_only:
            code = EXIT_FAILED
    sys.exit(code)


def _run(argv: Sequence[str] | None) -> int:
    arguments = build_parser().parse_args(argv)
    # What a forced release broke is this command's own output; without a handler, Python would
    # also print the library's audit record on stderr, where only failures go.
    logging.getLogger("mongolock_async.audit").addHandler(logging.NullHandler())
    try:
        if arguments.command == "demo":
            from .demo.run import run_demo

            code = run_demo(arguments)
        elif arguments.command == "server":
            code = _serve(arguments)
        elif arguments.command == "check":
            from .check.run import run

            code = run(arguments)
        elif arguments.command == "watch":
            code = asyncio.run(_watch(arguments))
        elif arguments.command == "dashboard":
            code = asyncio.run(_dashboard(arguments))
        else:
            code = asyncio.run(_operate(arguments))
    except UserError as error:
        print(f"mongolock: {printable(str(error))}", file=sys.stderr)
        code = error.exit_code
    except KeyboardInterrupt:
        code = 130
    return code


def _serve(arguments: argparse.Namespace) -> int:
    """Run the embedded server until SIGINT or SIGTERM; stop it and remove its data on the way out."""
    from ..testing.server import EmbeddedMongo, EmbeddedServerError

    stop = threading.Event()
    for signal_number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signal_number, lambda number, frame: stop.set())
    try:
        server = EmbeddedMongo(
            replica_set=not arguments.standalone, test_commands=arguments.test_commands, port=arguments.port or None
        )
        with server:
            print(f"mongolock: embedded MongoDB listening: {server.uri}", flush=True)
            print(f"mongolock: data in {server.storage_path} (removed on exit); stop with Ctrl-C", flush=True)
            stop.wait()
            print("mongolock: stopping", flush=True)
    except EmbeddedServerError as error:
        message = str(error)
        if "address already in use" in message.lower():
            raise UserError(
                f"port {arguments.port} is already in use (another MongoDB?): pass --port N, or --port 0 for any "
                "free port",
                EXIT_FAILED,
            ) from None
        cause = next((line for line in reversed(message.splitlines()) if line.strip()), "")
        raise UserError(f"{message.splitlines()[0]} {cause}".strip(), EXIT_FAILED) from None
    return 0


async def _operate(arguments: argparse.Namespace) -> int:
    if arguments.command == "release" and not arguments.force:
        raise UserError(
            f"refusing to release {arguments.name!r}: this command never owns a lease, and only its owner may "
            "release it. To break someone else's lease in an emergency, add --force.",
            EXIT_REFUSED,
        )
    if arguments.command in ("inspect", "release"):
        try:
            validation.lock_name(arguments.name)
        except (TypeError, ValueError) as error:
            raise UserError(f"invalid lock name: {error}", EXIT_USAGE) from None
    if arguments.command == "list":
        if arguments.limit is not None and arguments.limit < 1:
            raise UserError(f"--limit must be at least 1, got {arguments.limit}", EXIT_USAGE)
        if arguments.after is not None and not arguments.after:
            raise UserError("--after must name a lock (the last one of the page before)", EXIT_USAGE)
    client = connect(arguments.uri)
    try:
        collection = await _lock_collection(client, arguments)
        if arguments.command == "list":
            return await _list(collection, arguments)
        if arguments.command == "inspect":
            report = (await _info_of(collection, arguments.name)).report
            if arguments.json:
                view.print_json(view.as_dict(report))
            else:
                view.print_detail(report)
            return 0
        return await _force_release(collection, arguments)
    except PyMongoError as error:
        raise await explain(error, arguments.uri, client) from None
    finally:
        await client.close()


async def _lock_collection(client: AsyncMongoClient[dict[str, Any]], arguments: argparse.Namespace) -> Any:
    """The lock collection the arguments name, or a ``UserError`` (exit 4) if it does not exist."""
    collection = client[arguments.db][arguments.collection]
    if not await store_for(collection, WriteConcern(w="majority")).collection_exists():
        raise UserError(
            f"no collection {arguments.db}.{arguments.collection} (check --db and --collection)", EXIT_MISSING
        )
    return collection


async def _info_of(collection: AsyncCollection, name: str) -> LockInfo:
    info = await operations.inspect_lock(collection, name)
    if info is None:
        raise UserError(f"no lock named {name!r} in {collection.full_name}", EXIT_MISSING)
    return info


async def _list(collection: AsyncCollection, arguments: argparse.Namespace) -> int:
    """The listing, read a batch at a time and printed as it comes (a table a chunk of rows at a
    time, or a JSON array an element at a time): its memory does not grow with the collection.
    With ``--limit``, one more lock is read to tell whether there is a next page."""
    locks = operations.iterate_locks(
        collection, prefix=arguments.prefix or None, held=arguments.held, after=arguments.after,
        limit=None if arguments.limit is None else arguments.limit + 1,
    )  # fmt: skip
    shown: list[LockReport] = []
    last = None
    async with contextlib.aclosing(locks):
        printer = view.JsonArray() if arguments.json else view.StreamedTable()
        async for info in locks:
            if arguments.limit is not None and len(shown) + printer.count >= arguments.limit:
                print(f"mongolock: more: --after {shell_word(last or '')}", file=sys.stderr)
                break
            shown.append(info.report)
            last = info.name
            if len(shown) >= view.CHUNK:
                printer.add(shown)
                shown = []
        printer.add(shown)
        count = printer.finish()
    if not count and not arguments.json:
        held = " held" if arguments.held else ""
        print(printable(f"no locks{held}" + (f" named {arguments.prefix}*" if arguments.prefix else "")))
    return 0


def _view_options(arguments: argparse.Namespace) -> None:
    try:
        validation.seconds(arguments.poll_interval, "--poll-interval", minimum=0.05)
    except (TypeError, ValueError) as error:
        raise UserError(str(error), EXIT_USAGE) from None


@contextlib.contextmanager
def _stopped_by_signals(stop: Callable[[], None]) -> Iterator[None]:
    """Ctrl-C and SIGTERM call ``stop`` (and end the command with exit 0) while inside."""
    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signal_number, stop)
    try:
        yield
    finally:
        for signal_number in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signal_number)


async def _watch(arguments: argparse.Namespace) -> int:
    from ..admin.live import LockWatch
    from . import watch_view

    _view_options(arguments)
    screen = not (arguments.json or arguments.plain) and sys.stdout.isatty() and _rich_installed()
    client = connect(arguments.uri)
    stop = asyncio.Event()
    try:
        with _stopped_by_signals(stop.set):
            collection = await _lock_collection(client, arguments)
            async with LockWatch(
                collection, prefix=arguments.prefix, poll_interval=arguments.poll_interval
            ) as watch:
                if screen:
                    await watch_view.show_screen(watch, stop, held_only=arguments.held)
                else:
                    view.utf8_stdout()

                    def write(line: str) -> None:
                        print(line, flush=True)

                    await watch_view.show_lines(watch, stop, as_json=arguments.json, write=write)
        return 0
    except PyMongoError as error:
        raise await explain(error, arguments.uri, client) from None
    finally:
        await client.close()


def _rich_installed() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


async def _dashboard(arguments: argparse.Namespace) -> int:
    try:
        import uvicorn
    except ImportError:
        raise UserError(
            "mongolock dashboard needs uvicorn: install the dashboard extra (from a checkout: "
            "pip install '.[dashboard]')",
            EXIT_USAGE,
        ) from None
    from ..admin.dashboard import Dashboard

    _view_options(arguments)
    # The page's releases (and refusals) are the audit record an operator reads: on stderr, with
    # the time, where ``mongolock release --force`` prints what it broke as its own output instead.
    audit = logging.StreamHandler(sys.stderr)
    audit.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("mongolock_async.audit").addHandler(audit)
    logging.getLogger("mongolock_async.dashboard").addHandler(audit)
    secret = None if arguments.secret_file is None else _dashboard_secret(arguments.secret_file)
    hosts = [*LOOPBACK_HOSTS, *arguments.allow_host]
    if arguments.host not in ("0.0.0.0", "::", ""):  # a wildcard address is no name a request uses
        hosts.append(arguments.host)
    if arguments.allow_release and not is_loopback(arguments.host):
        print(
            f"mongolock: warning: --allow-release on --host {printable(arguments.host)}: anyone who can reach this "
            "port can load the page and break leases; serve it behind a proxy with authentication (docs: Watching "
            "locks live, Behind a proxy)",
            file=sys.stderr,
            flush=True,
        )
    client = connect(arguments.uri)
    try:
        collection = await _lock_collection(client, arguments)
        try:
            dashboard = Dashboard(
                collection,
                prefix=arguments.prefix,
                allow_release=arguments.allow_release,
                title=arguments.title,
                poll_interval=arguments.poll_interval,
                allowed_hosts=hosts,
                release_secret=secret,
            )
        except (TypeError, ValueError) as error:
            raise UserError(str(error), EXIT_USAGE) from None
        config = uvicorn.Config(
            dashboard, host=arguments.host, port=arguments.port, log_level="warning", lifespan="on",
            timeout_graceful_shutdown=3,
        )  # fmt: skip
        server = _server_class()(config)

        def stop() -> None:
            server.should_exit = True
            dashboard.close_pages()  # the server waits for open responses: the pages' event streams

        with _stopped_by_signals(stop):
            serving = asyncio.ensure_future(server.serve())
            while not server.started and not serving.done():  # noqa: ASYNC110 - uvicorn has no event for it
                await asyncio.sleep(0.05)
            if server.started:
                host, port = server.servers[0].sockets[0].getsockname()[:2]
                shown = f"[{host}]" if ":" in host else host
                mode = "release allowed (--allow-release)" if arguments.allow_release else "read-only"
                print(f"mongolock: dashboard of {collection.full_name} at http://{shown}:{port}/ ({mode}); "
                      "stop with Ctrl-C", flush=True)  # fmt: skip
            await serving
        if not server.started:
            where = f"{arguments.host}:{arguments.port}"
            raise UserError(f"could not listen on {where} (in use? try --port 0)", EXIT_FAILED)
        return 0
    except PyMongoError as error:
        raise await explain(error, arguments.uri, client) from None
    finally:
        await client.close()


def _dashboard_secret(path: str) -> str:
    """The secret in ``path``; a new random one written there first if the file does not exist
    (readable by its owner only, and never replaced: several processes starting at once agree)."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    except OSError as error:
        raise UserError(f"cannot create --secret-file {path}: {error.strerror}", EXIT_USAGE) from None
    else:
        with os.fdopen(descriptor, "w") as created:
            created.write(secrets.token_urlsafe(32) + "\n")
    try:
        with open(path, encoding="utf-8") as file:
            secret = file.read().strip()
    except OSError as error:
        raise UserError(f"cannot read --secret-file {path}: {error.strerror}", EXIT_USAGE) from None
    if len(secret) < MIN_SECRET_LENGTH:
        raise UserError(f"--secret-file {path} holds fewer than {MIN_SECRET_LENGTH} characters", EXIT_USAGE)
    return secret


def _operator() -> str:
    """Who runs this command, for the log of a forced release: user and machine."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name for this uid (some containers)
        user = f"uid {os.getuid()}"
    return f"mongolock release --force ({user} on {socket.gethostname()})"


async def _force_release(collection: AsyncCollection, arguments: argparse.Namespace) -> int:
    """Break the leases shown, after confirmation: each named by its owner token, broken only if it
    is still that lease when the write lands (a lease that ended or changed hands meanwhile is left
    alone, and said so). Without ``--holder``, every live holder shown; an unreadable document is
    repaired instead. With ``--json``, prints ``{"name", "released", "broken", "ended"}``:
    ``broken`` is the broken lease (owner, holder, fencing token) or null, for a semaphore,
    read-write lock or election a list of the broken permits; ``ended``, the owner tokens shown
    whose leases had ended by the time of the release."""
    report = (await _info_of(collection, arguments.name)).report
    state = report.state
    permits = state is not None and state.limit is not None
    if state is not None and report.remaining_ms is None:
        _release_output(arguments, f"{arguments.name!r} is {view.state_of(report)}; nothing to release.", [], [])
        return 0
    live = _live_leases(report)
    chosen = live if arguments.holder is None else [_select_holder(report, live, arguments.holder)]
    if not arguments.json:
        _say_what_breaks(report, chosen)
        view.print_detail(report)
    if not arguments.yes:
        if arguments.json or not sys.stdin.isatty():
            raise UserError("cannot ask for confirmation here (not a terminal, or --json): add --yes", EXIT_FAILED)
        answer = await asyncio.to_thread(input, "Release it? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("Left as it was.")
            return EXIT_FAILED
    if state is None:
        repaired = await operations.force_release(collection, arguments.name, by=_operator())
        said = (
            f"Repaired {arguments.name!r}: its lock fields were reset."
            if repaired is not None
            else f"{arguments.name!r} needed no repair by the time of the release; nothing was changed."
        )
        _release_output(arguments, said, [] if repaired is None else [_lease_of(repaired)], [])
        return 0
    broken: list[tuple[str, Mapping[str, Any], int | None]] = []
    ended: list[str] = []
    for owner, _, _ in chosen:
        try:
            result = await operations.force_release(collection, arguments.name, holder=owner, by=_operator())
        except LookupError:  # it ended between the two reads of the store's own selection
            result = None
        if result is None:
            ended.append(owner)
        else:
            broken.extend(result.permits or [(result.owner or owner, result.holder, result.fencing_token)])
    _release_output(arguments, _released_text(arguments.name, state.kind, broken, ended), broken, ended, permits)
    return 0


Lease = tuple[str, Mapping[str, Any], "int | None"]
"""A lease as ``release --force`` names it: owner token, holder, fencing token."""


def _live_leases(report: LockReport) -> list[Lease]:
    """The live leases of ``report``: a lock's one, or a semaphore's, read-write lock's or
    election's permits."""
    state = report.state
    if state is None or report.remaining_ms is None:
        return []
    if state.limit is None:
        return [(state.owner, state.holder, state.fencing_token)] if state.owner else []
    return [(permit.token, permit.holder, permit.fencing_token) for permit in report.live_permits]


def _lease_of(broken: ForcedRelease) -> Lease:
    return (broken.owner or "", broken.holder, broken.fencing_token)


def _say_what_breaks(report: LockReport, chosen: Sequence[Lease]) -> None:
    state = report.state
    if state is None:
        view.say("About to repair this unreadable lock document (its lock fields are reset):")
        return
    what = {"election": "depose the leader", "rwlock": "break the permit", "semaphore": "break the permit"}
    doing = what.get(state.kind, "break the lease")
    of = {"rwlock": " of this read-write lock", "semaphore": " of this semaphore"}.get(state.kind, "")
    for owner, holder, token in chosen:
        view.say(f"About to {doing} of {view.holder_text(holder) or 'an unlabelled holder'}{of}")
        view.say(f"  owner {owner}, fencing token {token}: only this lease is broken, if it is still live")


def _released_text(name: str, kind: str, broken: Sequence[Lease], ended: Sequence[str]) -> str:
    """What ``release --force`` did, in words."""
    parts = []
    who = ", ".join(
        f"{view.holder_text(holder) or 'an unlabelled holder'} (fencing token {token}, owner {owner})"
        for owner, holder, token in broken
    )
    if broken and kind == "election":
        parts.append(
            f"Deposed the leader of {name!r}: {who}. The next candidate leads from its next attempt; the deposed "
            "leader stops at its own deadline; fence your resources."
        )
    elif broken and kind in ("lock", "job"):
        parts.append(
            f"Released {name!r}: broke the lease of {who}. Its holder still believes it holds the lock until its "
            "own deadline; fence your resources."
        )
    elif broken:
        parts.append(
            f"Released {len(broken)} permit(s) of {name!r}: {who}. Their holders still believe they hold them "
            "until their own deadlines; fence your resources."
        )
    if ended:
        shown = ", ".join(ended)
        parts.append(
            f"The lease{'s' if len(ended) > 1 else ''} of owner {shown} had ended or changed hands by the time of "
            "the release: not broken (whoever holds it now was left alone)."
        )
    return " ".join(parts)


def _release_output(
    arguments: argparse.Namespace, said: str, broken: Sequence[Lease], ended: Sequence[str], permits: bool = False
) -> None:
    if not arguments.json:
        view.say(said)
        return
    leases = [{"owner": owner, "holder": dict(holder), "fencing_token": token} for owner, holder, token in broken]
    shown: Any = leases if permits else (leases[0] if leases else None)
    view.print_json({"name": arguments.name, "released": bool(broken), "broken": shown, "ended": list(ended)})


def _select_holder(report: LockReport, live: Sequence[Lease], holder: str) -> Lease:
    """The one live lease of ``report`` that ``holder`` selects (its whole owner token, or the only
    token that starts with it), as ``LockStore.force_release`` selects it; else a ``UserError``
    listing the candidates, before anything is asked or broken."""
    if not holder:
        raise UserError("--holder must not be empty (leave it out to break every holder shown)", EXIT_USAGE)
    # An exact token always selects its holder, even if another token starts with it.
    matches = [lease for lease in live if lease[0] == holder]
    matches = matches or [lease for lease in live if lease[0].startswith(holder)]
    if len(matches) == 1:
        return matches[0]

    def listing(leases: Sequence[Lease]) -> str:
        return "; ".join(f"{owner} ({view.holder_text(who) or 'unlabelled'})" for owner, who, _ in leases)

    if not matches:
        raise UserError(
            f"no live holder of {report.name!r} has an owner token starting with {holder!r}; its live holders: "
            f"{listing(live) or 'none'}",
            EXIT_MISSING,
        )
    raise UserError(
        f"--holder {holder!r} matches {len(matches)} holders of {report.name!r}: {listing(matches)}; "
        "give the whole owner token of the one to break",
        EXIT_USAGE,
    )
