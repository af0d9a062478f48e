# Set-up and checks. Every target builds its own virtual environment in .venv,
# installing torch==2.13.0 (the CPU build on this machine's disk) before anything
# that depends on torch, so no CUDA build is ever pulled in by accident.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PLUGINS := plugins/qwen3_tts plugins/moss_tts plugins/qwen3_omni plugins/qwen3_asr examples/plugin
EXAMPLE ?= examples/qwen3_tts_demo.toml
REFERENCE_VENV ?= /tmp/qwen-tts-ref
# pip's errors only (-qq). One --quiet still prints every build backend's notes
# (setuptools' "Editable installation" box, once per package) and, on machines
# whose pip.conf lists file:// extra indexes without a directory for every
# project (this one: /etc/pip.conf), a "Location ... is ignored" line per
# package and index; neither asks anything of the user. Failures still print.
PIP_QUIET := --quiet --quiet

.PHONY: install test test-all lint format plan serve bench test-reference clean browser

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install $(PIP_QUIET) --upgrade pip

# pip compiles the bytecode of what it installs, but not of editable sources: where
# PYTHONDONTWRITEBYTECODE is set (this machine, CI) every `omni` command would
# recompile them, ~15% of `omni config`'s start-up (benchmarks/bench_cli.py).
$(STAMP): $(BIN)/python pyproject.toml $(addsuffix /pyproject.toml,$(PLUGINS))
	$(BIN)/pip install $(PIP_QUIET) torch==2.13.0
	$(BIN)/pip install $(PIP_QUIET) -e ".[test,gpu,audio,ray]" $(addprefix -e ,$(PLUGINS)) openai
	# Japanese word timings' splitter (omni-qwen3-asr[ja], ~80 MB), so its tests run here too
	$(BIN)/pip install $(PIP_QUIET) -e "plugins/qwen3_asr[ja]"
	$(BIN)/python -m compileall -q omni_core $(foreach p,$(PLUGINS),$(p)/omni_*)
	touch $(STAMP)
	@echo "installed: $(BIN)/omni (try: $(BIN)/omni plugins list)"

install: $(STAMP)

# One worker per core and one more (pytest-xdist); a file's tests stay on one worker, so a
# module's server or cluster starts once, the longest modules first (conftest.py:
# LONGEST_FIRST). The extra worker fills the time the others wait on the processes and
# servers their tests start: with one per core the two cores here were busy 61 % of the
# run; 2, 3 and 4 workers took 317-327, 250 and 268 s.
# PYTEST_WORKERS=0 runs in this process (for -x, pdb).
PYTEST_WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) + 1 )))
PYTEST_PARALLEL := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder)

# pytest rewrites every test module's asserts as it collects them (6 s of each worker's
# 12 s here) and keeps the result as bytecode only where bytecode may be written: the
# suite runs with PYTHONDONTWRITEBYTECODE unset (this machine and CI set it), so a later
# run reads it back. The files land in __pycache__ directories, which git ignores.
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest

test: $(STAMP)
	$(PYTEST) -q $(PYTEST_PARALLEL)

# Everything, the slow end-to-end cases too (run before calling an issue done).
test-all: $(STAMP)
	$(PYTEST) -q --slow $(PYTEST_PARALLEL)

# The playground's browser tests drive a real headless Chromium through Playwright, using
# Debian's chromium package (Playwright's own browser downloads are not used). Installed
# here when missing and apt can (root); otherwise the tests skip, saying why.
CHROMIUM ?= /usr/bin/chromium
browser:
	@if [ -x "$(CHROMIUM)" ] || command -v chromium >/dev/null 2>&1; then \
	  echo "chromium: $$(command -v chromium || echo $(CHROMIUM))"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
	    && echo "chromium: installed $$(command -v chromium)"; } \
	  || echo "chromium could not be installed (apt-get failed): the browser tests will skip"; \
	else \
	  echo "chromium is missing and cannot be installed here (needs root and apt-get):"; \
	  echo "  install Debian's chromium package, or set OMNI_CHROMIUM; the browser tests skip meanwhile"; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

plan: $(STAMP)
	$(BIN)/omni plan $(EXAMPLE)

serve: $(STAMP)
	$(BIN)/omni serve $(EXAMPLE)

