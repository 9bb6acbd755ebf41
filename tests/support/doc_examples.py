"""The ```python blocks of README.md and docs/: found here for tests/unit/test_docs.py, which runs them,
and written out as modules for ``make lint``, which type-checks them with ``mypy --strict``.

    python tests/support/doc_examples.py DIRECTORY
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
FILE_NAME = re.compile(r"# file: ([\w.]+\.py)\n")


def python_blocks(page: Path) -> list[str]:
    """The page's Python examples, in order."""
    return BLOCK.findall(page.read_text())


def file_name(block: str) -> str | None:
    """``NAME.py`` for a block that starts with ``# file: NAME.py`` (a module later blocks import)."""
    named = FILE_NAME.match(block)
    return named.group(1) if named else None


def module_stem(page: Path) -> str:
    """``docs/reference/jobs.md`` as ``reference_jobs``: unique among the pages."""
    parts = page.relative_to(ROOT).with_suffix("").parts
    return "_".join(parts[1:] if parts[0] == "docs" else parts).lower().replace("-", "_")


def write_modules(directory: Path) -> list[Path]:
    """Every example as a module in ``directory``: named ones under their name, the others as
    ``<page>_<number>.py``."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for page in PAGES:
        for number, block in enumerate(python_blocks(page), start=1):
            path = directory / (file_name(block) or f"{module_stem(page)}_{number}.py")
            path.write_text(block)
            written.append(path)
    return written


if __name__ == "__main__":
    print(f"{len(write_modules(Path(sys.argv[1])))} examples written to {sys.argv[1]}")
