# The README's two commands. Both start from nothing: they create .venv, install the
# pinned CPU torch wheel first (an unpinned torch would pull a multi-GB CUDA build),
# then parc itself with its dev extra.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m parc.codegen.demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 2 tests

clean:
	rm -rf $(VENV) build .pytest_cache
