"""MkDocs hooks: the site's header names the version, read from the package (written once, in
mongolock_async/_version.py); Mermaid diagrams are shown as their source; the repository's
CHANGELOG.md and CONTRIBUTING.md are included into the pages that name them; and a raw Sphinx role
in a rendered page fails the build.

Drawing a diagram would take mermaid.js, which Material for MkDocs fetches from a CDN when a page
has one; the site is built and read without it, so each ```mermaid block is shown as source, after
a sentence that says so (Markdown viewers that support Mermaid draw the same blocks in the files).

A page whose Markdown is a line ``--8<-- "NAME.md"`` shows the file NAME.md of the repository's
root instead (the syntax of pymdownx.snippets, done here so that links can be fixed): its links
into ``docs/`` are made relative to the page, so the file reads right on GitHub and in the site,
and any other relative link is left for ``--strict`` to refuse.

The API reference is written by mkdocstrings from docstrings in Markdown; a reStructuredText role
(``:func:`name```) is not Markdown and reaches the reader as the text ``:func:`` before the name.
Docstrings link with ``[`name`][identifier]`` instead, which autorefs checks."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

from mongolock_async import __version__

_ROOT = Path(__file__).resolve().parent.parent
_MERMAID = re.compile(r"^```mermaid\n", re.MULTILINE)
_SAID = (
    "*Mermaid source of a diagram: Markdown viewers that support Mermaid (GitHub's among them) draw it; "
    "this site shows the source, so that it loads no script from elsewhere.*\n\n```text\n"
)
_INCLUDE = re.compile(r'\A--8<-- "(?P<name>[A-Z]+\.md)"\n?\Z')
_INTO_DOCS = re.compile(r"\]\(docs/")
# A role written in code, on purpose (as this project's changelog names them), is left alone: code
# blocks go, and inline code keeps its backticks, so that only a role outside code is found. A raw
# role renders as the text ":func:" followed by the name as inline code.
_PRE = re.compile(r"<pre\b.*?</pre>", re.DOTALL)
_INLINE_CODE = re.compile(r"<code\b[^>]*>(.*?)</code>", re.DOTALL)
_TAG = re.compile(r"<[^>]+>")
_ROLE = re.compile(r"(?<!`):(?:py:)?(?:func|meth|class|attr|mod|data|exc|obj|const):")


def on_config(config: Any) -> Any:
    config["site_name"] = f"mongolock-async {__version__}"
    return config


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    included = _INCLUDE.match(markdown)
    if included:
        markdown = included_file(included.group("name"), depth=page.file.src_uri.count("/"))
    return _MERMAID.sub(lambda _match: _SAID, markdown)


def included_file(name: str, depth: int) -> str:
    """The repository's root file ``name``, its links into ``docs/`` made relative to a page
    ``depth`` folders down in the site."""
    path = _ROOT / name
    if not path.is_file():
        raise PluginError(f"a page includes {name}, which is not a file at the repository's root")
    return _INTO_DOCS.sub("](" + "../" * depth, path.read_text(encoding="utf-8"))


def on_page_content(html: str, page: Any, **_: Any) -> str:
    roles = raw_roles(html)
    if roles:
        raise PluginError(
            f"{page.file.src_uri}: raw Sphinx role(s) in the rendered page: {', '.join(roles)}; "
            "docstrings are Markdown: link with [`name`][identifier] or write ``name``"
        )
    return html


def raw_roles(html: str) -> list[str]:
    """Each reStructuredText role that shows as text in ``html`` (outside code), with what follows it."""
    text = _PRE.sub(" ", html)
    text = _TAG.sub("", _INLINE_CODE.sub(lambda code: f"`{code.group(1)}`", text))
    return [" ".join(text[match.start() : match.end() + 40].split()) for match in _ROLE.finditer(text)]
