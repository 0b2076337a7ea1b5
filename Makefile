# Two entry points on a fresh machine: `make demo` and `make test`.
# Each bootstraps .venv with the interpreter in $(PYTHON).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
UV := $(BIN)/uv pip install --python $(BIN)/python --quiet

.PHONY: demo quickstart demo-smoke core-only test venv lint typecheck unit sdks bench docs clean

$(BIN)/uv:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip uv

# Install the packages as users get them (not the source tree), so the
# tests exercise what a wheel ships.
venv: $(BIN)/uv
	$(UV) --reinstall-package poolkeeper --reinstall-package poolkeeper-daytona \
		".[test,lint,bench,docs,ray]" "./adapters/daytona[test]"

# The incident and its fix, live, on the embedded Daytona emulator.
demo: venv
	$(BIN)/poolkeeper-daytona demo

quickstart: venv
	$(BIN)/python examples/quickstart.py

# The demo doubles as a smoke test: it exits 1 if the pooled phase's fds
# grow. Small settings keep it short.
demo-smoke: venv
	$(BIN)/poolkeeper-daytona demo --threads 4 --attempts 60 --no-progress
	$(BIN)/python examples/quickstart.py

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# pyright finds packages through the first python on PATH.
typecheck: venv
	$(BIN)/mypy
	cd adapters/daytona && ../../$(BIN)/mypy
	PATH="$(CURDIR)/$(BIN):$$PATH" pyright
	cd /tmp && PATH="$(CURDIR)/$(BIN):$$PATH" pyright \
		--verifytypes poolkeeper --ignoreexternal

unit: venv
	cd tests && ../$(BIN)/python -m pytest --ignore=sdks
	cd adapters/daytona && ../../$(BIN)/pytest

# Warnings are errors, and every cross-reference must resolve (-n).
docs: venv
	$(BIN)/sphinx-build -q -W --keep-going -n -b html docs docs/_build/html

# The core alone, as a user without any SDK gets it: no daytona, no Ray.
CORE := .venv-core
core-only:
	test -x $(CORE)/bin/uv || ($(PYTHON) -m venv $(CORE) && \
		$(CORE)/bin/python -m pip install --quiet --upgrade pip uv)
	$(CORE)/bin/uv pip install --python $(CORE)/bin/python --quiet \
		--reinstall-package poolkeeper ".[test]"
	! $(CORE)/bin/python -c "import daytona" 2>/dev/null
	cd tests && HYPOTHESIS_PROFILE=dev ../$(CORE)/bin/python -m pytest -q \
		-p no:cacheprovider --ignore=processes/test_ray.py --ignore=sdks

# Real SDK clients (httpx, requests, urllib3, OpenAI, redis-py, boto3,
# gRPC) against servers that tests/sdks starts on 127.0.0.1 and stops.
# redis-server comes from the system (.ci/run installs it).
sdks: venv
	$(UV) ".[sdks]"
	cd tests && ../$(BIN)/python -m pytest sdks -p no:cacheprovider

test: lint typecheck docs unit sdks core-only demo-smoke

bench: venv
	$(BIN)/python benchmarks/bench_hit_path.py

clean:
	rm -rf $(VENV) $(CORE) .pytest_cache .mypy_cache .ruff_cache .hypothesis
