# Two entry points on a fresh machine: `make demo` and `make test`.
# Each bootstraps what it needs with the interpreter in $(PYTHON); a venv is
# reinstalled only when the packages' sources or metadata change (a stamp
# file per venv records the last install).

PYTHON ?= python3
# Lowest branch coverage of the core (forked children counted) that passes.
# 97, not 98: the recovery lines that only an exception injected with
# sys.settrace reaches (tests/test_attack_lines.py, test_lease.py,
# test_guarantees.py) run while the injector, not coverage, traces the
# thread, so coverage cannot see them on CPython 3.11 (measured: 97.5 %).
COVERAGE_MIN ?= 97
# The CPython versions CI runs on; an absent interpreter is skipped with a
# line saying so. Each needs $(PYENV_ROOT)/versions/<version>/bin/python.
PYENV_ROOT ?= $(HOME)/.pyenv
MATRIX ?= 3.10.13 3.11.7 3.12.1 3.13.0
# Options for the demo: make demo ARGS="--threads 4 --attempts 60".
ARGS ?=

# One uv for every venv, in its own tools venv.
TOOLS := .venv-tools
UV := $(TOOLS)/bin/uv
VENV := .venv
BIN := $(VENV)/bin
# What an install copies: a change to any of these reinstalls.
SOURCES := pyproject.toml poolkeeper-watch.pth adapters/daytona/pyproject.toml \
	adapters/daytona/demo/pyproject.toml \
	$(shell find poolkeeper adapters/daytona/poolkeeper_daytona \
		adapters/daytona/demo/poolkeeper_daytona_demo \
		-name '*.py' -o -name py.typed)
PACKAGES := --reinstall-package poolkeeper --reinstall-package poolkeeper-daytona \
	. "./adapters/daytona[sdk]"
ADAPTER_TEST := --group adapters/daytona/pyproject.toml:test
# The demo is a package of its own beside the adapter (never in its wheel):
# the dev venv (its tests) and the demo venv install it.
DEMO_PACKAGE := --reinstall-package poolkeeper-daytona-demo ./adapters/daytona/demo

.PHONY: demo quickstart demo-smoke core-only no-sdk test venv lint typecheck unit \
	unit-core machines instructions unit-adapter sdks coverage doctest matrix pip-compat sdk-matrix \
	freethreaded freethreaded-run bench bench-otel bench-freethreaded docs sdist clean \
	stress

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install --quiet --upgrade pip uv

# The development venv: both packages as users get them (wheels, not the
# source tree), so the tests exercise what a wheel ships, plus every tool.
$(VENV)/.installed: $(UV) $(SOURCES)
	test -x $(BIN)/python || $(UV) venv --quiet --seed --python $(PYTHON) $(VENV)
	$(UV) pip install --python $(BIN)/python --quiet $(PACKAGES) \
		$(DEMO_PACKAGE) --group dev --group sdks $(ADAPTER_TEST)
	touch $@

venv: $(VENV)/.installed

# The incident and its fix, live, on the embedded Daytona emulator. Its
# venv holds the two packages, the SDK, the demo package
# (adapters/daytona/demo) and matplotlib (the PNG chart);
# no development tools.
DEMO := .venv-demo
$(DEMO)/.installed: $(UV) $(SOURCES)
	test -x $(DEMO)/bin/python || $(UV) venv --quiet --python $(PYTHON) $(DEMO)
	$(UV) pip install --python $(DEMO)/bin/python --quiet $(PACKAGES) \
		$(DEMO_PACKAGE) --group demo
	touch $@

demo: $(DEMO)/.installed
	$(DEMO)/bin/python -m poolkeeper_daytona_demo demo $(ARGS)

quickstart: $(DEMO)/.installed
	$(DEMO)/bin/python examples/quickstart.py

# The demo doubles as a smoke test: it exits 1 if the pooled phase's fds
# grow. Small settings keep it short.
demo-smoke: $(DEMO)/.installed
	$(DEMO)/bin/python -m poolkeeper_daytona_demo demo --threads 4 \
		--attempts 60 --no-progress
	$(DEMO)/bin/python examples/quickstart.py

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# pyright finds packages through the first python on PATH.
typecheck: venv
	$(BIN)/mypy
	cd adapters/daytona && ../../$(BIN)/mypy
	cd adapters/daytona/demo && ../../../$(BIN)/mypy
	PATH="$(CURDIR)/$(BIN):$$PATH" pyright
	cd /tmp && PATH="$(CURDIR)/$(BIN):$$PATH" pyright \
		--verifytypes poolkeeper --ignoreexternal

