"""What a driver error says about reaching MongoDB, in words a user can act on.

The driver reports most ways of not reaching a server the same way: a ``ServerSelectionTimeoutError``
(or an ``AutoReconnect``) whose message carries what the last attempt to connect ran into. Some of
those are outages that may pass (a refused connection, a timeout, an election); others are
configuration that retrying cannot fix (a certificate that does not verify, a client certificate
the server wants, rejected credentials, a missing authentication extra).
"""

from __future__ import annotations

import re

from pymongo.errors import ConfigurationError, ConnectionFailure, OperationFailure

_AUTHENTICATION_FAILED = 18

# (pattern in the driver's message, what it means, whether retrying can fix it), most specific first.
_CAUSES: tuple[tuple[re.Pattern[str], str, bool], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), meaning, passes)
    for pattern, meaning, passes in (
        (r"certificate verify failed:? ?([^(\]]*)", "the server's TLS certificate did not verify ({})", False),
        (r"certificate required", "the server requires a TLS client certificate, and none was presented", False),
        (r"unknown ca|bad certificate|certificate unknown", "the server refused the client's TLS certificate", False),
        (r"wrong version number|unsupported protocol", "the TLS handshake failed: does the server speak TLS?", False),
        (r"hostname .* doesn't match|IP address mismatch", "the server's TLS certificate is for another host", False),
        (r"\[SSL[^\]]*\] ?([^(]*)", "the TLS handshake failed ({})", False),
        (
            r"EOF occurred in violation of protocol",
            "the server ended the TLS connection abruptly (as one that requires a client certificate does)",
            True,
        ),
        (r"connection refused|connect call failed", "connection refused: nothing listens at that address", True),
        (
            r"name or service not known|nodename nor servname|getaddrinfo failed|temporary failure in name resolution"
            r"|no address associated",
            "the host name does not resolve (DNS)",
            True,
        ),
        (
            r"connection is already closed|connection reset|connection closed",
            "the server closed the connection (as one does that requires a TLS client certificate the client "
            "lacks, or that is shutting down)",
            True,
        ),
        (r"timed out", "no answer in time", True),
        (r"no servers found yet|no replica set members|no primary", "no server answered", True),
    )
)


def cause_of(*errors: BaseException) -> str:
    """Why the errors happened (the driver's error, and the failures its monitoring saw meanwhile),
    in a few words: the most specific reason any of them gives."""
    for error in errors:
        if isinstance(error, OperationFailure) and error.code == _AUTHENTICATION_FAILED:
            return "MongoDB rejected the credentials (authentication failed)"
        if isinstance(error, ConfigurationError):
            text = str(error)
            if "DNS" in text:
                return "the mongodb+srv host name does not resolve (DNS)"
            return f"the client is misconfigured: {_first_sentence(text)}"
    texts = [_first_sentence(str(error)) for error in errors]
    for pattern, meaning, _ in _CAUSES:
        for text in texts:
            match = pattern.search(text)
            if match:
                detail = match.group(1).strip(" :") if match.groups() else ""
                return meaning.format(detail) if detail else meaning.replace(" ({})", "")
    return next((text for text in texts if text), type(errors[0]).__name__ if errors else "unknown")


def redacted_cause(error: BaseException) -> str:
    """What may be said of ``error`` to someone who is not the operator (a dashboard's viewers):
    its kind and the general reason, as ``cause_of`` words it, without the detail it quotes;
    never a host name, an address, the topology or the server's own message (those belong in the
    operator's log)."""
    kind = type(error).__name__
    if isinstance(error, OperationFailure):
        name = (error.details or {}).get("codeName")
        return f"{kind}: MongoDB refused the request (code {error.code}{f', {name}' if isinstance(name, str) else ''})"
    text = _first_sentence(str(error))
    for pattern, meaning, _ in _CAUSES:
        if pattern.search(text):
            return f"{kind}: {meaning.replace(' ({})', '')}"
    return kind


def retrying_cannot_fix(error: BaseException) -> bool:
    """Whether ``error`` is configuration rather than an outage: rejected credentials, TLS that does
    not verify or lacks a client certificate, or a client the driver refuses to configure."""
    if isinstance(error, OperationFailure) and error.code == _AUTHENTICATION_FAILED:
        return True
    if isinstance(error, ConfigurationError):
        return True
    if isinstance(error, ConnectionFailure):
        text = _first_sentence(str(error))
        for pattern, _, passes in _CAUSES:
            if pattern.search(text):
                return not passes
    return False


def _first_sentence(text: str) -> str:
    """The driver's own words, without the timeouts and topology it appends."""
    return text.split(", Timeout:")[0].split(" (configured timeouts")[0].strip()
