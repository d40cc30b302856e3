# callqa: two set-up commands, both idempotent and fast on the second run.
#   make demo   install everything, start the broker, run the pipeline on the sample calls, show results
#   make test   same set-up, then ruff + mypy + the whole pytest suite against the real broker
#   make test-fast  the Kafka-free core (no broker, no slow tests), for the edit-test loop
#   make bench-check  the long accuracy and churn guards the suite runs a slice of (about 40 min; not in make test)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CALLQA := $(BIN)/callqa
STATE := .callqa
SYSTEM_PACKAGES := kcat pocketsphinx-testdata alsa-utils default-jre-headless maven prometheus openssl \
	festival festvox-us-slt-hts asterisk-core-sounds-en-wav asterisk-core-sounds-en \
	asterisk-moh-opsound-wav chromium-headless-shell sip-tester

# Tests run side by side in this many processes (pytest-xdist). More than the cores: much of the suite
# waits on real processes (a worker starting, a real-time replay, a rebalance), not on the CPU. A test file
# runs whole in one process (--dist loadfile), so a module fixture (a running worker, a replayed call) is
# made once and its tests keep their order; files go out longest first (tests/conftest.py,
# tests/file_seconds.json), not in xdist's most-tests-first order (--no-loadscope-reorder). (--dist loadgroup
# with xdist_group marks did not group tests under pytest 9.2 and xdist 3.8: a module's tests ran on three
# processes, each making the fixture.)
TEST_WORKERS ?= 3
PYTEST := $(BIN)/pytest -q -p no:cacheprovider --durations=20

.PHONY: demo test test-fast bench-check setup system venv kafka models library lint broker-stop clean

demo: setup
	$(CALLQA) broker start
	$(CALLQA) topics create
	$(BIN)/python -m pipeline.demo

test: setup
	@status=0; \
	$(CALLQA) broker start || exit 1; \
	trap '$(CALLQA) broker stop' EXIT; \
	$(BIN)/ruff check pipeline tests bench || status=1; \
	$(BIN)/mypy pipeline || status=1; \
	$(PYTEST) -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS) || status=$$?; \
	exit $$status

test-fast: setup
	$(PYTEST) -n 2 -m "not broker and not slow" $(PYTEST_ARGS)

# Every guard whole (pipeline/bench/checks.py): bench/results/check.json says met / not met per check, and
# the command exits 1 when one is not. Run it when the decoder, the front end, QA or the worker's recovery changes.
bench-check: setup
	$(CALLQA) broker start
	$(CALLQA) bench check

setup: system venv kafka models library

# Debian packages: the evaluation recordings (pocketsphinx, ALSA, the Asterisk prompts with their
# transcripts, Asterisk hold music as non-speech), kcat (an independent Kafka client for tests), Java + Maven,
# Prometheus + promtool (the dashboards' PromQL and the alert rules are run by tests; it is not started
# as a service), openssl (it makes the local SASL_SSL broker's certificates), chromium-headless-shell (the
# call pages are checked in a real browser by tests/web, through Playwright), sip-tester (SIPp, the
# independent SIP peer of tests/gateway/siprec). The stamp holds the package list it was made for, so
# adding a package to the list installs it on a machine that already has a stamp. None of these needs
# its recommended packages.
system:
	@mkdir -p $(STATE)
	@if [ "$$(cat $(STATE)/.system 2>/dev/null)" != "$(SYSTEM_PACKAGES)" ]; then \
	  missing=$$(for p in $(SYSTEM_PACKAGES); do \
	    dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	  if [ -n "$$missing" ]; then \
	    echo "installing Debian packages:" $$missing; \
	    SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	    $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	      $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null || exit 1; \
	  fi; \
	  echo "$(SYSTEM_PACKAGES)" > $(STATE)/.system; \
	fi

# uv (from PyPI, pinned) installs into the venv what pip would, from its own cache (~/.cache/uv): on a fresh
# clone of a machine that installed once, 8 s instead of pip's 47 s (measured here, 2 cores).
UV := $(BIN)/uv pip install -q --python $(BIN)/python
venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q 'uv==0.13.9'
	$(UV) -e '.[dev]'
	# silero-vad's wheel carries the ONNX VAD we use; its torch dependency is only for its own
	# Python wrapper, which callqa never imports.
	$(UV) --no-deps 'silero-vad==6.2.3'
	@touch $@

kafka: venv
	$(CALLQA) broker install

# Moonshine base (the default model), Moonshine tiny and Whisper tiny.en (CALLQA_MODEL=tiny.en: the test
# suite's workers, beam search and the previous-text prompt): a few seconds each, skipped when built for this
# graph format and revision.
models: venv
	$(CALLQA) models build tiny.en --if-needed
	$(CALLQA) models build moonshine-tiny --if-needed
	$(CALLQA) models build moonshine-base --if-needed

# The contact-center call library (samples/calls/library/): synthesised from the committed scripts with
# festival's slt voice (Debian) and piper's joe voice (PyPI) into a gitignored folder; skipped when the
# scripts, rules and builder are unchanged, and each utterance is cached per user (~/.cache/callqa/tts).
# The PCI calls (samples/calls/pci/) are a set of their own, so the library's figures do not move with them.
library: system venv
	$(BIN)/python scripts/build_call_library.py --if-needed
	$(BIN)/python scripts/build_call_library.py --if-needed --scripts samples/calls/pci/scripts --out samples/calls/pci/built

lint: venv
	$(BIN)/ruff check pipeline tests bench
	$(BIN)/mypy pipeline

broker-stop:
	$(CALLQA) broker stop

clean: broker-stop
	rm -rf $(STATE) $(VENV)