# Opt-in parity with the official implementations, each in its own environment,
# never in omni's: qwen-tts and transformers' qwen3_omni_moe (qwen-tts pins
# transformers 4.57.3, which has qwen3_omni_moe; see
# plugins/qwen3_tts/tests/REFERENCE.md), and OpenMOSS's MOSS-TTS (remote code for
# transformers 5.0.0, run from the sources at pinned commits; see
# plugins/moss_tts/tests/REFERENCE.md). Both environments see omni's CPU torch
# through a .pth file instead of downloading one.
MOSS_REFERENCE_VENV ?= /tmp/moss-tts-ref
MOSS_TTS_GIT ?= https://github.com/OpenMOSS/MOSS-TTS.git
MOSS_CODEC_GIT ?= https://github.com/OpenMOSS/MOSS-Audio-Tokenizer.git
MOSS_TTS_COMMIT ?= 58b20a0d5fcc6766658d50967a90a9d890009a46
MOSS_CODEC_COMMIT ?= 56df9eeb88f7236419dbf6328cd2e51f4dc21eeb

# The registry has no torchaudio for torch 2.13 and its wheels are CUDA builds
# whose extension cannot load here: 2.11.1 goes in without dependencies and its
# lib/*.so is moved aside, leaving the pure-Python functional.resample the MOSS
# processor imports. Built when the stamp is missing (a half-built directory is
# removed first).
.PHONY: moss-reference-env
moss-reference-env: $(STAMP)
	test -f $(MOSS_REFERENCE_VENV)/.omni-moss-ref || ( \
	  rm -rf $(MOSS_REFERENCE_VENV) && \
	  $(PYTHON) -m venv $(MOSS_REFERENCE_VENV) && \
	  echo "$(CURDIR)/$(VENV)/lib/python3.11/site-packages" \
	    > $(MOSS_REFERENCE_VENV)/lib/python3.11/site-packages/zz_omni_torch.pth && \
	  $(MOSS_REFERENCE_VENV)/bin/pip install $(PIP_QUIET) transformers==5.0.0 \
	    safetensors soundfile numpy tqdm && \
	  $(MOSS_REFERENCE_VENV)/bin/pip install $(PIP_QUIET) --no-deps torchaudio==2.11.1 && \
	  sp=$(MOSS_REFERENCE_VENV)/lib/python3.11/site-packages && \
	  mkdir -p $$sp/torchaudio/lib.cuda-disabled && \
	  mv $$sp/torchaudio/lib/*.so $$sp/torchaudio/lib.cuda-disabled/ && \
	  git clone --quiet --no-checkout $(MOSS_TTS_GIT) $(MOSS_REFERENCE_VENV)/src/MOSS-TTS && \
	  git -C $(MOSS_REFERENCE_VENV)/src/MOSS-TTS checkout --quiet $(MOSS_TTS_COMMIT) && \
	  git clone --quiet --no-checkout $(MOSS_CODEC_GIT) $(MOSS_REFERENCE_VENV)/src/MOSS-Audio-Tokenizer && \
	  git -C $(MOSS_REFERENCE_VENV)/src/MOSS-Audio-Tokenizer checkout --quiet $(MOSS_CODEC_COMMIT) && \
	  $(MOSS_REFERENCE_VENV)/bin/python -c "import transformers, torchaudio.functional, soundfile" && \
	  touch $(MOSS_REFERENCE_VENV)/.omni-moss-ref )

# Qwen3-ASR's release (qwen-asr 0.0.6, which pins transformers 4.57.6) in its own
# environment, seeing omni's CPU torch through a .pth file, with the word splitters
# its forced aligner pins (nagisa 0.2.11 on DyNet38's wheels, soynlp 0.0.493), which
# the word-list test compares omni's with. An environment built before they were
# added (with a stand-in nagisa package) gets them on the next run.
QWEN_ASR_REFERENCE_VENV ?= /tmp/qwen-asr-ref
.PHONY: qwen-asr-reference-env
qwen-asr-reference-env: $(STAMP)
	test -f $(QWEN_ASR_REFERENCE_VENV)/.omni-asr-ref || ( \
	  rm -rf $(QWEN_ASR_REFERENCE_VENV) && \
	  $(PYTHON) -m venv $(QWEN_ASR_REFERENCE_VENV) && \
	  echo "$(CURDIR)/$(VENV)/lib/python3.11/site-packages" \
	    > $(QWEN_ASR_REFERENCE_VENV)/lib/python3.11/site-packages/zz_omni_torch.pth && \
	  $(QWEN_ASR_REFERENCE_VENV)/bin/pip install $(PIP_QUIET) --no-deps qwen-asr==0.0.6 && \
	  $(QWEN_ASR_REFERENCE_VENV)/bin/pip install $(PIP_QUIET) transformers==4.57.6 \
	    accelerate==1.12.0 librosa soundfile nagisa==0.2.11 soynlp==0.0.493 && \
	  $(QWEN_ASR_REFERENCE_VENV)/bin/python -c "import qwen_asr, transformers" && \
	  touch $(QWEN_ASR_REFERENCE_VENV)/.omni-asr-ref )
	{ $(QWEN_ASR_REFERENCE_VENV)/bin/pip show -qq nagisa && \
	  $(QWEN_ASR_REFERENCE_VENV)/bin/pip show -qq soynlp; } >/dev/null 2>&1 || ( \
	  rm -rf $(QWEN_ASR_REFERENCE_VENV)/lib/python3.11/site-packages/nagisa && \
	  $(QWEN_ASR_REFERENCE_VENV)/bin/pip install $(PIP_QUIET) nagisa==0.2.11 soynlp==0.0.493 && \
	  $(QWEN_ASR_REFERENCE_VENV)/bin/python -c "import nagisa, soynlp.tokenizer" )

test-reference: $(STAMP) moss-reference-env qwen-asr-reference-env
	test -x $(REFERENCE_VENV)/bin/python || ( \
	  $(PYTHON) -m venv $(REFERENCE_VENV) && \
	  echo "$(CURDIR)/$(VENV)/lib/python3.11/site-packages" \
	    > $(REFERENCE_VENV)/lib/python3.11/site-packages/zz_omni_torch.pth && \
	  $(REFERENCE_VENV)/bin/pip install $(PIP_QUIET) --no-deps qwen-tts==0.1.1 && \
	  $(REFERENCE_VENV)/bin/pip install $(PIP_QUIET) transformers==4.57.3 accelerate==1.12.0 \
	    librosa einops sox onnxruntime && \
	  $(REFERENCE_VENV)/bin/pip install $(PIP_QUIET) --no-deps torchvision==0.28.0 pillow && \
	  sp=$(REFERENCE_VENV)/lib/python3.11/site-packages && \
	  mkdir -p $$sp/torchaudio/compliance && touch $$sp/torchaudio/__init__.py \
	    $$sp/torchaudio/compliance/__init__.py $$sp/torchaudio/compliance/kaldi.py )
	$(REFERENCE_VENV)/bin/pip show -qq qwen-omni-utils >/dev/null 2>&1 || \
	  $(REFERENCE_VENV)/bin/pip install $(PIP_QUIET) --no-deps qwen-omni-utils==0.0.9
	QWEN_TTS_REF_PYTHON=$(REFERENCE_VENV)/bin/python \
	  MOSS_TTS_REF_PYTHON=$(MOSS_REFERENCE_VENV)/bin/python \
	  MOSS_TTS_REF_SRC=$(MOSS_REFERENCE_VENV)/src \
	  QWEN_ASR_REF_PYTHON=$(QWEN_ASR_REFERENCE_VENV)/bin/python $(BIN)/pytest -q \
	  plugins/qwen3_tts/tests plugins/qwen3_omni/tests plugins/moss_tts/tests \
	  plugins/qwen3_asr/tests -m reference

# The opt-in SGLang engine backend (engine.backend = "sglang"): SGLang 0.5.23 in its own
# environment, .venv-sglang, with omni and its plugins installed in it, so
# `.venv-sglang/bin/omni serve ... --thinker.engine.backend sglang` works. SGLang pins
# torch 2.14.1 (the registry's CUDA build, which also runs on the CPU); its GPU-only
# requirements are left out (tests/support/sglang/requirements.txt). About 7 GB and 6
# minutes. On a machine without SGLang's CPU kernels (the registry has none) the
# test-only stand-in tests/support/sglang/sgl_kernel goes first on PYTHONPATH: SGLang then
# takes its pure-torch paths. Never put it on the path where the real kernels exist.
SGLANG_VENV ?= .venv-sglang
SGLANG_STAMP := $(SGLANG_VENV)/.omni-sglang
SGLANG_ENV := SGLANG_USE_CPU_ENGINE=1 PYTHONPATH=$(CURDIR)/tests/support/sglang
.PHONY: sglang-env test-sglang
$(SGLANG_STAMP): tests/support/sglang/requirements.txt pyproject.toml $(addsuffix /pyproject.toml,$(PLUGINS))
	rm -rf $(SGLANG_VENV)
	$(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/pip install $(PIP_QUIET) --upgrade pip
	$(SGLANG_VENV)/bin/pip install $(PIP_QUIET) -r tests/support/sglang/requirements.txt
	$(SGLANG_VENV)/bin/pip install $(PIP_QUIET) --no-deps sglang==0.5.23
	$(SGLANG_VENV)/bin/pip install $(PIP_QUIET) -e ".[test,audio]" $(addprefix -e ,$(PLUGINS))
	$(SGLANG_ENV) $(SGLANG_VENV)/bin/python -c "import sglang.srt.server_args"
	touch $(SGLANG_STAMP)
	@echo "installed: $(SGLANG_VENV)/bin/omni (export $(SGLANG_ENV) on a CPU)"

sglang-env: $(SGLANG_STAMP)

# The backend's tests in that environment: the ServerArgs table is current, and the
# thinker on SGLang equals the torch backend (text, media, batched, speech, abort, stop).
test-sglang: $(SGLANG_STAMP)
	$(SGLANG_ENV) $(SGLANG_VENV)/bin/python tools/gen_sglang_args.py --check
	$(SGLANG_ENV) OMNI_TEST_SGLANG=1 $(SGLANG_VENV)/bin/pytest -q -p no:cacheprovider \
	  tests/engine/test_sglang_settings.py plugins/qwen3_omni/tests/test_sglang_thinker.py

# Opt-in check that an agent framework nobody here wrote holds a spoken turn with omni's
# /v1/realtime: pipecat's OpenAI Realtime service, unchanged, in its own environment,
# .venv-agents (pipecat pins its own openai, websockets, numpy and pydantic ranges, which
# may drift from omni's). omni and its plugins go in exactly as $(STAMP) installs them,
# after torch==2.13.0 (the CPU build on this machine's disk: a bare torch requirement
# would pull the registry's multi-GB CUDA build); pipecat last, at an exact version.
AGENTS_VENV ?= .venv-agents
AGENTS_STAMP := $(AGENTS_VENV)/.omni-agents
PIPECAT_VERSION ?= 1.14.0
.PHONY: agents-env test-agents
$(AGENTS_STAMP): pyproject.toml $(addsuffix /pyproject.toml,$(PLUGINS))
	rm -rf $(AGENTS_VENV)
	$(PYTHON) -m venv $(AGENTS_VENV)
	$(AGENTS_VENV)/bin/pip install $(PIP_QUIET) --upgrade pip
	$(AGENTS_VENV)/bin/pip install $(PIP_QUIET) torch==2.13.0
	$(AGENTS_VENV)/bin/pip install $(PIP_QUIET) -e ".[test,gpu,audio,ray]" $(addprefix -e ,$(PLUGINS)) openai
	$(AGENTS_VENV)/bin/pip install $(PIP_QUIET) "pipecat-ai[openai]==$(PIPECAT_VERSION)"
	$(AGENTS_VENV)/bin/python -c "import pipecat.services.openai.realtime.llm"
	touch $(AGENTS_STAMP)
	@echo "installed: pipecat-ai $(PIPECAT_VERSION) in $(AGENTS_VENV)"

agents-env: $(AGENTS_STAMP)

# One spoken turn through a pipecat Pipeline against the qwen3-omni CPU demo server.
test-agents: $(AGENTS_STAMP)
	$(AGENTS_VENV)/bin/pytest -q -p no:cacheprovider plugins/qwen3_omni/tests/test_agent_framework.py

# Every benchmark at its full size (minutes each; a reference that is not installed is left
# out, saying so). Each also takes --smoke (tiny sizes, one repeat, seconds), which make test
# runs for every one of them (tests/benchmarks).
bench: $(STAMP)
	for script in benchmarks/bench_*.py; do $(BIN)/python $$script || exit 1; done

# On a machine with CUDA, under 10 minutes: the tests marked cuda, every examples/*_demo.toml
# served on the GPU in bf16 answering one request, and throughput / first audio / RTF at
# concurrency 1, 8, 32 with dummy weights at release sizes beside the peers' published figures,
# also written as JSON to $(GPU_CHECK_OUT). Without CUDA it exits 2 saying so.
GPU_CHECK_OUT ?= /tmp/omni-gpu-check.json

# For a GPU host without network: .whl/ holds omni's wheels and the dependencies that the
# host's image lacks (tools/gpu_image_packages.txt); tools/gpu_check_offline.sh runs the
# check there from them.
.PHONY: wheelhouse
wheelhouse: $(STAMP)
	$(BIN)/python tools/wheelhouse.py --out .whl
.PHONY: gpu-check
gpu-check: $(STAMP)
	$(BIN)/python benchmarks/gpu_check.py --out $(GPU_CHECK_OUT)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
