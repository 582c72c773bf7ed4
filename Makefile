# desktop-sandbox — see README.md. Every target installs what it needs into .venv (the controller and
# tests) and build/gateway-venv (the egress proxy, mitmproxy: its pins clash with httpx) on first use.
SYSTEM_PYTHON ?= python3
VENV ?= .venv
PYTHON := $(VENV)/bin/python
GATEWAY_VENV ?= build/gateway-venv
TASK ?= tasks/pickup.toml
ARGS ?=
IMAGE ?= desktop-sandbox:latest
# The image Dockerfile.desktop builds FROM (imported with debootstrap when absent and not pullable).
BASE ?= debian:bookworm-slim
# Guest architecture (amd64 | arm64); empty: the host's. A foreign one builds and runs under emulation
# (qemu-user-static; the image is tagged $(IMAGE)-ARCH, e.g. desktop-sandbox:latest-arm64).
ARCH ?=
# Test workers (pytest-xdist): a module's tests and the VM tier each stay on one worker.
TEST_WORKERS ?= 2
export PYTHONUNBUFFERED := 1
export DESKTOP_SANDBOX_GATEWAY_PYTHON ?= $(abspath $(GATEWAY_VENV))/bin/python

.PHONY: help prereqs deps desktop run-task test test-arm64 vm-image audit bench docs down

help:
	@echo "make desktop    build the guest image (imports a Debian base with debootstrap when no registry)"
	@echo "make run-task   run TASK=$(TASK): offline exercise without OPENAI_API_KEY, live model with it [ARGS=--ui]"
	@echo "make test       run every test (needs Xvfb, Docker, QEMU; see docs/tests.md)"
	@echo "make test-arm64 the arm64 tier under emulation: builds the arm64 image and VM disk, runs tests/arm64 (slow)"
	@echo "make audit      probe the sandbox's network policy from inside the guest [POLICY=file]"
	@echo "make bench      measure action, screenshot and settle latency (loopback vs xdotool/import, Docker sandbox vs its floor)"
	@echo "make docs       build the docs site into build/site (mkdocs build --strict: a broken link fails it)"
	@echo "make down       remove every sandbox container and network left behind"

$(VENV)/.installed: pyproject.toml
	$(SYSTEM_PYTHON) -m venv $(VENV)
	$(PYTHON) -m pip install -q --disable-pip-version-check -e '.[controller,test,af,docs,agents]'
	touch $@

# Rebuilt when this file changes: the pins are here.
$(GATEWAY_VENV)/.installed: Makefile
	$(SYSTEM_PYTHON) -m venv $(GATEWAY_VENV)
	$(GATEWAY_VENV)/bin/pip install -q --disable-pip-version-check 'mitmproxy==11.0.2' 'pydantic>=2.6' 'idna>=3.6' \
	  'fastapi>=0.110' 'uvicorn>=0.29'
	touch $@

deps: $(VENV)/.installed $(GATEWAY_VENV)/.installed

# Before any slow step: Docker, Python with venv, debootstrap when no registry answers (installed here as
# root, else one command to run and exit 2). See scripts/prereqs.sh.
prereqs:
	@SYSTEM_PYTHON=$(SYSTEM_PYTHON) bash scripts/prereqs.sh $(BASE) $(ARCH)

desktop: prereqs deps
	$(PYTHON) -m controller.cli build --tag $(IMAGE) --base $(BASE) $(if $(ARCH),--arch $(ARCH))

run-task: deps
	$(PYTHON) -m controller.cli run-task $(TASK) $(if $(ARCH),--arch $(ARCH)) --image $(IMAGE) $(ARGS)

test: deps
	$(PYTHON) -m pytest -q -rs --durations=15 -n $(TEST_WORKERS)

audit: deps
	$(PYTHON) -m controller.cli audit --image $(IMAGE) $(if $(POLICY),--policy $(POLICY)) --json $(or $(AUDIT_JSON),runs/audit.json)

bench: deps
	$(PYTHON) -m controller.cli bench --image $(IMAGE)

# The docs site (mkdocs.yml): docs/ rendered into build/site; any warning (a broken link or anchor, a page
# left out of the nav) fails the build.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict

# The arm64 tier (tests/arm64, marker arm64): opt-in, not part of `make test`. Builds what it needs first
# (cached after the first time: about 10 min for the image, more for the VM disk, on 2 cores).
test-arm64: deps
	nice -n 10 $(PYTHON) -m controller.cli build --tag $(IMAGE) --arch arm64
	nice -n 10 bash scripts/build-vm-image.sh --arch arm64
	DESKTOP_SANDBOX_ARM64=1 $(PYTHON) -m pytest -q -rs -m arm64 tests/arm64 $(ARGS)

# The VM disk (scripts/build-vm-image.sh) for ARCH (default the host's).
vm-image:
	bash scripts/build-vm-image.sh $(if $(ARCH),--arch $(ARCH))

down: deps
	$(PYTHON) -m controller.cli down --all
