# Two entry points on a fresh machine: `make demo` and `make test`.
# Each bootstraps .venv with the interpreter in $(PYTHON).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
UV := $(BIN)/uv pip install --python $(BIN)/python --quiet

.PHONY: demo quickstart demo-smoke core-only test venv lint typecheck unit sdks bench docs clean
.PHONY: pip-compat sdk-matrix

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

test: lint typecheck docs unit sdks core-only demo-smoke pip-compat sdk-matrix

bench: venv
	$(BIN)/python benchmarks/bench_hit_path.py

clean:
	rm -rf $(VENV) $(CORE) $(PIPV) $(SDKV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# --- Installing with an old pip; wrapt 1.17 and 2.x (issue 11) ---------
# pip as Python 3.11's venv ships it (23.2.1), never upgraded, installs
# both distributions from source; `pip check` must agree. Then the smoke
# checks and the core suite run on wrapt 1.17.x (the adapter's suite too),
# then on wrapt 2.x (the adapter's runs on 2.x in unit and sdk-matrix).
PIPV := .venv-pip
PIP_CORE_TESTS := cd tests && HYPOTHESIS_PROFILE=dev ../$(PIPV)/bin/python \
	-m pytest -q -p no:cacheprovider --ignore=processes/test_ray.py
pip-compat:
	rm -rf $(PIPV)
	$(PYTHON) -m venv $(PIPV)
	$(PIPV)/bin/python -m pip --version
	$(PIPV)/bin/python -m pip install --quiet ./ "./adapters/daytona[test]" \
		".[test]"
	$(PIPV)/bin/python -m pip check
	$(PIPV)/bin/python -c "from poolkeeper_daytona import daytona_client; \
		import daytona; daytona.Daytona; print(daytona_client)"
	$(PIPV)/bin/python -m pip install --quiet "wrapt>=1.17,<2"
	$(PIPV)/bin/python -m pip check
	$(PIPV)/bin/python .ci/wrapt_smoke.py
	$(PIP_CORE_TESTS)
	cd adapters/daytona && ../../$(PIPV)/bin/python -m pytest -q
	$(PIPV)/bin/python -m pip install --quiet "wrapt>=2"
	$(PIPV)/bin/python .ci/wrapt_smoke.py
	$(PIP_CORE_TESTS)

# --- The adapter on the oldest and newest daytona it declares ----------
# Keep in step with adapters/daytona/pyproject.toml and the adapter's
# TESTED_SDK_VERSIONS.
SDK_LOWEST := 0.203.0
SDK_NEWEST := 0.226.1
SDKV := .venv-sdk
sdk-matrix: venv
	for v in $(SDK_LOWEST) $(SDK_NEWEST); do \
		rm -rf $(SDKV) && $(PYTHON) -m venv $(SDKV) && \
		$(BIN)/uv pip install --python $(SDKV)/bin/python --quiet \
			. "./adapters/daytona[test]" "daytona==$$v" && \
		$(SDKV)/bin/python -c "import importlib.metadata as m; \
			assert m.version('daytona') == '$$v'" && \
		(cd adapters/daytona && ../../$(SDKV)/bin/python -m pytest -q) \
		|| exit 1; \
	done
