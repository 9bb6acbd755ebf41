# Set-up and checks. Every target creates the virtualenv (.venv) and installs the project first.
VENV ?= .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: test test-optimized lint docs screenshots demo bench soak model stall-check

## Root installs system packages itself; anyone else through a sudo that asks no password (GitHub's
## hosted runners run jobs as the user runner, with one). With neither, the install fails and says so.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo -n)

## $(call debian,PACKAGE,WHAT NEEDS IT): Debian's PACKAGE (which has a command of its name) installed
## when missing; if that fails, a note saying what will fail without it.
debian = @command -v $(1) >/dev/null || $(SUDO) apt-get install -y -q $(1) >/dev/null 2>&1 || \
	($(SUDO) apt-get update -q >/dev/null 2>&1 && $(SUDO) apt-get install -y -q $(1) >/dev/null 2>&1) || \
	echo "note: could not install $(1) (Debian's $(1) package); $(2)"

$(PYTHON):
	python3 -m venv $(VENV)

## Every development tool (the dev extra): tests, lint, docs, benchmarks.
$(STAMP): pyproject.toml | $(PYTHON)
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(PYTHON) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

## What the demo needs and no more: the embedded server, and rich for its live view on a terminal.
## A stamp of its own, so that `make test` after `make demo` still installs the dev extra.
$(DEMO_STAMP): pyproject.toml | $(PYTHON)
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -e '.[embedded,rich]'
	touch $(DEMO_STAMP)

