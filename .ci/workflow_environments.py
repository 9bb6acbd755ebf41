"""Run each job of the real-MongoDB workflow with that job's environment, against the embedded server.

    python .ci/workflow_environments.py [--list] [JOB ...]

The workflow (.github/workflows/real-mongodb.yml) needs a Docker engine and real MongoDB; its first
run is where a variable that leaks into a child process, or a URI of another shape, would show.
This runs every job (every combination of its matrix) here first: for each of its test steps, the
step's pytest invocation (``make test``: the Makefile's pytest arguments) with the job's and the step's
variables, against an embedded server of this run, with only what the environment can break:

- the tests marked ``environment`` (they read the run's settings or hand an environment to a child
  process), for every job;
- a job that restricts privileges (it names an administrator in MONGOLOCK_TEST_ADMIN_URI): its
  whole selection, as users with the roles the workflow gives them (``create_test_users`` of
  .ci/mongodb/initiate.py, on an embedded server with authentication, which enforces those roles
  for reads, writes and collection commands, though not the changeStream action), with PyMongo
  only (both drivers send the library's same commands) and two workers, which share one embedded
  server (the workflow's share one mongod). A test that fails there fails the step: a test that
  misses its deadlines under that load is a test to fix, not to run again.

Steps whose environment here is the same (the matrix's server versions differ only in what this
cannot run) run once.

What the embedded server cannot stand in for is adapted, and each adaptation is printed: the host
list of a URI becomes the embedded server's (its replica set is named "secantus", not "rs0"); the
server version expected is dropped; a testcontainers job expects the embedded server (no Docker
here); MONGOLOCK_TEST_ROLES_ENFORCED is dropped (the embedded server lets a user without
changeStream open a change stream); the application's role may kill its own cursors (mongod lets
any user do that; the embedded server checks killCursors); and with MONGOLOCK_TEST_SHARDED=1 (no
mongos here) the tests that need a sharded collection are left out (tests/conftest.py,
MONGOLOCK_TEST_WITHOUT_MONGOS).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pymongo import MongoClient

from mongolock_async.testing import EmbeddedMongo

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "real-mongodb.yml"
MAKEFILE = ROOT / "Makefile"
_MATRIX = re.compile(r"\$\{\{\s*matrix\.(\w+)\s*\}\}")
_EMBEDDED_REPLICA_SET = "secantus"


@dataclass
class Run:
    """One test step of one job (one combination of its matrix), as it would run here."""

    job: str
    step: str
    env: dict[str, str]
    pytest_arguments: list[str]
    adaptations: list[str] = field(default_factory=list)

    @property
    def restricts_privileges(self) -> bool:
        return bool(self.env.get("MONGOLOCK_TEST_ADMIN_URI"))


def _substitute(value: Any, matrix: dict[str, Any]) -> str:
    return _MATRIX.sub(lambda match: str(matrix[match.group(1)]), str(value))


def _combinations(job: dict[str, Any]) -> list[dict[str, Any]]:
    matrix = dict((job.get("strategy") or {}).get("matrix") or {})
    include = matrix.pop("include", [])
    axes = {key: value for key, value in matrix.items() if isinstance(value, list)}
    combinations = [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())] or [{}]
    return combinations + [dict(extra) for extra in include]


def _pytest_arguments(command: str) -> list[str] | None:
    """The pytest arguments of a step's command; for ``make test``, those of the Makefile's test target."""
    if re.search(r"(^|\s)make test(\s|$)", command):
        recipe = re.search(r"^\t\$\(PYTHON\) -m pytest(.*)$", MAKEFILE.read_text(), re.MULTILINE)
        assert recipe, "the Makefile's test target no longer runs `$(PYTHON) -m pytest`"
        return shlex.split(recipe.group(1))
    words = shlex.split(command.replace("\\\n", " "))
    if "pytest" in words:
        return words[words.index("pytest") + 1 :]
    return None


def workflow_runs() -> list[Run]:
    """Every test step of every job of the workflow, with its environment as written."""
    workflow = yaml.safe_load(WORKFLOW.read_text())
    runs = []
    for job_id, job in workflow["jobs"].items():
        for matrix in _combinations(job):
            label = job_id + "".join(f" {key}={value}" for key, value in matrix.items())
            job_env = {key: _substitute(value, matrix) for key, value in (job.get("env") or {}).items()}
            for step in job.get("steps", []):
                arguments = _pytest_arguments(step.get("run", ""))
                if arguments is None:
                    continue
                step_env = {key: _substitute(value, matrix) for key, value in (step.get("env") or {}).items()}
                runs.append(Run(label, step.get("name", ""), {**job_env, **step_env}, arguments))
    return runs


def _load_initiate() -> Any:
    spec = importlib.util.spec_from_file_location("initiate", ROOT / ".ci" / "mongodb" / "initiate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _local_uri(uri: str, port: int) -> str:
    """``uri`` pointed at the embedded server: its host list replaced, its replica set renamed."""
    scheme, _, rest = uri.partition("://")
    authority, _, tail = rest.partition("/")
    credentials = authority.rpartition("@")[0]
    path, _, query = tail.partition("?")
    options = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
    if "replicaSet" in options:
        options["replicaSet"] = _EMBEDDED_REPLICA_SET
    encoded = urllib.parse.urlencode(options, quote_via=urllib.parse.quote)
    host = f"{credentials}@127.0.0.1:{port}" if credentials else f"127.0.0.1:{port}"
    return f"{scheme}://{host}/{path}" + (f"?{encoded}" if encoded else "")


def localize(run: Run, port: int) -> dict[str, str]:
    """The environment ``run`` gets here, each change from the workflow's noted in ``run.adaptations``."""
    env = dict(run.env)
    env.pop("MONGODB_VERSION", None)  # read by the compose files only
    for key in ("MONGODB_URI", "MONGOLOCK_TEST_ADMIN_URI"):
        if key in env:
            env[key] = _local_uri(env[key], port)
            run.adaptations.append(f"{key}: the embedded server's host, replica set {_EMBEDDED_REPLICA_SET}")
    if env.pop("MONGOLOCK_TEST_EXPECT_VERSION", None) is not None:
        run.adaptations.append("no server version expected (the embedded server is not MongoDB)")
    if env.get("MONGOLOCK_TEST_EXPECT_SERVER") == "testcontainers":
        env["MONGOLOCK_TEST_EXPECT_SERVER"] = "embedded"
        run.adaptations.append("the embedded server expected, not testcontainers (no Docker engine here)")
    if env.pop("MONGOLOCK_TEST_ROLES_ENFORCED", None) is not None:
        run.adaptations.append(
            "changeStream not enforced (the embedded server does not check it): a fail point refuses it"
        )
    if run.restricts_privileges and "MONGOLOCK_TEST_DRIVERS" not in env:
        env["MONGOLOCK_TEST_DRIVERS"] = "pymongo"
        run.adaptations.append("PyMongo only (the privileges a test needs do not depend on the driver)")
    if env.get("MONGOLOCK_TEST_SHARDED") == "1":
        env["MONGOLOCK_TEST_WITHOUT_MONGOS"] = "1"
        run.adaptations.append("tests that need a sharded collection left out (no mongos here)")
    return env


