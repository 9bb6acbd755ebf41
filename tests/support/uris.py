"""MongoDB URIs built with a parser: options added, credentials taken out."""

from __future__ import annotations

import urllib.parse


def uri_with_options(uri: str, **options: str) -> str:
    """``uri`` with ``options`` set in its query string, parsed rather than appended to: a URI
    without a query string (``mongodb://host/``) would otherwise turn ``&option=...`` into the
    name of its default database."""
    scheme, _, rest = uri.partition("://")
    hosts, _, tail = rest.partition("/")  # the host list ends at the first "/" (MongoDB's URI format)
    database, _, query = tail.partition("?")
    pairs = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
    pairs.update(options)
    encoded = urllib.parse.urlencode(pairs, quote_via=urllib.parse.quote, safe=":,")
    return f"{scheme}://{hosts}/{database}?{encoded}"


def uri_without_credentials(uri: str) -> str:
    """``uri`` without its user, password and the options that go with them (authSource,
    authMechanism): the same servers, reached without authenticating."""
    scheme, _, rest = uri.partition("://")
    authority, _, tail = rest.partition("/")
    database, _, query = tail.partition("?")
    pairs = {
        key: value
        for key, value in urllib.parse.parse_qsl(query, keep_blank_values=True)
        if key not in ("authSource", "authMechanism", "authMechanismProperties")
    }
    encoded = urllib.parse.urlencode(pairs, quote_via=urllib.parse.quote, safe=":,")
    return f"{scheme}://{authority.rpartition('@')[2]}/{database}" + (f"?{encoded}" if encoded else "")
