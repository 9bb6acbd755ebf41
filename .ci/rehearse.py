"""Rehearse the real-MongoDB workflow (.github/workflows/real-mongodb.yml) here, as a hosted runner
would run it, before its first push does.

    python .ci/rehearse.py [--list] [JOB ...]        (as root, from the repository, after make test)

For every job of the workflow, every combination of its matrix, this runs the job's steps in order,
literally, as GitHub's ubuntu runner runs them (``rehearsal/runner.py``): in a fresh clone of the
committed tree, as the user ``runner`` (not root; a passwordless sudo), with a clean home and the
Python that the job's ``actions/setup-python`` asks for, each ``run:`` script in ``bash -e`` with
the job's and the step's ``env``, each step's ``if:`` honoured.

Only what cannot run here is replaced, and each replacement is printed:

- ``docker compose -f FILE up``: every service of FILE becomes an embedded server that looks as the
  container would to its clients (``rehearsal/topology.py``, ``tests/support/standins.py``): configured by
  the container's own mongod/mongos command line, advertising its container's names (a mongos lists
  itself under its container's id, which nothing here resolves), reached through a forwarded port
  where the compose file publishes one. The script's lines before it run first (the certificates a
  service mounts), those after it once the stand-ins answer. Other ``docker`` commands are skipped.
- Docker itself: a stand-in engine (``rehearsal/docker_engine.py``) answers at ``DOCKER_HOST``, so
  that testcontainers starts its MongoDB as a stand-in published on a random port.
- ``actions/checkout`` is the fresh clone, ``actions/setup-python`` the tool-cache Python, and
  ``actions/upload-artifact`` checks that its files exist; other actions are skipped.
- A stand-in has the test commands where its service's command line turns them on
  (``--setParameter enableTestCommands=1``, as every service's does), so the fault tests among the
  rehearsed ones arm their fail points on it, as they would on the job's MongoDB; a service without
  them fails those tests here as there (no job sets ``MONGOLOCK_TEST_FAULTS_ELSEWHERE``; a job's
  variables are passed as written).
- What the embedded server cannot be: ``MONGOLOCK_TEST_ROLES_ENFORCED`` is dropped (it does not
  enforce the changeStream action); with ``MONGOLOCK_TEST_SHARDED=1`` the tests that need a sharded
  collection are left out (``MONGOLOCK_TEST_WITHOUT_MONGOS``: a stand-in mongos shards nothing).
- Time: ``make test`` runs the tests marked ``environment`` (``PYTEST_ADDOPTS``), not the whole suite
  (``.ci/run`` has run it already); a pytest step that names its own selection runs it whole, with
  one worker where it asks for more: one embedded server serves every worker, and it is slower than
  mongod (with two, its round trips under the access-control and TLS jobs' selections outgrew the
  0.5 s a waiter test allows, in three rehearsals on a loaded machine).
- This machine's network settings (its registries' certificates and pip's settings) are kept.

Exit status 0 when every job passed, 1 otherwise; the summary names each job's failed steps.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / ".ci"), str(ROOT)]

import yaml  # noqa: E402
from rehearsal import runner  # noqa: E402
from rehearsal.docker_engine import Engine  # noqa: E402
from rehearsal.topology import Server, start_compose  # noqa: E402

WORKFLOW = ROOT / ".github" / "workflows" / "real-mongodb.yml"
_EXPRESSION = re.compile(r"\$\{\{\s*([^}]*?)\s*\}\}")
_COMPOSE_UP = re.compile(r"^[ \t]*docker compose -f (\S+) up\b.*$", re.MULTILINE)
_OTHER_DOCKER = re.compile(r"^\s*docker\b.*$", re.MULTILINE)
_WORKERS = re.compile(r"(-n|--numprocesses)\s+(\d+)")
_WORKERS_ON_ONE_EMBEDDED_SERVER = 1
_RELEASE_AXIS = "mongodb"  # the matrix axis that names the MongoDB release
_REPOSITORY = "mongolock-async"  # the checkout's folder: ~runner/work/REPOSITORY/REPOSITORY, as on GitHub


@dataclass
class Job:
    """One job of the workflow with one combination of its matrix."""

    id: str
    name: str
    definition: dict[str, Any]
    matrix: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    failed_steps: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def expand(self, value: Any) -> str:
        """``value`` with its ``${{ matrix.* }}`` (and ``github.workspace``) expressions replaced;
        any other expression is refused, so that the rehearsal never guesses one."""

        def replace(match: re.Match[str]) -> str:
            expression = match.group(1)
            if expression.startswith("matrix."):
                return str(self.matrix[expression.removeprefix("matrix.")])
            if expression == "github.workspace":
                return str(self.workspace)
            raise ValueError(f"{self.id}: the rehearsal does not evaluate ${{{{ {expression} }}}}")

        return _EXPRESSION.sub(replace, str(value))

    @property
    def workspace(self) -> Path:
        return runner.WORK / _REPOSITORY / _REPOSITORY


def jobs_of(workflow: dict[str, Any]) -> list[Job]:
    """Every job and matrix combination, as GitHub expands ``strategy.matrix`` (with ``include``:
    an entry extends each combination its original keys match, else it is a combination of its own)."""
    jobs = []
    for job_id, definition in workflow["jobs"].items():
        matrix = dict((definition.get("strategy") or {}).get("matrix") or {})
        include = matrix.pop("include", [])
        axes = {key: value for key, value in matrix.items() if isinstance(value, list)}
        combinations = [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]
        for extra in include:
            matching = [c for c in combinations if all(c[k] == v for k, v in extra.items() if k in axes)]
            for combination in matching:
                combination.update({k: v for k, v in extra.items() if k not in axes})
            if not matching:
                combinations.append(dict(extra))
        for combination in combinations or [{}]:
            job = Job(job_id, "", definition, combination)
            job.name = job.expand(definition.get("name", job_id))
            jobs.append(job)
    return jobs


class Rehearsal:
    """One job's run: its stand-ins, its Docker engine, its environment, its steps."""

    def __init__(self, job: Job, say: Callable[[str], None], commit: str, addopts: str) -> None:
        self.job = job
        self.say = say
        self.commit = commit
        self.addopts = addopts
        self.servers: list[Server] = []
        self.engine: Engine | None = None
        self.python: dict[str, str] = {}

    def run(self) -> None:
        started = time.monotonic()
        try:
            runner.fresh_workspace(ROOT, _REPOSITORY, self.commit)
            for change in runner.as_on_the_runner_image():
                self.note(change)
            socket_path = runner.WORK / "_temp" / "docker.sock"
            socket_path.parent.mkdir(parents=True, exist_ok=True)
            self.engine = Engine(socket_path, lambda line: self.say(f"   docker: {line}")).start()
            runner.chown_to_runner(runner.WORK)
            self.note(f"Docker: the rehearsal's engine stand-in at unix://{socket_path} (DOCKER_HOST)")
            if Path("/.dockerenv").exists():
                self.note("TESTCONTAINERS_CONNECTION_MODE=docker_host: this machine is itself a container, "
                          "the hosted runner is not")  # fmt: skip
            for index, step in enumerate(self.job.definition.get("steps", []), 1):
                self.step(index, step)
        finally:
            for server in self.servers:
                server.close()
            if self.engine is not None:
                self.engine.close()
            runner.end_runner_processes()
            self.job.seconds = time.monotonic() - started

    def note(self, text: str) -> None:
        self.job.notes.append(text)
        self.say(f"   here: {text}")

    def step(self, index: int, step: dict[str, Any]) -> None:
        name = step.get("name") or step.get("uses") or f"step {index}"
        condition = str(step.get("if", "success()"))
        failed = bool(self.job.failed_steps)
        if not _should_run(condition, failed):
            self.say(f"\n-- {name}: not run ({condition})")
            return
        self.say(f"\n-- {name}")
        if "uses" in step:
            self.action(str(step["uses"]), step.get("with") or {})
            return
        if not self.script(name, self.job.expand(step["run"]), step.get("env") or {}):
            self.job.failed_steps.append(name)

    def action(self, uses: str, arguments: dict[str, Any]) -> None:
        action = uses.partition("@")[0]
        if action == "actions/checkout":
            self.say(f"   here: {self.commit} of this repository, cloned into {self.job.workspace}")
        elif action == "actions/setup-python":
            version = self.job.expand(arguments["python-version"])
            self.python = runner.setup_python(version)
            self.say(f"   here: Python {version} from this machine's build, at {self.python['pythonLocation']}"
                     + (" (its pip cache: the runner's home, kept between jobs here)" if arguments.get("cache")
                        else ""))  # fmt: skip
        elif action == "actions/upload-artifact":
            pattern = self.job.expand(arguments["path"])
            found = sorted(glob.glob(str(self.job.workspace / pattern)))
            shown = ", ".join(Path(path).name for path in found)
            self.say(f"   here: would upload {shown}" if found else f"   here: no file matches {pattern}")
            for path in found:
                self.show_check_report(Path(path))
            if not found and arguments.get("if-no-files-found") == "error":
                self.job.failed_steps.append(f"upload {pattern}")
        else:
            self.note(f"{uses}: skipped (not an action the rehearsal knows)")

    def show_check_report(self, path: Path) -> None:
        """What a ``mongolock check --json`` report found besides passes, so that the rehearsal's
        output says what a job's artifact would."""
        try:
            checks = json.loads(path.read_text())["checks"]
        except (ValueError, KeyError, TypeError) as error:
            self.say(f"      {path.name}: not a check report ({error})")
            return
        verdicts = [check["verdict"] for check in checks]
        self.say(f"      {path.name}: " + ", ".join(f"{verdicts.count(v)} {v}" for v in sorted(set(verdicts))))
        for check in checks:
            if check["verdict"] in ("warn", "fail"):
                self.say(f"      {check['verdict']} {check['id']}: {check['measured']}")

    def script(self, name: str, script: str, step_env: dict[str, Any]) -> bool:
        """Run a ``run:`` script in ``bash -e`` as the runner. A ``docker compose up`` line starts its
        stand-ins where the line stands: what comes before it (certificates the services mount) runs
        first, as its own script, and what follows runs once the stand-ins answer."""
        env = self.environment(step_env, script)
        started = time.monotonic()
        pieces = _COMPOSE_UP.split(script)  # text, compose file, text, compose file, ..., text
        code = 0
        for index, piece in enumerate(pieces):
            if index % 2:
                self.say(f"   here: docker compose -f {piece} up -> stand-ins:")
                compose = self.job.workspace / piece
                self.servers += start_compose(compose, env, lambda line: self.say(f"      {line}"))
            elif piece.strip():
                code = self.run_piece(piece, env)
                if code:
                    break
        self.say(f"   {name}: exit {code} in {time.monotonic() - started:.0f} s")
        return code == 0

    def run_piece(self, script: str, env: dict[str, str]) -> int:
        for match in _OTHER_DOCKER.finditer(script):
            self.say(f"   here: skipped: {match.group(0).strip()}")
        script = _OTHER_DOCKER.sub(lambda match: f": skipped: {match.group(0).strip()}", script)
        if "pytest" in script:
            script = self.fewer_workers(script)
        with tempfile.NamedTemporaryFile("w", suffix=".sh", dir=runner.WORK / "_temp", delete=False) as file:
            file.write(script)
        runner.chown_to_runner(Path(file.name))
        timeout = float(self.job.definition.get("timeout-minutes", 360)) * 60
        code = runner.run_as_runner(["bash", "-e", file.name], env, self.job.workspace, timeout=timeout)
        Path(file.name).unlink()
        return code

    def fewer_workers(self, script: str) -> str:
        def replace(match: re.Match[str]) -> str:
            if int(match.group(2)) <= _WORKERS_ON_ONE_EMBEDDED_SERVER:
                return match.group(0)
            self.note(f"pytest {match.group(0)} -> -n {_WORKERS_ON_ONE_EMBEDDED_SERVER} (one embedded server "
                      "serves every worker)")  # fmt: skip
            return f"{match.group(1)} {_WORKERS_ON_ONE_EMBEDDED_SERVER}"

        return _WORKERS.sub(replace, script)

    def environment(self, step_env: dict[str, Any], script: str) -> dict[str, str]:
        declared = {**(self.job.definition.get("env") or {}), **step_env}
        env = {key: self.job.expand(value) for key, value in declared.items()}
        base = runner.base_environment()
        env = {**base, **self.python, **env, "GITHUB_WORKSPACE": str(self.job.workspace)}
        if self.python:
            env["PATH"] = f"{self.python['pythonLocation']}/bin:{base['PATH']}"
        assert self.engine is not None
        env["DOCKER_HOST"] = f"unix://{self.engine.socket_path}"
        if Path("/.dockerenv").exists():
            env["TESTCONTAINERS_CONNECTION_MODE"] = "docker_host"
        if env.pop("MONGOLOCK_TEST_ROLES_ENFORCED", None) is not None:
            self.note_once("MONGOLOCK_TEST_ROLES_ENFORCED dropped: the embedded server does not enforce the "
                           "changeStream action")  # fmt: skip
        if env.get("MONGOLOCK_TEST_SHARDED") == "1":
            env["MONGOLOCK_TEST_WITHOUT_MONGOS"] = "1"
            self.note_once("MONGOLOCK_TEST_WITHOUT_MONGOS=1: the stand-in mongos shards nothing")
        if env.get("MONGOLOCK_TEST_ADMIN_URI") and "MONGOLOCK_TEST_DRIVERS" not in env:
            env["MONGOLOCK_TEST_DRIVERS"] = "pymongo"
            self.note_once("MONGOLOCK_TEST_DRIVERS=pymongo where privileges are restricted: both drivers send the same "
                           "commands, and one embedded server takes twice as long for two")  # fmt: skip
        if re.search(r"(^|\s)make test(\s|$)", script):
            env["PYTEST_ADDOPTS"] = self.addopts
            self.note_once(f"make test: PYTEST_ADDOPTS={self.addopts} (.ci/run has run the whole suite)")
        return env

    def note_once(self, text: str) -> None:
        if text not in self.job.notes:
            self.note(text)


