# Two commands do all the set-up on a fresh machine (Python 3.10+):
#   make demo   - create .venv, install pipesim, simulate and draw built-in examples
#   make test   - create .venv, install pipesim with its dev and verify extras, run every test
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check -q
OUT ?= out

.PHONY: demo test lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(PIP) install -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml constraints/ci.txt | $(BIN)/python
	$(PIP) install -c constraints/ci.txt -e '.[dev,verify]'
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	@mkdir -p $(OUT)
	$(BIN)/pipesim simulate gpipe --stages 2 --microbatches 4 --forward-only --grid
	$(BIN)/pipesim simulate 1f1b --stages 4 --microbatches 8 --activation-bytes 1000
	$(BIN)/pipesim simulate interleaved-1f1b --stages 4 --microbatches 8 --virtual 2 --json

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check pipesim verify tests benchmarks
	$(BIN)/ruff format --check pipesim verify tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache .mypy_cache .ruff_cache
