"""MkDocs hooks: the site's header names the version, read from the package (written once, in
mongolock_async/_version.py), and Mermaid diagrams are shown as their source.

Drawing a diagram would take mermaid.js, which Material for MkDocs fetches from a CDN when a page
has one; the site is built and read without it, so each ```mermaid block is shown as source, after
a sentence that says so (Markdown viewers that support Mermaid draw the same blocks in the files)."""

from __future__ import annotations

import re
from typing import Any

from mongolock_async import __version__

_MERMAID = re.compile(r"^```mermaid\n", re.MULTILINE)
_SAID = (
    "*Mermaid source of a diagram: Markdown viewers that support Mermaid (GitHub's among them) draw it; "
    "this site shows the source, so that it loads no script from elsewhere.*\n\n```text\n"
)


def on_config(config: Any) -> Any:
    config["site_name"] = f"mongolock-async {__version__}"
    return config


def on_page_markdown(markdown: str, **_: Any) -> str:
    return _MERMAID.sub(lambda _match: _SAID, markdown)
