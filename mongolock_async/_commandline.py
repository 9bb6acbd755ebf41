"""What the ``mongolock`` commands share: exit codes, user errors, and handling of MongoDB URIs that
never shows a credential."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote_plus

from pymongo import AsyncMongoClient
from pymongo.errors import ConfigurationError, InvalidURI
from pymongo.uri_parser import parse_userinfo, split_hosts, split_options

EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_MISSING, EXIT_REFUSED, EXIT_UNAUTHORIZED = 1, 2, 3, 4, 5, 6
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
    :data:`DEFAULT_SERVER_SELECTION_MS`, unless the URI says otherwise."""
    _, _, query = uri.partition("?")
    try:
        options = split_options(query, validate=False, warn=False, normalize=False) if query else {}
    except (InvalidURI, ConfigurationError, ValueError):
        options = {}
    keys = {key.lower() for key in options}
    defaults: dict[str, Any] = {}
    if "serverselectiontimeoutms" not in keys:
        defaults["serverSelectionTimeoutMS"] = DEFAULT_SERVER_SELECTION_MS
    if "connecttimeoutms" not in keys:
        defaults["connectTimeoutMS"] = DEFAULT_SERVER_SELECTION_MS
    return defaults


def connect(uri: str | None) -> AsyncMongoClient[dict[str, Any]]:
    """A client for ``uri``, or a :class:`UserError` that never quotes a credential."""
    if not uri:
        raise UserError("no MongoDB URI: pass --uri or set MONGODB_URI", EXIT_USAGE)
    if not uri.startswith(_SCHEMES):
        raise UserError(f"invalid MongoDB URI {redact_uri(uri)}", EXIT_UNREACHABLE)
    try:
        return AsyncMongoClient(uri, **client_options(uri))
    except (ConfigurationError, ValueError) as error:
        # The driver's message may quote the URI, credentials included: say only what is safe.
        reason = "its mongodb+srv host does not resolve" if "DNS" in str(error) else "the driver rejects it"
        raise UserError(f"invalid MongoDB URI {redact_uri(uri)}: {reason}", EXIT_UNREACHABLE) from None
