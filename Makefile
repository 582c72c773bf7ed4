# desktop-sandbox — see README.md. Every target installs what it needs into .venv (the controller and
# tests) and build/gateway-venv (the egress proxy, mitmproxy: its pins clash with httpx) on first use.
SYSTEM_PYTHON ?= python3
VENV ?= .venv
PYTHON := $(VENV)/bin/python
GATEWAY_VENV ?= build/gateway-venv
TASK ?= tasks/pickup.toml
ARGS ?=
IMAGE ?= desktop-sandbox:latest
export PYTHONUNBUFFERED := 1
export DESKTOP_SANDBOX_GATEWAY_PYTHON ?= $(abspath $(GATEWAY_VENV))/bin/python

.PHONY: help deps desktop run-task test audit bench down

help:
	@echo "make desktop    build the guest image (imports a Debian base with debootstrap when no registry)"
	@echo "make run-task   run TASK=$(TASK): offline exercise without OPENAI_API_KEY, live model with it [ARGS=--ui]"
	@echo "make test       run every test (needs Xvfb, Docker, QEMU; see README)"
	@echo "make audit      probe the sandbox's network policy from inside the guest [POLICY=file]"
	@echo "make bench      measure action, screenshot and settle latency (loopback vs xdotool/import, Docker sandbox vs its floor)"
	@echo "make down       remove every sandbox container and network left behind"

$(VENV)/.installed: pyproject.toml
	$(SYSTEM_PYTHON) -m venv $(VENV)
	$(PYTHON) -m pip install -q --disable-pip-version-check -e '.[controller,test]'
	touch $@

$(GATEWAY_VENV)/.installed:
	$(SYSTEM_PYTHON) -m venv $(GATEWAY_VENV)
	$(GATEWAY_VENV)/bin/pip install -q --disable-pip-version-check 'mitmproxy==11.0.2' 'pydantic>=2.6' 'idna>=3.6'
	touch $@

deps: $(VENV)/.installed $(GATEWAY_VENV)/.installed

desktop: deps
	$(PYTHON) -m controller.cli build --tag $(IMAGE)

run-task: deps
	$(PYTHON) -m controller.cli run-task $(TASK) --image $(IMAGE) $(ARGS)

test: deps
	$(PYTHON) -m pytest -q -rs

audit: deps
	$(PYTHON) -m controller.cli audit --image $(IMAGE) $(if $(POLICY),--policy $(POLICY)) --json $(or $(AUDIT_JSON),runs/audit.json)

bench: deps
	$(PYTHON) -m controller.cli bench --image $(IMAGE)

down: deps
	$(PYTHON) -m controller.cli down --all
