"""Run ``mongolock check --perf --json`` against a MongoDB container started as the test suite's
testcontainers path starts it (mongolock_async.testing.selection.mongodb_container), and write its
report to the file given.

    python .ci/mongodb/check_in_container.py REPORT.json
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mongolock_async.testing.selection import mongodb_container


def main(report: Path) -> int:
    mongolock = Path(sys.executable).with_name("mongolock")
    with mongodb_container() as uri, report.open("w") as out:
        return subprocess.call(
            [str(mongolock), "check", "--perf", "--json"], stdout=out, env={**os.environ, "MONGODB_URI": uri}
        )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    sys.exit(main(Path(sys.argv[1])))
