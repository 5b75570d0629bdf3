# kfactory: the two commands a newcomer needs are `make demo` and `make test`.
PYTHON ?= python3
BUDGET ?= 40
# test workers: most tests wait on servers and child processes, so three workers fill a 2-core machine (by vmstat
# over the parallel phase on the project's 2-core host, two left the cores 11% idle, three 2%)
WORKERS ?= 3

.PHONY: install demo test test-only lint proto bench clean image

# The editable install, then the tree byte-compiled: an editable install compiles nothing, and where
# PYTHONDONTWRITEBYTECODE is set (as on the project's development hosts) every service, runner and command, each a
# fresh interpreter, compiled kfactory's sources again at its start (0.15-0.25 s of CPU each, bench/startup.py;
# 6.5% of the subprocess-heavy tests' CPU). A file edited since is compiled at each start again until the next
# `make install`. tests/: its helper modules (pytest keeps its own bytecode of the test files).
install:
	$(PYTHON) -m pip install -q -e ".[dev]"
	$(PYTHON) -m compileall -q kfactory tests

demo: install
	kfactory run softmax --target cpu --budget $(BUDGET) --json out.json

# the install first, then the tests (a recipe, not a second prerequisite: `make -j test` would run them at once)
test: install
	$(MAKE) test-only

# the tests without installing first (.ci/run has installed for its lint: a second install costs 15 s). The tests
# marked `serial` judge kernels by their timing, so they run alone, after the rest; each phase prints its slowest
# tests, to keep CI within its 20 minutes
test-only:
	$(PYTHON) -m pytest -q -n $(WORKERS) --dist loadfile -m "not slow and not serial" --durations=15
	$(PYTHON) -m pytest -q -m "serial and not slow" --durations=10

# every check runs even when an earlier one fails, so one run shows all that is left; the exit status is 1 if any failed
LINT_PATHS ?= kfactory tests bench scripts deploy
lint:
	@status=0; \
	echo "== ruff"; $(PYTHON) -m ruff check $(LINT_PATHS) || status=1; \
	echo "== mypy"; $(PYTHON) -m mypy $(LINT_PATHS) || status=1; \
	echo "== import cycles"; $(PYTHON) scripts/check_import_cycles.py kfactory || status=1; \
	exit $$status

proto:
	$(PYTHON) scripts/gen_proto.py

bench: install
	$(PYTHON) bench/pipeline_overhead.py

clean:
	rm -rf reports out.json .pytest_cache build *.egg-info

# the service image, two targets (cpu, cuda) of one Dockerfile; IMAGE=registry/name to push elsewhere
IMAGE ?= kfactory
VERSION ?= $(shell $(PYTHON) -c "import tomllib; print(tomllib.load(open('pyproject.toml', 'rb'))['project']['version'])")
ENGINE ?= $(shell command -v docker 2>/dev/null || command -v podman 2>/dev/null)

image:
	@if [ -z "$(ENGINE)" ]; then \
	  echo "make image: no container engine here: install docker or podman (or set ENGINE=...)" >&2; exit 1; fi
	@$(ENGINE) info >/dev/null 2>&1 || { \
	  echo "make image: $(ENGINE) is installed but cannot reach its engine (is the daemon running?)" >&2; exit 1; }
	$(ENGINE) build --target cpu -t $(IMAGE):$(VERSION)-cpu .
	$(ENGINE) build --target cuda -t $(IMAGE):$(VERSION)-cuda .
