# The two commands of the README:
#   make demo   set up, start the local stack, run the main job (pause and resume live kernels)
#   make test   set up, run the whole test suite (it starts the services it needs)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
SDK    ?= /usr/lib/google-cloud-sdk

.PHONY: setup demo test test-unit lint bench clean-stack

$(BIN)/stasis: pyproject.toml
	@test -x $(SDK)/platform/cloud-firestore-emulator/cloud_firestore_emulator || \
	  { echo "missing the Firestore emulator of the Google Cloud CLI under $(SDK)"; exit 1; }
	@test -x $(SDK)/platform/pubsub-emulator/bin/cloud-pubsub-emulator || \
	  { echo "missing the Pub/Sub emulator of the Google Cloud CLI under $(SDK)"; exit 1; }
	@command -v java >/dev/null || { apt-get update && apt-get install -y default-jre-headless; }
	@# The dashboard tests drive Debian's Chromium (never a downloaded browser).
	@test -x /usr/bin/chromium || { apt-get update && apt-get install -y chromium; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e . --group dev --group jobs
	@# checkov pins packaging<24, which pytest 9 refuses: it gets a venv of its own.
	$(PYTHON) -m venv build/checkov-venv
	build/checkov-venv/bin/pip install --quiet 'checkov>=3.2,<4'
	@touch $@

setup: $(BIN)/stasis

demo: setup
	$(BIN)/python -m stack.demo

test: setup
	$(BIN)/python -m pytest tests --durations=20; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc

test-unit: setup
	$(BIN)/python -m pytest tests/unit -q

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

clean-stack:
	-$(BIN)/stasis down
