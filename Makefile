# Two commands on a fresh machine (Python >= 3.11 as $(PYTHON)):
#   make run    set up .venv, then start the local stack (worker, scheduler, frontend) on the demo model
#   make test   set up .venv, then run the whole test suite, slow end-to-end tests included
# Setup runs again only when pyproject.toml changes (the stamp file is keyed on its hash).

PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
# Extra pip arguments for torch, e.g. TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
# where PyPI's default torch wheel is a CUDA build you do not want.
TORCH_PIP_ARGS ?=
ARGS ?=
PYTEST_ARGS ?=

VENV_PYTHON := $(VENV)/bin/python
SETUP_KEY := $(shell sha256sum pyproject.toml | cut -c1-16)
STAMP := $(VENV)/.dsv4serve-setup-$(SETUP_KEY)

.PHONY: run test setup protos
.DEFAULT_GOAL := run

setup: $(STAMP)

# The CPU build of torch goes in first, so the project install does not pull a CUDA build.
$(STAMP):
	@test -x $(VENV_PYTHON) || $(PYTHON) -m venv $(VENV)
	$(VENV_PYTHON) -m pip install --quiet "torch==$(TORCH_VERSION)" $(TORCH_PIP_ARGS)
	$(VENV_PYTHON) -m pip install --quiet -e '.[test]'
	@rm -f $(VENV)/.dsv4serve-setup-*
	@touch $@

run: setup
	$(VENV)/bin/dsv4serve stack $(ARGS)

test: setup
	$(VENV_PYTHON) -m pytest -q $(PYTEST_ARGS)

protos: setup
	$(VENV_PYTHON) -m services.common.gen_protos
