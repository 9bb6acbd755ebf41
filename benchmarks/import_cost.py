"""What ``import mongolock_async`` costs: its import time, and which modules it loads.

Each tree given (a directory holding a ``mongolock_async`` package: this checkout by default, and
for a comparison an older one, e.g. ``git archive <commit> mongolock_async | tar -x -C /tmp/old``)
is imported in fresh interpreters, in turn, ``--runs`` times: ``python -S -X importtime`` (run from /) with only
that tree and this virtualenv's site-packages on the path, so that the editable install does not
decide which tree is imported. Prints, per tree, the median of the whole import (``pymongo``
included) and of the package's own modules' self time, the number of the package's modules
loaded, and which of the operator console's modules (and the web frameworks) were loaded.

    python benchmarks/import_cost.py [--runs 21] [TREE ...]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import sysconfig
from pathlib import Path

from _common import environment

ROOT = Path(__file__).resolve().parent.parent
CONSOLE = ("mongolock_async._cli", "mongolock_async.admin.live", "mongolock_async.admin.dashboard",
           "mongolock_async.admin.operations", "mongolock_async.live", "mongolock_async.dashboard",
           "mongolock_async.operations", "fastapi", "starlette", "uvicorn", "aiohttp", "rich")  # fmt: skip


def import_once(tree: Path) -> tuple[int, int, list[str]]:
    """One import of ``tree``'s package: total and own microseconds, and the modules loaded."""
    path = f"{tree}:{sysconfig.get_paths()['purelib']}"
    result = subprocess.run(
        [sys.executable, "-S", "-X", "importtime", "-c", "import mongolock_async"],
        capture_output=True, text=True, check=True, env={"PYTHONPATH": path}, cwd="/",  # not this checkout
    )  # fmt: skip
    total = own = 0
    loaded = []
    for line in result.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line or "self [us]" in line:
            continue
        self_us, cumulative_us, name = (part.strip() for part in line.removeprefix("import time:").split("|"))
        loaded.append(name)
        if name.startswith("mongolock_async"):
            own += int(self_us)
        if name == "mongolock_async":
            total = int(cumulative_us)
    return total, own, loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs="*", type=Path, default=[ROOT])
    parser.add_argument("--runs", type=int, default=21)
    arguments = parser.parse_args()
    print(environment(None, "no server: imports only"))
    results: dict[Path, list[tuple[int, int, list[str]]]] = {tree: [] for tree in arguments.trees}
    for _ in range(arguments.runs):
        for tree in arguments.trees:  # in turn, so that the machine's load falls on every tree alike
            results[tree].append(import_once(tree))
    for tree, runs in results.items():
        loaded = runs[0][2]
        ours = [name for name in loaded if name.startswith("mongolock_async")]
        console = sorted(name for name in loaded if name in CONSOLE or name.startswith(tuple(f"{c}." for c in CONSOLE)))
        print(f"{tree}: import mongolock_async, median of {len(runs)} runs")
        whole, own = (statistics.median(run[part] for run in runs) / 1000 for part in (0, 1))
        print(f"  whole import {whole:.0f} ms, its own modules {own:.0f} ms ({len(ours)} modules)")
        print(f"  console and web modules loaded: {', '.join(console) or 'none'}")


if __name__ == "__main__":
    main()