def _should_run(condition: str, failed: bool) -> bool:
    """A step's ``if:`` (``success()`` when absent); nothing is cancelled in a rehearsal."""
    condition = condition.strip().removeprefix("${{").removesuffix("}}").strip()
    if condition in ("always()", "!cancelled()"):
        return True
    if condition in ("success()", "failure()"):
        return failed == (condition == "failure()")
    raise ValueError(f"the rehearsal does not evaluate the condition {condition!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="list the jobs, run nothing")
    parser.add_argument("--commit", default="HEAD", help="the commit whose workflow runs (default: HEAD)")
    parser.add_argument(
        "--addopts", default="-m environment", help="what make test runs (PYTEST_ADDOPTS; default: -m environment)"
    )
    parser.add_argument("jobs", nargs="*", help="only the jobs whose id or name starts with one of these")
    arguments = parser.parse_args()
    workflow = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{arguments.commit}:{WORKFLOW.relative_to(ROOT)}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    jobs = [
        job
        for job in jobs_of(yaml.safe_load(workflow))
        if not arguments.jobs or job.id.startswith(tuple(arguments.jobs)) or job.name.startswith(tuple(arguments.jobs))
    ]
    rehearsed, same_as = _distinct(jobs)
    if arguments.list:
        for job in jobs:
            print(f"{job.id}: {job.name}" + (f" (as {same_as[job.name]})" if job.name in same_as else ""))
        return 0
    runner.ensure_runner()

    def say(line: str) -> None:
        print(line, flush=True)

    for job in jobs:
        if job.name in same_as:
            say(f"\n== {job.name}: the same steps as {same_as[job.name]}, but for the MongoDB release its stand-ins "
                "report: not rehearsed again")
            continue
        say(f"\n== {job.name} ({job.id}), as the user {runner.USER}")
        try:
            Rehearsal(job, say, arguments.commit, arguments.addopts).run()
        except Exception as error:  # a stand-in that could not start fails its job, not the rest
            job.failed_steps.append(f"the rehearsal itself: {type(error).__name__}: {error}")
        say(f"== {job.name}: {'failed: ' + '; '.join(job.failed_steps) if job.failed_steps else 'passed'} "
            f"in {job.seconds:.0f} s")  # fmt: skip
    passed = [job for job in rehearsed if not job.failed_steps]
    say(f"\n{len(passed)} of {len(rehearsed)} workflow jobs rehearsed passed ({len(jobs)} jobs in all)")
    for job in jobs:
        if job.name in same_as:
            say(f"   as {same_as[job.name]}: {job.name}")
            continue
        say(f"   {'passed' if not job.failed_steps else 'FAILED'}  {job.name} ({job.seconds:.0f} s)"
            + ("" if not job.failed_steps else f": {'; '.join(job.failed_steps)}"))  # fmt: skip
    return 0 if len(passed) == len(rehearsed) else 1


def _distinct(jobs: list[Job]) -> tuple[list[Job], dict[str, str]]:
    """The jobs to rehearse, and for each other job the name of the one whose steps it shares: jobs
    of one definition whose matrix differs in the MongoDB release alone (the stand-ins report the
    release; nothing else here differs), the first in the matrix's order rehearsed."""
    rehearsed: list[Job] = []
    same_as: dict[str, str] = {}
    first: dict[tuple[str, str], Job] = {}
    for job in jobs:
        shape = (job.id, repr(sorted((k, v) for k, v in job.matrix.items() if k != _RELEASE_AXIS)))
        if shape in first:
            same_as[job.name] = first[shape].name
        else:
            first[shape] = job
            rehearsed.append(job)
    return rehearsed, same_as


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