## The test suite, in 8 worker processes with an embedded server each (CI runs it after lint, docs
## and the package check). Eight on 2 cores: the suite mostly waits rather than computes
## (CONTRIBUTING.md, "Running it"). The job tests run processes under a shifted wall clock: Debian's
## faketime; the dashboard's tests drive Debian's chromium headless (Playwright never downloads a
## browser; GitHub's runner image has one as chromium-browser). Both are installed here when missing
## (see SUDO; without it those tests fail, saying what to install). The bytecode of the package,
## tests and benchmarks is written first: where PYTHONDONTWRITEBYTECODE=1 (as on the development
## machines), each of the suite's hundreds of Python processes would otherwise compile them again.
test: $(STAMP)
	$(call debian,faketime,the job tests that need it will fail)
	$(if $(shell command -v chromium-browser),,$(call debian,chromium,the dashboard's browser tests will fail))
	$(PYTHON) -m compileall -q mongolock_async tests benchmarks
	$(PYTHON) -m pytest -n 8 --dist loadgroup

## The suite again under python -O, which strips assert statements (CI runs it after make test): the
## package asserts nothing (ruff's S101), so nothing it does may change; the tests' helpers check as
## they do without -O (tests/conftest.py registers them for pytest's rewriting, and starts the xdist
## workers with -O too); the processes the tests start run unoptimized. pytest's warning that -O
## strips the asserts of modules it did not rewrite is silenced: those are other packages' only.
test-optimized: $(STAMP)
	$(call debian,faketime,the job tests that need it will fail)
	$(if $(shell command -v chromium-browser),,$(call debian,chromium,the dashboard's browser tests will fail))
	$(PYTHON) -O -m compileall -q mongolock_async tests benchmarks
	$(PYTHON) -O -m pytest -n 8 --dist loadgroup -W "ignore:assertions not in test modules:pytest.PytestConfigWarning"

## ruff, the layers' import contracts (pyproject.toml), and mypy --strict (the package and its examples, a user-style file, every example in the docs),
## and the real-MongoDB workflow and its compose files checked against their schemas.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy --strict mongolock_async tests/typing
	examples=$$(mktemp -d) && $(PYTHON) tests/support/doc_examples.py $$examples && \
		$(VENV)/bin/mypy --strict $$examples; status=$$?; rm -rf $$examples; exit $$status
	$(VENV)/bin/mypy --strict .ci/mongodb/initiate.py .ci/mongodb/check_in_container.py .ci/mongodb/certificates.py \
		.ci/mkdocs_hooks.py model/check.py
	MYPYPATH=.ci $(VENV)/bin/mypy --strict .ci/rehearse.py .ci/rehearsal
	$(VENV)/bin/check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml
	$(VENV)/bin/check-jsonschema --builtin-schema custom.github-workflows-require-timeout .github/workflows/*.yml
	$(VENV)/bin/check-jsonschema --builtin-schema vendor.compose-spec .ci/mongodb/*.yml

## The documentation site, built with --strict into site/.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

## The pictures of docs/live.md (the dashboard in headless chromium, `mongolock watch` as SVG), made
## again only when asked: `make docs` uses the committed ones and stays offline. Needs Debian's chromium.
screenshots: $(STAMP)
	$(call debian,chromium,the screenshots need it)
	$(PYTHON) docs/screenshots.py

## The demo, on an embedded MongoDB server it starts and stops itself.
demo: $(DEMO_STAMP)
	$(VENV)/bin/mongolock demo

## Benchmarks (not part of the tests): installs redis-py and Debian's redis-server for the peer.
## Last, the SVG charts in benchmarks/charts/ (drawn from the figures bench.py and renewal.py wrote).
bench: $(STAMP)
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -e '.[bench]'
	command -v redis-server >/dev/null || ($(SUDO) apt-get install -y -q redis-server || \
		($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q redis-server))
	$(PYTHON) benchmarks/bench.py
	$(PYTHON) benchmarks/renewal.py
	$(PYTHON) benchmarks/many_names.py
	$(PYTHON) benchmarks/fencing.py
	$(PYTHON) benchmarks/client_cost.py
	$(PYTHON) benchmarks/own_cost.py
	$(PYTHON) benchmarks/import_cost.py
	$(PYTHON) benchmarks/semaphore.py
	$(PYTHON) benchmarks/election.py
	$(PYTHON) benchmarks/dead_places.py
	$(PYTHON) benchmarks/view_cost.py
	$(PYTHON) benchmarks/view_scale.py
	$(PYTHON) benchmarks/idle_cleanup.py
	$(PYTHON) benchmarks/plots.py

## The lease protocol's model (model/lease.pml) and a job's periods' (model/jobs.pml) checked by
## SPIN: every bounded configuration exhaustively (no counterexample allowed), then every control (a
## mutation that must be refuted) and finding (a counterexample in the code's rules, still there; none now).
## States and times printed; docs/model.md. Installs Debian's spin and gcc (the verifiers' compiler)
## when missing; each compiled verifier is kept in model/build/ until its model changes.
model:
	$(call debian,spin,make model cannot run without it)
	$(call debian,gcc,make model cannot compile the verifier without it)
	python3 model/check.py

## The safety tests (pytest -m safety) while random processes of their run are stopped for 0.2 to
## 1.5 s (each run must pass), then against a planted defect in a temporary copy of the checkout (one
## acquisition in twenty ignores the holder: each run must fail). tests/support/stall_check.py.
stall-check: $(STAMP)
	$(PYTHON) -m tests.support.stall_check --runs $(or $(RUNS),3) --defect-runs $(or $(DEFECT_RUNS),5)

## The soaks (not part of the tests): 20 minutes of contention through crashes, pauses and fail points,
## then 5 minutes of fenced writes by processes paused at random past their TTL, then 200 cuts per
## client swept across a request's wait for a pooled connection (the suite runs 40), then 10 minutes
## of the lease chaos (no lease held by nobody for longer than its TTL, through a fail point every 150 ms);
## then five runs of the safety tests under random pauses and five against the planted defect (stall-check); last, the lease protocol's model at its deeper bounds (model/check.py --deep, docs/model.md).
soak: $(STAMP)
	$(PYTHON) benchmarks/soak.py --minutes $(or $(MINUTES),20)
	$(PYTHON) benchmarks/fenced_soak.py --minutes $(or $(FENCED_MINUTES),5)
	MONGOLOCK_SWEEP_RUNS=200 $(PYTHON) -m pytest -s tests/faults/test_request_bounds.py
	MONGOLOCK_STATEFUL_PROFILE=soak $(PYTHON) -m pytest -s tests/handles/test_stateful.py
	$(PYTHON) benchmarks/lease_chaos.py --minutes $(or $(CHAOS_MINUTES),10)
	$(PYTHON) -m tests.support.stall_check --runs 5 --defect-runs 5
	$(call debian,spin,the model's deeper check cannot run without it)
	$(call debian,gcc,the model's deeper check cannot compile its verifier without it)
	python3 model/check.py --deep --limit 1800