# The core suite, its state machines at full strength. tests/sdks runs
# in its own target (sdks). Not part of `make test`, which runs the same
# suite once, under coverage, and the state machines at full strength in
# their own target (machines).
unit-core: venv
	cd tests && ../$(BIN)/python -m pytest --ignore=sdks

# The Hypothesis state machines over real threads at full strength (the
# ci profile: 2,000 examples, healing's 300); coverage runs them short
# (the cov profile's 100).
machines: venv
	cd tests && HYPOTHESIS_PROFILE=ci ../$(BIN)/python -m pytest -q \
		-p no:cacheprovider test_concurrency.py test_healing_machine.py

# The hit path in instructions (callgrind; CPython 3.11): not under
# coverage, whose tracer its children leave out anyway.
instructions: venv
	cd tests && ../$(BIN)/python -m pytest -q -p no:cacheprovider \
		test_hit_instructions.py

# The core suite again under coverage (.ci/coverage): branch coverage of
# poolkeeper/, subprocesses and forked children included (coverage's patch
# = fork, _exit and subprocess), must reach $(COVERAGE_MIN) %. The state
# machines run the dev profile there.
coverage: venv
	COVERAGE_MIN=$(COVERAGE_MIN) .ci/coverage

unit-adapter: venv
	cd adapters/daytona && ../../$(BIN)/pytest
	cd adapters/daytona/demo && ../../../$(BIN)/pytest

unit: unit-core unit-adapter

# Every code block of README.md, docs/ and the adapter's README.md runs
# (Sybil; see conftest.py).
doctest: venv
	$(BIN)/python -m pytest -p no:cacheprovider README.md docs \
		adapters/daytona/README.md

# Warnings are errors, and every cross-reference must resolve (-n).
docs: venv
	$(BIN)/sphinx-build -q -W --keep-going -n -b html docs docs/_build/html

# The core alone, as a user without any SDK gets it: no daytona, no Ray.
CORE := .venv-core
$(CORE)/.installed: $(UV) $(SOURCES)
	test -x $(CORE)/bin/python || $(UV) venv --quiet --python $(PYTHON) $(CORE)
	$(UV) pip install --python $(CORE)/bin/python --quiet \
		--reinstall-package poolkeeper . --group test
	touch $@

# The adapter without the SDK, as a project that keeps provider SDKs
# optional gets it in its CPU CI (radixark/miles): the adapter's tests'
# sdk_optional_project/, its module-level singletons, no daytona, aiohttp,
# socketio or dotenv installed. The adapter suite runs the same project
# with the SDK (the SDK job) and with it hidden.
NOSDK := .venv-nosdk
$(NOSDK)/.installed: $(UV) $(SOURCES)
	test -x $(NOSDK)/bin/python || $(UV) venv --quiet --python $(PYTHON) $(NOSDK)
	$(UV) pip install --python $(NOSDK)/bin/python --quiet \
		--reinstall-package poolkeeper --reinstall-package poolkeeper-daytona \
		. ./adapters/daytona $(ADAPTER_TEST)
	touch $@

no-sdk: $(NOSDK)/.installed
	for m in daytona aiohttp socketio dotenv; do \
		! $(NOSDK)/bin/python -c "import $$m" 2>/dev/null || exit 1; done
	cd adapters/daytona/tests/sdk_optional_project && \
		../../../../$(NOSDK)/bin/python -m pytest -q -p no:cacheprovider \
		-W error -rs

# The whole suite runs on every CPython of the matrix, with the adapter
# and the SDK installed; here, without them, the tests of what their
# absence changes: no hooks registered by an entry point, OpenTelemetry
# absent, the public API, decorating and building, the check CLI, forks.
CORE_ONLY_TESTS := test_adapters.py test_events_core.py test_exports.py \
	test_decorator.py test_build.py test_keys.py test_fork.py test_check.py \
	test_close.py test_watch.py
