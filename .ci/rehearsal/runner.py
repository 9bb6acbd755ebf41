"""What a GitHub-hosted runner gives a job, made on this machine: the user ``runner`` (not root,
with a passwordless ``sudo``), a fresh checkout in its workspace, a clean home, and the Python that
``actions/setup-python`` puts first on ``PATH`` (a copy of this machine's build of that version, in
a tool cache of the user's own, with pip and nothing else).

This needs root (it creates the user and its sudoers entry, and installs Debian's sudo if
missing) and leaves the user in place for the next rehearsal.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

USER = "runner"
HOME = Path("/home") / USER
SUDOERS = Path("/etc/sudoers.d/rehearsal-runner")
WORK = HOME / "work"
TOOL_CACHE = HOME / "hostedtoolcache"
# This machine's network needs its certificate settings (a TLS-terminating egress proxy) and pip's
# settings for its registry; a hosted runner reaches PyPI without them. Kept, and listed, so that
# the job's pip reaches PyPI here as it does there.
_MACHINE_NETWORK = re.compile(r"^(PIP_\w+|\w*CA_BUNDLE|\w*_CA_CERTS?\w*|SSL_CERT_\w+|\w*_PROXY|\w*_proxy)$")


def ensure_runner() -> None:
    """Create the user ``runner`` with a home and a passwordless sudo (installing Debian's sudo
    if needed), as the hosted runner image has it."""
    if os.geteuid() != 0:
        raise SystemExit("the rehearsal makes the runner's user: run it as root")
    if shutil.which("sudo") is None:
        _apt_install("sudo")
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", USER], check=True)
    SUDOERS.write_text(f"{USER} ALL=(ALL) NOPASSWD:ALL\n")
    SUDOERS.chmod(0o440)


def as_on_the_runner_image() -> list[str]:
    """Make the system packages the jobs use look as on GitHub's ubuntu-24.04 image, and say what
    changed: it has no faketime and no libfaketime (a job that needs them installs faketime, with
    sudo, and gets both), and it has a chromium."""
    changes = []
    installed = subprocess.run(
        ["dpkg-query", "-W", "-f", "${db:Status-Status} ", "faketime", "libfaketime"],
        capture_output=True, text=True, check=False,
    ).stdout.split()  # fmt: skip
    if "installed" in installed:
        subprocess.run(
            ["apt-get", "remove", "-y", "-q", "faketime", "libfaketime"], check=True, stdout=subprocess.DEVNULL
        )
        changes.append("faketime and libfaketime removed (the runner image has neither; make test installs them)")
    if shutil.which("chromium") is None and shutil.which("chromium-browser") is None:
        _apt_install("chromium")
        changes.append("chromium installed (the runner image has one)")
    return changes


def _apt_install(package: str) -> None:
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    if subprocess.run(["apt-get", "install", "-y", "-q", package], **quiet).returncode != 0:  # type: ignore[call-overload]
        subprocess.run(["apt-get", "update", "-q"], check=True, **quiet)  # type: ignore[call-overload]
        subprocess.run(["apt-get", "install", "-y", "-q", package], check=True, **quiet)  # type: ignore[call-overload]


def machine_network() -> dict[str, str]:
    """This machine's settings for reaching the registries (see ``_MACHINE_NETWORK``)."""
    return {key: value for key, value in os.environ.items() if _MACHINE_NETWORK.match(key)}


def chown_to_runner(path: Path) -> None:
    subprocess.run(["chown", "-R", f"{USER}:{USER}", str(path)], check=True)


def fresh_workspace(repository: Path, name: str, commit: str = "HEAD") -> Path:
    """A clone of ``repository`` at ``commit`` in ``~runner/work/NAME/NAME``, owned by the runner,
    as actions/checkout leaves it."""
    workspace = WORK / name / name
    shutil.rmtree(WORK / name, ignore_errors=True)
    workspace.parent.mkdir(parents=True)
    revision = subprocess.run(
        ["git", "-C", str(repository), "rev-parse", "--verify", f"{commit}^{{commit}}"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    subprocess.run(["git", "clone", "--quiet", "--no-local", str(repository), str(workspace)], check=True)
    subprocess.run(["git", "-C", str(workspace), "checkout", "--quiet", "--detach", revision], check=True)
    chown_to_runner(WORK)
    return workspace


def setup_python(version: str) -> dict[str, str]:
    """A fresh tool-cache copy of this machine's Python ``version`` (``3.12``: the newest 3.12.x
    pyenv has) with pip and no other package, owned by the runner; the variables
    actions/setup-python sets for it (its ``bin`` first on ``PATH``, ``LD_LIBRARY_PATH`` for its
    shared library, ``pythonLocation``)."""
    source = _pyenv_build(version)
    target = TOOL_CACHE / "Python" / source.name / "x64"
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    site_packages = source / "lib" / f"python{version}" / "site-packages"

    def left_out(directory: str, names: list[str]) -> set[str]:
        if Path(directory) == site_packages:
            return set(names)  # this machine's packages: a fresh runner has none
        return {name for name in names if name.startswith("pip")} if Path(directory) == source / "bin" else set()

    shutil.copytree(source, target, symlinks=True, ignore=left_out)
    chown_to_runner(TOOL_CACHE)
    variables = {
        "pythonLocation": str(target),
        "Python_ROOT_DIR": str(target),
        "Python3_ROOT_DIR": str(target),
        "PKG_CONFIG_PATH": str(target / "lib" / "pkgconfig"),
        "LD_LIBRARY_PATH": str(target / "lib"),
    }
    environment = {**base_environment(), **variables, "PATH": f"{target / 'bin'}:{base_environment()['PATH']}"}
    if run_as_runner(["python3", "-m", "ensurepip", "--default-pip"], environment, HOME, quiet=True) != 0:
        raise SystemExit(f"ensurepip failed in the tool cache's Python {version}")
    return variables


def _pyenv_build(version: str) -> Path:
    root = Path(subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=True).stdout.strip())
    builds = [
        path
        for path in (root / "versions").iterdir()
        if re.fullmatch(rf"{re.escape(version)}\.\d+", path.name)
    ]
    if not builds:
        raise SystemExit(f"no Python {version} here (pyenv install {version})")
    return max(builds, key=lambda path: [int(part) for part in path.name.split(".")])


def base_environment() -> dict[str, str]:
    """What every step of a hosted job starts with (before setup-python and the job's env)."""
    return {
        "HOME": str(HOME),
        "USER": USER,
        "LOGNAME": USER,
        "SHELL": "/bin/bash",
        "LANG": "C.UTF-8",
        "PATH": f"{HOME}/.local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "CI": "true",
        "GITHUB_ACTIONS": "true",
        "RUNNER_OS": "Linux",
        "RUNNER_TOOL_CACHE": str(TOOL_CACHE),
        "RUNNER_TEMP": str(WORK / "_temp"),
        "DEBIAN_FRONTEND": "noninteractive",
        **machine_network(),
    }


def run_as_runner(
    command: list[str], env: Mapping[str, str], cwd: Path, *, timeout: float | None = None, quiet: bool = False
) -> int:
    """Run ``command`` as the runner, in a process group of its own; on timeout, kill the group."""
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=dict(env),
        user=USER,
        group=USER,
        extra_groups=[],
        process_group=0,
        stdout=subprocess.DEVNULL if quiet else None,
        stderr=subprocess.DEVNULL if quiet else None,
    )
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return 124


def end_runner_processes() -> None:
    """Kill what the job left running (a hosted runner's VM goes away with it)."""
    subprocess.run(["pkill", "-KILL", "-u", USER], check=False)
