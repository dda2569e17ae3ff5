# numastream — run `make help` for the targets.

SHELL := /bin/bash
.DEFAULT_GOAL := help

BUILD ?= build
BIN ?= bin
JOBS ?= $(shell nproc)
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo Ninja || echo "Unix Makefiles")

AGENT_BUILD := $(BUILD)/agent
AGENT_ASAN_BUILD := $(BUILD)/agent-asan
AGENT := $(BIN)/numastream-agent

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: deps
deps: ## Install the Debian packages the build needs (idempotent)
	@bash hack/install-deps.sh

##@ Agent (C++)

.PHONY: agent
agent: deps ## Build the C++ agent into bin/numastream-agent
	@cmake -S agent -B $(AGENT_BUILD) -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(AGENT_BUILD) -j $(JOBS)
	@mkdir -p $(BIN) && cp $(AGENT_BUILD)/numastream-agent $(AGENT)

.PHONY: agent-asan
agent-asan: deps ## Build the agent and its unit tests with AddressSanitizer + UBSan
	@cmake -S agent -B $(AGENT_ASAN_BUILD) -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=Debug -DNUMASTREAM_SANITIZE=ON -DNUMASTREAM_E2E=OFF >/dev/null
	@cmake --build $(AGENT_ASAN_BUILD) -j $(JOBS)

.PHONY: test-agent
test-agent: agent ## Agent unit and end-to-end tests (real processes on 127.0.0.1)
	@cd $(AGENT_BUILD) && ctest --output-on-failure -j $(JOBS)

.PHONY: test-agent-asan
test-agent-asan: agent-asan ## Agent unit tests under AddressSanitizer + UBSan
	@cd $(AGENT_ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		ctest --output-on-failure -j $(JOBS)

.PHONY: bench-agent
bench-agent: agent ## Codec speeds and loopback throughput vs the CPU-work limit
	@$(AGENT) bench all

##@ Whole project

.PHONY: test
test: test-agent test-agent-asan ## The whole suite
	@echo "make test: all suites passed"

.PHONY: demo
demo: agent ## The main job (today: a verified loopback stream between two agents)
	@bash hack/demo.sh

.PHONY: clean
clean: ## Remove build output
	rm -rf $(BUILD) $(BIN)