core-only: $(CORE)/.installed
	! $(CORE)/bin/python -c "import daytona" 2>/dev/null
	! $(CORE)/bin/python -c "import poolkeeper_daytona" 2>/dev/null
	$(CORE)/bin/python -c "import sys, poolkeeper; \
		from poolkeeper import keys, process_singleton; \
		assert 'wrapt' in sys.modules; \
		extra = {'daytona', 'opentelemetry', 'httpx'} & set(sys.modules); \
		assert not extra, extra; \
		single = process_singleton(key=keys.env('PK_CORE_ONLY'))(object); \
		assert single() is single(); poolkeeper.close_all()"
	cd tests && HYPOTHESIS_PROFILE=dev ../$(CORE)/bin/python -m pytest -q \
		-p no:cacheprovider $(CORE_ONLY_TESTS)

# Real SDK clients (httpx, requests, urllib3, OpenAI, redis-py, boto3,
# gRPC) against servers that tests/sdks starts on 127.0.0.1 and stops.
# redis-server comes from the system (.ci/run installs it).
sdks: venv
	cd tests && ../$(BIN)/python -m pytest sdks -p no:cacheprovider

# The core and adapter suites on each CPython of $(MATRIX), each in its own
# venv (.venv-py<version>), the state machines with fewer examples. The
# version $(PYTHON) is runs coverage and unit-adapter instead. The one
# in $(WRAPT_OLD_ON) runs both suites on wrapt 1.17.x, the lowest wrapt
# the core declares (every other venv has wrapt 2.x).
WRAPT_OLD_ON ?= 3.10.13
WRAPT_OLD := "wrapt>=1.17,<2"
.venv-py%/.installed: $(UV) $(SOURCES)
	test -x $(@D)/bin/python || $(UV) venv --quiet \
		--python $(PYENV_ROOT)/versions/$*/bin/python $(@D)
	$(UV) pip install --python $(@D)/bin/python --quiet $(PACKAGES) \
		--group test $(ADAPTER_TEST) $(if $(filter $(WRAPT_OLD_ON),$*),$(WRAPT_OLD))
	touch $@

py-%:
	@if [ ! -x $(PYENV_ROOT)/versions/$*/bin/python ]; then \
		echo "SKIPPED CPython $*: no $(PYENV_ROOT)/versions/$*/bin/python"; \
		exit 0; \
	fi; \
	if [ "$$($(PYTHON) -c 'import platform; print(platform.python_version())')" = "$*" ]; then \
		echo "CPython $* is $(PYTHON): coverage and unit-adapter ran it"; \
		exit 0; \
	fi; \
	$(MAKE) --no-print-directory .venv-py$*/.installed || exit 1; \
	.venv-py$*/bin/python -c "import importlib.metadata as m; \
		v = m.version('wrapt'); print('wrapt', v); \
		assert ('$*' == '$(WRAPT_OLD_ON)') == v.startswith('1.'), v" \
		|| exit 1; \
	status=0; \
	(cd tests && HYPOTHESIS_PROFILE=dev ../.venv-py$*/bin/python -m pytest \
		-q -p no:cacheprovider --ignore=processes/test_ray.py --ignore=sdks) \
		|| status=1; \
	(cd adapters/daytona && ../../.venv-py$*/bin/python -m pytest -q) \
		|| status=1; \
	exit $$status

matrix: $(addprefix py-,$(MATRIX))

# Every target runs, whatever failed before it; a summary lists them all.
# Three at a time (JOBS) on two cores: most of the suites' time is waiting
# (timers, threads, forks, servers), not computing (a core suite uses about
# 40 % of a core). Longest first, so that the last to start are short: the
# coverage run, the three CPython suites, the free-threaded build and
# suite, then the adapter's suites (storm tests: 64 threads against the
# emulator, whose assertions are bounds derived from the code, not rates),
# then the short checks. The shared dev venv is made before any of them.
# The coverage run holds tests/sdks (the real-SDK suite; `make sdks` runs
# it alone). JOBS=2 took 24 min on a quiet machine, with the suites then in
# the tree.
JOBS ?= 3
test: venv
	@.ci/run-targets -j $(JOBS) coverage $(addprefix py-,$(MATRIX)) \
		freethreaded unit-adapter sdk-matrix machines instructions \
		pip-compat typecheck doctest demo-smoke docs core-only no-sdk \
		sdist lint

