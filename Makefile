# Set-up is part of every target: the first run makes .venv in the checkout; later runs reuse
# it until pyproject.toml changes. `make demo` installs the package alone (what the demo runs),
# showing pip's progress; every other target installs it with its test tools (the dev extra),
# which covers the demo too.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: demo test test-fast test-integration test-system lint schemas bench clean lock

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml
	@echo "make demo: installing compaction-worker and its runtime dependencies into $(VENV)" \
		"(the first time only; make test adds the test tools)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check --progress-bar on -e .
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(VENV)/bin/compactor up --config examples/demo.toml --submit examples/*-session.json --until-done

# The suite waits on real processes and sockets more than it computes: TEST_PROCS pytest-xdist
# processes, also on 2 cores. worksteal hands each process a contiguous run of the suite (so a
# module's shared fixtures are mostly set up once) and moves tests to idle processes at the end.
# (loadgroup would not group: pytest-xdist 3.8 cannot rename nodes under pytest 9.2.)
TEST_PROCS ?= 4
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_PROCS) --dist worksteal

# The tiers, each test's derived from its fixtures (tests/support/tiers.py); `make test` runs all
# three. The fast tier computes and waits on nothing, so one process per core is fastest; with
# `-m fast` a test that starts a process or connects a socket fails. It runs over every folder:
# a module of the integration tier may hold fast tests too.
FAST_PROCS ?= 2
test-fast: $(STAMP)
	$(PY) -m pytest -q -n $(FAST_PROCS) -m fast

test-integration: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_PROCS) --dist worksteal -m integration

test-system: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_PROCS) --dist worksteal -m system

lint: $(STAMP)
	$(VENV)/bin/ruff check worker tests bench examples
	$(VENV)/bin/mypy

# docs/schemas from the models; docs/openapi.json copied from the package's (worker/api/).
schemas: $(STAMP)
	$(PY) -m worker.wire.schemas
	$(PY) -m worker.api.spec

clean:
	rm -rf $(VENV) transcripts .pytest_cache .mypy_cache .ruff_cache

# requirements.lock: every runtime dependency pinned with hashes, for the Docker image (and any
# reproducible deployment). Resolved for every platform from Python 3.11 on; keeps the current
# pins that pyproject.toml still allows (LOCK_FLAGS=--upgrade moves to the newest allowed).
UV_VERSION := 0.13.8
# The extras the Docker image holds: `compactor serve`, and the S3 and PostgreSQL stores that
# running across hosts needs (the agent-framework adapters run in the agent, not here).
IMAGE_EXTRAS := http s3 postgres
LOCK_FLAGS ?=
lock: $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	$(VENV)/bin/uv pip compile pyproject.toml $(IMAGE_EXTRAS:%=--extra %) --universal \
		--python-version 3.11 --generate-hashes \
		--custom-compile-command "make lock" --output-file requirements.lock $(LOCK_FLAGS)
