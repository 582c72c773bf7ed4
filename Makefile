# desktop-sandbox — see README.md.
PYTHON ?= python3
TASK ?= tasks/pickup.toml
IMAGE ?= desktop-sandbox:latest
export PYTHONUNBUFFERED := 1

.PHONY: help desktop run-task test audit bench down

help:
	@echo "make desktop    build the guest image (imports a Debian base with debootstrap when no registry)"
	@echo "make run-task   run TASK=$(TASK): offline exercise without OPENAI_API_KEY, live model with it"
	@echo "make test       run every test (needs Xvfb; Docker tests need 'make desktop' first)"
	@echo "make audit      probe the sandbox's network policy from inside the guest"
	@echo "make bench      measure action and screenshot latency against xdotool/import"
	@echo "make down       remove every sandbox container and network left behind"

desktop:
	$(PYTHON) -m controller.cli build --tag $(IMAGE)

run-task:
	$(PYTHON) -m controller.cli run-task $(TASK)

test:
	$(PYTHON) -m pytest -q -rs

audit:
	$(PYTHON) -m controller.cli audit $(if $(POLICY),--policy $(POLICY)) --json $(or $(AUDIT_JSON),runs/audit.json)

bench:
	$(PYTHON) -m controller.cli bench

down:
	$(PYTHON) -m controller.cli down --all