# The core's sdist holds the core's files only; the adapter's wheel holds
# the library only (no demo, no console script) and its hooks' entry point.
sdist: venv
	rm -rf dist/sdist-check
	$(UV) build --quiet --sdist --out-dir dist/sdist-check .
	$(BIN)/python .ci/check_sdist.py dist/sdist-check/*.tar.gz
	$(UV) build --quiet --wheel --out-dir dist/sdist-check adapters/daytona
	$(BIN)/python .ci/check_sdist.py --adapter-wheel \
		dist/sdist-check/poolkeeper_daytona-*.whl

bench: venv
	$(BIN)/python benchmarks/bench_hit_path.py

# The hit path with OpenTelemetry absent, importable, and recording (a
# MeterProvider set), side by side against functools.cache (issue 24).
bench-otel: venv
	$(BIN)/python benchmarks/bench_otel.py

clean:
	rm -rf $(VENV) $(TOOLS) $(DEMO) $(CORE) $(NOSDK) $(PIPV) $(PIPV)-current $(SDKV) \
		$(FT) .venv-py* dist \
		.pytest_cache .mypy_cache .ruff_cache .hypothesis .coverage .coverage.*

# --- Installing with an old pip; wrapt 1.17 and 2.x (issue 11) ---------
# pip as Python 3.11's venv ships it (23.2.1), never upgraded, installs
# both distributions from source beside the newest daytona, as users
# write it (`pip install poolkeeper-daytona daytona`), then with the sdk
# extra; `pip check` must agree. The current pip does the same first
# install in a venv of its own. The smoke checks run on wrapt 1.17.x and
# on 2.x; the core and adapter suites run on wrapt 1.17.x in py-$(WRAPT_OLD_ON)
# and on 2.x everywhere else.
PIPV := .venv-pip
pip-compat: $(UV)
	rm -rf $(PIPV)
	$(PYTHON) -m venv $(PIPV)
	$(PIPV)/bin/python -m pip --version
	$(PIPV)/bin/python -m pip install --quiet ./ ./adapters/daytona daytona
	$(PIPV)/bin/python -m pip check
	$(PIPV)/bin/python -c "from poolkeeper_daytona import daytona_client; \
		import daytona, importlib.metadata as m; daytona.Daytona; \
		assert m.version('daytona') == '$(SDK_NEWEST)', m.version('daytona')"
	$(PIPV)/bin/python -m pip install --quiet "./adapters/daytona[sdk]"
	$(PIPV)/bin/python -m pip check
	$(PIPV)/bin/python -m pip install --quiet "wrapt>=1.17,<2"
	$(PIPV)/bin/python -m pip check
	$(PIPV)/bin/python .ci/wrapt_smoke.py
	$(PIPV)/bin/python -m pip install --quiet "wrapt>=2"
	$(PIPV)/bin/python .ci/wrapt_smoke.py
	rm -rf $(PIPV)-current
	$(PYTHON) -m venv $(PIPV)-current
	$(PIPV)-current/bin/python -m pip install --quiet --upgrade pip
	$(PIPV)-current/bin/python -m pip --version
	$(PIPV)-current/bin/python -m pip install --quiet ./ ./adapters/daytona daytona
	$(PIPV)-current/bin/python -m pip check
	$(PIPV)-current/bin/python -c "import importlib.metadata as m; \
		assert m.version('daytona') == '$(SDK_NEWEST)', m.version('daytona')"

# --- The adapter on the oldest and newest daytona it declares ----------
# Keep in step with adapters/daytona/pyproject.toml and the adapter's
# TESTED_SDK_VERSIONS. unit-adapter runs the newest (the dev venv must
# have it); this target runs the lowest.
SDK_LOWEST := 0.203.0
SDK_NEWEST := 0.226.1
SDKV := .venv-sdk
sdk-matrix: venv
	$(BIN)/python -c "import importlib.metadata as m; \
		assert m.version('daytona') == '$(SDK_NEWEST)', m.version('daytona')"
	rm -rf $(SDKV)
	$(UV) venv --quiet --python $(PYTHON) $(SDKV)
	$(UV) pip install --python $(SDKV)/bin/python --quiet \
		. "./adapters/daytona[sdk]" "daytona==$(SDK_LOWEST)" $(ADAPTER_TEST)
	$(SDKV)/bin/python -c "import importlib.metadata as m; \
		assert m.version('daytona') == '$(SDK_LOWEST)'"
	cd adapters/daytona && ../../$(SDKV)/bin/python -m pytest -q

# --- Free-threaded CPython 3.14 (issue 22) -----------------------------
# shared/freethreaded/build.sh, beside the checkout, builds CPython 3.14.7
# with --disable-gil into $(FT_PREFIX) (about 10 minutes on 2 cores, once
# per machine: it does nothing when the prefix holds that build). A venv
# of it gets both packages and the test dependencies; the GIL must still
# be off after importing them (.ci/gil_off.py). Then the core suite, and
# the churn stress for longer and with more callers. Not the adapter's
# suite: on 3.14.7t its incident test counted fewer fds and threads after
# the clients closed than before it began ((22, 4) against (24, 5)), and
# its Socket.IO reconnect wait timed out once under load.
# Without ../shared (a clone of the repository alone) it is skipped with
# a line saying so, as an absent CPython of $(MATRIX) is.
FT_BUILD ?= $(CURDIR)/../shared/freethreaded/build.sh
FT_PREFIX ?= $(HOME)/.cache/poolkeeper/cpython-3.14.7t
FT_PYTHON := $(FT_PREFIX)/bin/python3.14t
FT := .venv-ft
FT_STRESS_SECONDS ?= 10
FT_STRESS_CALLERS ?= 8

$(FT)/.installed: $(UV) $(SOURCES) $(FT_PYTHON)
	test -x $(FT)/bin/python || $(UV) venv --quiet --python $(FT_PYTHON) $(FT)
	$(UV) pip install --python $(FT)/bin/python --quiet $(PACKAGES) \
		--group test $(ADAPTER_TEST)
	touch $@

# The skip decides in the shell; everything else is a rule of its own, so
# that `make -n freethreaded` (the docs' console blocks are checked that
# way) prints the steps instead of running them.
freethreaded:
	@if [ ! -f $(FT_BUILD) ]; then \
		echo "SKIPPED free-threaded CPython 3.14.7: no $(FT_BUILD)"; \
	else \
		$(MAKE) --no-print-directory freethreaded-run; \
	fi

$(FT_PYTHON): $(FT_BUILD)
	bash $(FT_BUILD) $(FT_PREFIX)

freethreaded-run: $(FT)/.installed
	$(FT)/bin/python .ci/gil_off.py
	status=0; \
	(cd tests && HYPOTHESIS_PROFILE=dev $(CURDIR)/$(FT)/bin/python -m pytest \
		-q -p no:cacheprovider -rs --ignore=processes/test_ray.py \
		--ignore=sdks) || status=1; \
	(cd tests && POOLKEEPER_STRESS_SECONDS=$(FT_STRESS_SECONDS) \
		POOLKEEPER_STRESS_CALLERS=$(FT_STRESS_CALLERS) \
		$(CURDIR)/$(FT)/bin/python -m pytest -q -p no:cacheprovider -s \
		test_stress.py -k churn) || status=1; \
	exit $$status

# The churn stress for minutes (not part of `make test`: CI's budget):
# tests/test_stress.py's churns (leases, key rotation, resets, close_all(),
# and with probes that fail and clients that age), STRESS_SECONDS each, on
# every installed CPython of $(MATRIX) and on the free-threaded build (once
# built: make freethreaded), one after the other. The default: 60 s a
# test, 8 tests, so 8 minutes a Python.
STRESS_SECONDS ?= 60
STRESS_CALLERS ?= 8
STRESS_PYTHONS := $(foreach v,$(MATRIX),$(if \
	$(wildcard $(PYENV_ROOT)/versions/$(v)/bin/python),.venv-py$(v)))
STRESS_PYTHONS += $(if $(wildcard $(FT_PYTHON)),$(FT))
stress: $(addsuffix /.installed,$(STRESS_PYTHONS))
	status=0; \
	for venv in $(STRESS_PYTHONS); do \
		echo "== $$venv"; \
		(cd tests && POOLKEEPER_STRESS_SECONDS=$(STRESS_SECONDS) \
			POOLKEEPER_STRESS_CALLERS=$(STRESS_CALLERS) \
			$(CURDIR)/$$venv/bin/python -m pytest -q -p no:cacheprovider \
			-s test_stress.py -k churn) || status=1; \
	done; \
	exit $$status

# The hit path against functools.cache, 1 and 2 threads, on the
# free-threaded build (make freethreaded first).
bench-freethreaded:
	$(FT)/bin/python benchmarks/bench_threads.py
