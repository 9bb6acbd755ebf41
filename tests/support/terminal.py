"""The command as a person runs it, on a terminal."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys

from tests.support.run_settings import child_environment

_COLOURS = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def on_a_terminal(
    arguments: list[str], *, columns: int = 200, term: str = "xterm-256color", without_rich: bool = False
) -> bytes:
    """What ``mongolock ARGUMENTS`` writes to a pseudo-terminal ``columns`` wide (rich draws its
    tables there), raw; ``without_rich`` runs it as if rich were not installed. The command must
    succeed."""
    prelude = "import sys; sys.modules['rich'] = None; " if without_rich else ""  # `import rich` fails
    code = prelude + "from mongolock_async._cli.main import main; main()"  # what `python -m mongolock_async` runs
    controller, terminal = os.openpty()
    try:
        process = subprocess.run(
            [sys.executable, "-c", code, *arguments], stdout=terminal, stderr=terminal,
            env=child_environment(COLUMNS=str(columns), TERM=term), timeout=60,
        )  # fmt: skip
        os.close(terminal)
        output = b""
        with contextlib.suppress(OSError):
            while chunk := os.read(controller, 65536):
                output += chunk
    finally:
        os.close(controller)
    assert process.returncode == 0, output.decode(errors="replace")
    return output


def lines_on_a_terminal(arguments: list[str], *, columns: int, without_rich: bool = False) -> list[str]:
    """The lines ``on_a_terminal`` shows (a plain ``xterm``), colours removed, blank lines left out."""
    output = on_a_terminal(arguments, columns=columns, term="xterm", without_rich=without_rich)
    text = _COLOURS.sub("", output.decode())
    return [line.rstrip() for line in text.splitlines() if line.strip()]
