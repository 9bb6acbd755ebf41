"""The test suite on each Python the package claims (pyproject.toml: 3.11, 3.12, 3.13).

    nox -s tests-3.13            the whole suite on Python 3.13 (pytest -n 8 --dist loadgroup, as make test)
    nox -s core-3.12 core-3.13   the core, cancellation, waiting and outage tests (what .ci/run runs)
    nox -s tests-3.12 -- tests/handles/test_stateful.py -k restarts    pytest arguments after --

Each session installs the project with its dev extra into a virtualenv of its own under .nox/.
nox finds ``python3.12`` and ``python3.13`` on PATH; with pyenv, put them there with
``pyenv global 3.11.7 3.12.1 3.13.0`` (or ``PYENV_VERSION``; .ci/run does).
"""

from __future__ import annotations

import nox

PYTHONS = ["3.11", "3.12", "3.13"]
CORE = [
    "tests/handles/test_lock_core.py",
    "tests/handles/test_cancellation.py",
    "tests/handles/test_waiting.py",
    "tests/handles/test_first_attempt.py",
    "tests/faults/test_outages.py",
    "tests/faults/test_shielded_requests.py",
]

# As make test: tests of one xdist_group share a worker (the docs' site, built once: tests/unit/test_docs.py).
DISTRIBUTE = ("--dist", "loadgroup")

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True


def _install(session: nox.Session) -> None:
    session.env["PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD"] = "1"  # the dashboard's tests drive Debian's chromium
    session.install("--quiet", "--disable-pip-version-check", "-e", ".[dev]")
    # As make test: this Python's bytecode for the checkout, written once rather than compiled again
    # in each process the tests start wherever PYTHONDONTWRITEBYTECODE=1.
    session.run("python", "-m", "compileall", "-q", "mongolock_async", "tests")


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The whole suite, or the pytest arguments given after --."""
    _install(session)
    session.run("python", "-m", "pytest", "-n", "8", *DISTRIBUTE, *session.posargs)


@nox.session(python=PYTHONS)
def core(session: nox.Session) -> None:
    """The lock's core, cancellation, waiting and outage tests: where the Python version matters
    most (asyncio's cancellation and timeouts changed from 3.11 to 3.12)."""
    _install(session)
    session.run("python", "-m", "pytest", "-n", "4", *DISTRIBUTE, *CORE, *session.posargs)
