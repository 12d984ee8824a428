# AccelPact: every target does its own set-up through `install`, which is idempotent.
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
PIP   := $(PY) -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.installed
WORKERS ?= 2

.PHONY: install test lint pytest modelcheck check demo bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@command -v java >/dev/null 2>&1 || { echo "java missing: installing a Java runtime with apt"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless >/dev/null; }
	@test -x $(PY) || python3 -m venv $(VENV)
	@# torch first, pinned: the CPU wheel on local disk (any other spec downloads gigabytes)
	@$(PY) -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null || $(PIP) install torch==2.13.0
	@$(PIP) install -e '.[dev]'
	@touch $(STAMP)
	@echo "installed: $$($(PY) -c 'import torch, transitions; print("torch", torch.__version__, "transitions", transitions.__version__)')"

lint: install
	$(VENV)/bin/ruff check .

pytest: install
	$(PY) -m pytest -q

modelcheck: install
	$(VENV)/bin/accelpact check --ranks 2 3 --workers $(WORKERS)

# What CI runs: lint, the whole test suite, and the 2- and 3-rank model checks.
test: lint pytest modelcheck

# The full model checks: 2, 3 and 4 ranks, plus every mutant.
check: install
	$(VENV)/bin/accelpact check --ranks 2 3 4 --workers $(WORKERS)
	$(VENV)/bin/accelpact check --mutants --conformance --workers $(WORKERS)

demo: install
	$(VENV)/bin/accelpact demo

bench: install
	$(PY) bench/rebind.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis *.egg-info
