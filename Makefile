# Set-up and checks. Every target builds its own virtual environment in .venv,
# installing torch==2.13.0 (the CPU build on this machine's disk) before anything
# that depends on torch, so no CUDA build is ever pulled in by accident.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PLUGINS := plugins/qwen3_tts plugins/moss_tts plugins/qwen3_omni
EXAMPLE ?= examples/qwen3_tts.toml

.PHONY: install test lint format plan bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml $(addsuffix /pyproject.toml,$(PLUGINS))
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[test,gpu]" $(addprefix -e ,$(PLUGINS)) openai
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

plan: $(STAMP)
	$(BIN)/omni plan $(EXAMPLE)

bench: $(STAMP)
	for script in benchmarks/bench_*.py; do $(BIN)/python $$script || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