# Workers of a whole selection on one embedded server: four, as the workflow runs them on mongod,
# left the double (Python, one server for all) missing the 1 s deadlines of heartbeat tests.
_WORKERS_ON_ONE_EMBEDDED_SERVER = "2"


def _pytest_command(run: Run, extra: list[str]) -> list[str]:
    arguments = list(run.pytest_arguments)
    if not run.restricts_privileges:
        arguments += ["-m", "environment"]
    elif "-n" in arguments and arguments[arguments.index("-n") + 1] != _WORKERS_ON_ONE_EMBEDDED_SERVER:
        arguments[arguments.index("-n") + 1] = _WORKERS_ON_ONE_EMBEDDED_SERVER
        run.adaptations.append(f"{_WORKERS_ON_ONE_EMBEDDED_SERVER} workers (one embedded server serves them all)")
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *arguments, *extra]


# Since MongoDB 4.2 a user may always kill its own cursors, whatever its privileges (the manual's
# killCursors, "Kill Own Cursors"; SERVER-36829). The embedded server checks the killCursors action
# even then; PyMongo retries a refused kill in the background, which a test counting killCursors
# then sees twice. So the role gets the action here, as tests/test_check.py's roles do.
_KILL_OWN_CURSORS = "mongolockUser may kill its own cursors (mongod needs no privilege for that)"


def execute(run: Run, extra: list[str]) -> int:
    """Run ``run`` against a fresh embedded server of its own; 0 if pytest passed."""
    admin = None
    if run.restricts_privileges:
        initiate = _load_initiate()
        admin = initiate.ADMIN
    with EmbeddedMongo(test_commands=True, auth=admin) as server:
        assert server.port is not None
        if admin is not None:
            client: MongoClient[dict[str, Any]]
            with MongoClient(server.uri, serverSelectionTimeoutMS=10_000) as client:
                initiate.create_test_users(client)
                client.admin.command(
                    "grantPrivilegesToRole",
                    "mongolockUser",
                    privileges=[
                        {"resource": {"db": database, "collection": ""}, "actions": ["killCursors"]}
                        for database in initiate.TEST_DATABASES
                    ],
                )
            run.adaptations.append(_KILL_OWN_CURSORS)
        inherited = {
            key: value for key, value in os.environ.items() if not key.startswith(("MONGODB_URI", "MONGOLOCK_"))
        }
        env = {**inherited, **localize(run, server.port)}
        command = _pytest_command(run, extra)
        print(f"\n== {run.job}: {run.step}", flush=True)
        for adaptation in run.adaptations:
            print(f"   here: {adaptation}", flush=True)
        print("   " + " ".join(shlex.quote(word) for word in command[1:]), flush=True)
        started = time.monotonic()
        code = subprocess.call(command, cwd=ROOT, env=env)
        print(f"   exit {code} in {time.monotonic() - started:.0f} s", flush=True)
        return code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="list the runs and their environments, run nothing")
    parser.add_argument("jobs", nargs="*", help="only the jobs whose name starts with one of these")
    parser.add_argument("--pytest", default="", help="more pytest arguments (e.g. '-k renewals'), for a closer look")
    arguments = parser.parse_args()
    runs = [run for run in workflow_runs() if not arguments.jobs or run.job.startswith(tuple(arguments.jobs))]
    if arguments.list:
        for run in runs:
            print(f"{run.job}: {run.step}\n   pytest {' '.join(run.pytest_arguments)}\n   {run.env}")
        return 0
    extra = shlex.split(arguments.pytest)
    failed: list[str] = []
    done: dict[tuple[Any, ...], str] = {}
    for run in runs:
        # The same environment here as a run already made (port 0: before a server is chosen).
        shape = (tuple(sorted(localize(Run(run.job, run.step, run.env, []), 0).items())), tuple(run.pytest_arguments))
        if shape in done:
            print(f"\n== {run.job}: {run.step}\n   here: the same as {done[shape]}", flush=True)
            continue
        done[shape] = run.job
        if execute(run, extra) != 0:
            failed.append(f"{run.job}: {run.step}")
    print(f"\n{len(done) - len(failed)} of {len(done)} distinct workflow test steps passed here", flush=True)
    for name in failed:
        print(f"   failed: {name}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
