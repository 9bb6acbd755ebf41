"""Other applications' text, made inert wherever a person reads it.

Lock names, labels, host names, job errors and the driver's messages are written by someone else.
Shown raw, ``orders\\x1b[2J`` clears an operator's screen, a C1 ``\\x9b`` starts an escape
sequence on terminals that read C1 controls, and a bidi override (U+202E) shows ``exe.txt`` for
``txt.exe``. This module has the one printable form every human-facing output uses (the command's
tables and details, ``watch``, ``check``, the dashboard's page mirrors it in its script), JSON that
keeps the text exact while sending none of those characters raw, and a shell word that pastes as
the one argument it names.
"""

from __future__ import annotations

import json
import shlex
from typing import Any


def _escaped(character: str) -> str:
    # unicode_escape writes \n, \t, \x1b, \x9b, \u202e, \U000e0001: printable, and short.
    return character.encode("unicode_escape", "backslashreplace").decode("ascii")


def printable(text: str) -> str:
    """``text`` with every character that is not printable written as its escape (``\\n``,
    ``\\x1b``, ``\\x9b``, ``\\u202e``); everything else as it is. Idempotent: an escape is
    printable, so text made printable once is left alone (each output can apply it to whole
    lines)."""
    if text.isprintable():  # nearly always: one pass in C
        return text
    return "".join(character if character.isprintable() else _escaped(character) for character in text)


def _json_escaped(character: str) -> str:
    code = ord(character)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # a UTF-16 surrogate pair, as JSON writes characters beyond the BMP
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def json_text(payload: Any, *, indent: int | None = None) -> str:
    """``payload`` as JSON, non-ASCII text as it is, except that every character that is not
    printable is written as a ``\\uXXXX`` escape: the parsed value is exact, and the bytes reach a
    terminal or a log inert. (``json.dumps`` already escapes C0 controls; this adds DEL, C1
    controls, bidi overrides and the rest that ``printable`` escapes. The only one outside
    strings is the newline of ``indent``, kept.)"""
    text = json.dumps(payload, ensure_ascii=False, indent=indent)
    return "\n".join(
        line if line.isprintable() else "".join(c if c.isprintable() else _json_escaped(c) for c in line)
        for line in text.split("\n")
    )


def shell_word(text: str) -> str:
    """``text`` as one word of a POSIX shell command line that is also safe to show: single-quoted
    by ``shlex.quote`` when it is printable; else in bash's (and zsh's) ``$'...'`` quoting,
    each byte of a character that is not printable written as ``\\xHH`` (UTF-8), so that nothing
    unprintable reaches the terminal and the shell still passes the exact text."""
    if text.isprintable():
        return shlex.quote(text)
    quoted = []
    for character in text:
        if character in "\\'":
            quoted.append("\\" + character)
        elif character.isprintable():
            quoted.append(character)
        else:
            quoted.extend(f"\\x{byte:02x}" for byte in character.encode("utf-8", "surrogatepass"))
    return "$'" + "".join(quoted) + "'"
