# Set-up and checks. Every target creates the virtualenv (.venv) and installs the project first.
VENV ?= .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test lint demo bench soak

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

## The test suite (what CI runs).
test: $(STAMP)
	$(PYTHON) -m pytest

## ruff and mypy --strict.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy --strict mongolock_async examples tests/typing

## The demo, on an embedded MongoDB server it starts and stops itself.
demo: $(STAMP)
	$(VENV)/bin/mongolock demo

## Benchmarks (not part of the tests): installs redis-py and Debian's redis-server for the peer.
bench: $(STAMP)
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -e '.[bench]'
	command -v redis-server >/dev/null || (apt-get install -y -q redis-server || \
		(apt-get update -q && apt-get install -y -q redis-server))
	$(PYTHON) benchmarks/bench.py

## The soak (not part of the tests): 20 minutes of contention through crashes, pauses and fail points.
soak: $(STAMP)
	$(PYTHON) benchmarks/soak.py --minutes $(or $(MINUTES),20)
