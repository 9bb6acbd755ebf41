"""Who may use a dashboard: the host names it answers for, and the token that proves a release
request came from its own page.

**Host names.** A page of another site can make a browser talk to the dashboard through DNS
rebinding: its name (``rebind.attacker.example``) first resolves to the attacker's server, then to
the dashboard's address, and the page's requests then carry that name as ``Host`` and ``Origin``,
which agree with each other, so the origin check passes and the page can read ``/state.json`` and
release. Answering only for the host names the dashboard is served under (loopback names by
default) stops it: a rebound request still names the attacker's host.

**The release token.** Random per dashboard unless a secret is configured; with one, it is derived
from the secret and the collection's name, so it is the same after a restart and in every worker
process serving the same dashboard (a page loaded from one worker releases through another).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Iterable

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
"""The host names a dashboard answers for unless told otherwise."""
ANY_HOST = "*"
"""In ``allowed_hosts``: every host name (for an application that checks ``Host`` itself, such as
Starlette's ``TrustedHostMiddleware`` or a proxy that does)."""
MIN_SECRET_LENGTH = 16
_TOKEN_PURPOSE = b"mongolock dashboard release token\x00"


def host_names(allowed: Iterable[str]) -> frozenset[str]:
    """``allowed`` checked and normalised (lowercase, no brackets around IPv6, no trailing dot)."""
    if isinstance(allowed, str):
        raise TypeError("allowed_hosts must be a list of host names, not one str")
    names = set()
    for name in allowed:
        if not isinstance(name, str):
            raise TypeError(f"allowed_hosts must hold host names (str), not {type(name).__name__}")
        if name != ANY_HOST and not (_is_ipv6(name) or (name and not any(c in name for c in ":/@ []"))):
            raise ValueError(f"allowed_hosts holds {name!r}: expected a host name or an address, without a port")
        names.add(_normalised(name))
    if not names:
        raise ValueError("allowed_hosts is empty: the dashboard would answer no request")
    return frozenset(names)


def host_allowed(header: str | None, allowed: frozenset[str]) -> bool:
    """Whether a request's ``Host`` header (``name``, ``name:port``, ``[v6]:port``) names one of
    ``allowed``. A request without one is refused (HTTP/1.1 requires it)."""
    if ANY_HOST in allowed:
        return True
    if not header:
        return False
    name = header.strip()
    if name.startswith("["):
        name = name[1 : name.find("]")] if "]" in name else ""
    elif name.count(":") == 1:
        name = name.rsplit(":", 1)[0]
    return _normalised(name) in allowed


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a listening address or name) is reachable only from this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def release_token(secret: str | None, collection: str) -> str:
    """The token the page sends with a release: random without ``secret``; with it,
    HMAC-SHA256(secret, collection), the same in every process that shares the secret."""
    if secret is None:
        return secrets.token_urlsafe(32)
    if not isinstance(secret, str):
        raise TypeError(f"release_secret must be a str or None, not {type(secret).__name__}")
    if len(secret) < MIN_SECRET_LENGTH:
        raise ValueError(f"release_secret must be at least {MIN_SECRET_LENGTH} characters (a random one)")
    digest = hmac.new(secret.encode("utf-8"), _TOKEN_PURPOSE + collection.encode("utf-8"), hashlib.sha256)
    return digest.hexdigest()


def token_matches(sent: str, token: str) -> bool:
    """Whether the token a request sent is ``token``, in constant time. Compared as bytes: the
    header may hold any characters (``hmac.compare_digest`` refuses non-ASCII ``str``)."""
    return hmac.compare_digest(sent.encode("utf-8", "surrogateescape"), token.encode("ascii"))


def _normalised(name: str) -> str:
    return name.strip().strip("[]").rstrip(".").lower()


def _is_ipv6(name: str) -> bool:
    try:
        ipaddress.IPv6Address(name.strip("[]"))
    except ValueError:
        return False
    return True
