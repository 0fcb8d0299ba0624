# Two commands do all the set-up on a fresh machine (Python 3.10+):
#   make demo   - create .venv, install pipesim, simulate and draw built-in examples
#   make test   - install chromium if missing (root + apt), create .venv, install pipesim
#                 with its dev and verify extras, run every test
#   make notebooks - install JupyterLab into .venv and open notebooks/
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check -q
OUT ?= out

.PHONY: demo test test-fast lint clean browser-deps notebooks

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
	$(BIN)/pipesim simulate gpipe --pipeline-parallel 2 --microbatches 4 --forward-only --grid
	$(BIN)/pipesim simulate 1f1b --pipeline-parallel 4 --microbatches 8 --activation-bytes 1e6
	$(BIN)/pipesim plot gpipe 1f1b interleaved-1f1b:v=2 \
		--compare --pipeline-parallel 4 --microbatches 8 --activation-bytes 1e6 -o $(OUT)/compare.html
	$(BIN)/pipesim trace 1f1b --pipeline-parallel 4 --microbatches 8 --link-latency 0.1 -o $(OUT)/1f1b-trace.json
	$(BIN)/pipesim plan --model llama2-7b --devices 16 --accelerator h100-sxm --global-batch 128 \
		--top 5 -o $(OUT)/plan.html
	@echo "open $(OUT)/compare.html and $(OUT)/plan.html in a browser; $(OUT)/1f1b-trace.json in ui.perfetto.dev"
	@echo "pipesim is installed in $(VENV): run $(BIN)/pipesim --help, or 'source $(BIN)/activate' first"

notebooks: $(VENV)/.installed
	$(PIP) install -e '.[notebooks]'
	$(BIN)/jupyter lab notebooks/

# Two pytest-xdist workers, one per core of the 2-core CI machine: most tests wait on a
# child process, a browser or a kernel part of the time. TEST_WORKERS=0 runs them in one.
TEST_WORKERS ?= 2
test: browser-deps $(VENV)/.installed-dev
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --durations=15

# While editing: every test but the slow, multi-process, browser and notebook ones.
# `make test` stays the CI command.
FAST := not slow and not dist and not browser and not notebook
test-fast: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -n auto -m "$(FAST)"

# The browser tests (pytest -m browser) open plots in Chrome or Chromium and fail without it:
# BROWSER_PATH when it names one (CI: the runner's Google Chrome), else Debian's chromium,
# which as root with apt this installs; otherwise say how.
browser-deps:
	@if [ -n "$$BROWSER_PATH" ] && [ -x "$$BROWSER_PATH" ]; then \
		:; \
	elif command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then \
		:; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	else \
		echo "browser tests need chromium: sudo apt-get install -y chromium (or make browser-deps as root), or set BROWSER_PATH to a Chrome binary"; \
	fi

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check pipesim verify tests benchmarks
	$(BIN)/ruff format --check pipesim verify tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache .mypy_cache .ruff_cache
