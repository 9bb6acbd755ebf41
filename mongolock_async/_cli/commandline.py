"""What the ``mongolock`` commands share: exit codes, user errors, and handling of MongoDB URIs that
never shows a credential."""

from __future__ import annotations

import asyncio
import re
from typing import Any
from urllib.parse import quote_plus

from pymongo import AsyncMongoClient, monitoring
from pymongo.errors import ConfigurationError, ConnectionFailure, InvalidURI, OperationFailure, PyMongoError
from pymongo.uri_parser import parse_userinfo, split_hosts, split_options

from .._util.collection_types import AsyncClient
from .._util.diagnosis import cause_of
from .._util.shield import wait_for_event
from .._util.weak import WeakIdentityMap

EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_MISSING, EXIT_REFUSED, EXIT_UNAUTHORIZED = 1, 2, 3, 4, 5, 6
VERDICT_WAIT = 3.0
"""Seconds a failed command waits for the driver's monitoring to say why a server is unreachable."""
_AUTHENTICATION_FAILED = 18
DEFAULT_SERVER_SELECTION_MS = 5_000
_SCHEMES = ("mongodb://", "mongodb+srv://")
# URI options whose values are secrets, by their lowercased names (authMechanismProperties can hold
# an AWS session token; the others are passwords).
_SECRET_OPTIONS = ("password", "passphrase", "secret", "token", "authmechanismproperties")


class UserError(Exception):
    """An error the user can fix; printed as one line, without a traceback."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def redact_uri(uri: str) -> str:
    """``uri`` as it is safe to print: the password and every secret-valued option replaced by
    ``***``. Parsed with the driver's own URI parsing (without resolving ``mongodb+srv`` hosts); a
    string that is not a MongoDB URI is not echoed at all."""
    scheme = next((scheme for scheme in _SCHEMES if uri.startswith(scheme)), None)
    if scheme is None:
        return "<not a MongoDB URI: it must start with mongodb:// or mongodb+srv://>"
    rest = uri[len(scheme) :]
    netloc, slash, path = rest.partition("/")
    if not slash:
        netloc, question, options = rest.partition("?")
        path = f"?{options}" if question else ""
    userinfo, at, hosts = netloc.rpartition("@")
    try:
        split_hosts(hosts, default_port=None)
        user = parse_userinfo(userinfo)[0] if at else ""
        database, question, options = path.partition("?")
        if options:
            split_options(options, validate=False, warn=False, normalize=False)  # raises if malformed
    except (InvalidURI, ConfigurationError, ValueError):
        return f"<an invalid {scheme}... URI, not shown>"
    # Shown as written (the parser lowercases names), with every secret value hidden.
    pairs = [pair.partition("=") for pair in re.split("[&;]", options) if pair]
    shown_options = "&".join(
        f"{key}={'***' if any(word in key.lower() for word in _SECRET_OPTIONS) else value}" for key, _, value in pairs
    )
    credentials = f"{quote_plus(user)}{':***' if ':' in userinfo else ''}@" if at else ""
    return f"{scheme}{credentials}{hosts}/{database}{'?' + shown_options if question else ''}"


def client_options(uri: str) -> dict[str, Any]:
    """Options for a command's client: give up on an unreachable server after
    ``DEFAULT_SERVER_SELECTION_MS``, unless the URI says otherwise."""
    keys = {key.lower() for key in _uri_options(uri)}
    defaults: dict[str, Any] = {}
    if "serverselectiontimeoutms" not in keys:
        defaults["serverSelectionTimeoutMS"] = DEFAULT_SERVER_SELECTION_MS
    if "connecttimeoutms" not in keys:
        defaults["connectTimeoutMS"] = DEFAULT_SERVER_SELECTION_MS
    return defaults


class _HeartbeatFailures(monitoring.ServerHeartbeatListener):
    """What the driver's monitoring ran into while connecting: often more specific than the error
    an operation ends with (a TLS alert, where the operation saw only a closed connection)."""

    def __init__(self) -> None:
        self.errors: list[Exception] = []
        self.any = asyncio.Event()

    def started(self, event: monitoring.ServerHeartbeatStartedEvent) -> None:
        pass

    def succeeded(self, event: monitoring.ServerHeartbeatSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.ServerHeartbeatFailedEvent) -> None:
        if len(self.errors) < 20:
            self.errors.append(event.reply)
        self.any.set()


_failures: WeakIdentityMap[Any, _HeartbeatFailures] = WeakIdentityMap()


def _uri_options(uri: str) -> dict[str, Any]:
    """The options written in ``uri``, as written (an unparsable query gives none)."""
    _, _, query = uri.partition("?")
    try:
        return dict(split_options(query, validate=False, warn=False, normalize=False)) if query else {}
    except (InvalidURI, ConfigurationError, ValueError):
        return {}


def connect(uri: str | None, **options: Any) -> AsyncMongoClient[dict[str, Any]]:
    """A client for ``uri`` (with the client ``options`` given, such as ``server_api``), or a
    ``UserError`` that never quotes a credential."""
    if not uri:
        raise UserError("no MongoDB URI: pass --uri or set MONGODB_URI", EXIT_USAGE)
    if not uri.startswith(_SCHEMES):
        raise UserError(f"invalid MongoDB URI {redact_uri(uri)}", EXIT_UNREACHABLE)
    failures = _HeartbeatFailures()
    try:
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            uri, event_listeners=[failures], **{**client_options(uri), **options}
        )
    except (ConfigurationError, ValueError) as error:
        # The driver's message may quote the URI, credentials included: say only what is safe.
        reason = "its mongodb+srv host does not resolve" if "DNS" in str(error) else "the driver rejects it"
        raise UserError(f"invalid MongoDB URI {redact_uri(uri)}: {reason}", EXIT_UNREACHABLE) from None
    _failures.setdefault(client, lambda: failures)
    return client


async def explain(error: PyMongoError, uri: str, client: AsyncClient) -> UserError:
    """The one line (and exit code) for a driver error a command ended with; never a credential.

    When the driver gave up on a server before its monitoring had a verdict (a slow TLS handshake
    on a loaded machine), this waits up to ``VERDICT_WAIT`` seconds for one, so the line can
    say why the server could not be reached, not only that it could not."""
    if isinstance(error, OperationFailure) and error.code == _AUTHENTICATION_FAILED:
        return UserError(f"MongoDB rejected the credentials of {redact_uri(uri)}", EXIT_UNAUTHORIZED)
    if isinstance(error, ConnectionFailure | ConfigurationError):
        seen = _failures.get(client)
        if isinstance(error, ConnectionFailure) and seen is not None:
            await wait_for_event(seen.any, VERDICT_WAIT)
        servers = client.topology_description.server_descriptions()
        # A mongodb+srv seed that never resolved is the SRV name itself, with no port (None).
        hosts = ", ".join(host if port is None else f"{host}:{port}" for host, port in servers)
        latest = [server.error for server in servers.values()]
        cause = cause_of(error, *(seen.errors if seen is not None else ()), *(e for e in latest if e is not None))
        where = f"{hosts or 'its hosts'} (URI {redact_uri(uri)})"
        return UserError(f"cannot reach MongoDB at {where}: {cause}", EXIT_UNREACHABLE)
    if isinstance(error, OperationFailure):
        return UserError(f"MongoDB refused the command: {(error.details or {}).get('errmsg', error.code)}", EXIT_FAILED)
    return UserError(f"MongoDB failed: {type(error).__name__}: {cause_of(error)}", EXIT_FAILED)
