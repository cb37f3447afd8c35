# The two README commands: `make pretrain` (the main job) and `make test` (the suite; .ci/run calls it).
# Each creates ./.venv and installs the pinned requirements first (re-installs when they change).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export TF_CPP_MIN_LOG_LEVEL ?= 2

$(VENV)/.runtime-installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	touch $@

$(VENV)/.test-installed: requirements-test.txt $(VENV)/.runtime-installed
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-test.txt
	touch $@

.PHONY: install install-test pretrain test lint
install: $(VENV)/.runtime-installed
install-test: $(VENV)/.test-installed

# Main job: fetch + clean the embedded corpus, build the vocabulary, run a short pre-training.
pretrain: $(VENV)/.runtime-installed
	$(PY) -m t5x_like.data.prepare
	$(PY) -m t5x_like.train --gin_file=gin/runs/quickstart.gin $(ARGS)

lint: $(VENV)/.test-installed
	$(PY) -m ruff check t5x_like scripts tests notebooks

test: $(VENV)/.test-installed lint
	$(PY) -m pytest -q $(PYTEST_ARGS)
