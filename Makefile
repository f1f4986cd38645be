# One command checks everything: `make test`. `make demo` runs the main range job.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test lint demo install clean bench

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check lease tasks beat devtools bench examples tests
	$(VENV)/bin/mypy

# The suite mostly waits on lease TTLs, so it runs side by side: each xdist worker has its own
# Redis databases and database schemas (tests/__init__.py). PYTEST_WORKERS=0 runs it serially.
PYTEST_WORKERS ?= 6

# Compiled once here: with PYTHONDONTWRITEBYTECODE set (CI sets it) every worker, beat and CLI
# a test starts would compile the project's modules again (about 0.1 s of CPU each).
test: lint
	$(PY) -m compileall -q lease tasks beat devtools bench examples tests > /dev/null
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist worksteal --durations=40 $(PYTEST_ARGS)

demo: $(STAMP)
	$(PY) -m devtools demo $(DEMO_ARGS)

clean:
	rm -rf $(VENV) *.egg-info
