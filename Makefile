# numastream — run `make help` for the targets.

SHELL := /bin/bash
.DEFAULT_GOAL := help

BUILD ?= build
BIN ?= bin
JOBS ?= $(shell nproc)
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo Ninja || echo "Unix Makefiles")

K8S_VERSION := 1.36.4
K8S_BIN ?= $(HOME)/.cache/numastream/k8s-$(K8S_VERSION)
CONTROLLER_GEN := $(K8S_BIN)/controller-gen

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

##@ Operator (Go)

.PHONY: k8s-bins
k8s-bins: ## Build kube-apiserver, etcd and controller-gen from the Go module proxy (cached)
	@command -v go >/dev/null || { echo "Go 1.26 is needed (https://go.dev/dl)"; exit 1; }
	@BIN_DIR=$(K8S_BIN) COMPONENTS="envtest controller-gen" WRAPPER_SRC=hack/k8s-wrapper K8S_VERSION=$(K8S_VERSION) \
		bash hack/build-k8s-bins.sh | grep -v '^-\|^total\|^d' || true
	@test -x $(K8S_BIN)/kube-apiserver && test -x $(K8S_BIN)/etcd && test -x $(CONTROLLER_GEN)

.PHONY: generate
generate: k8s-bins ## Generate deepcopy code for the API types
	@$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...

.PHONY: manifests
manifests: k8s-bins ## Generate the CRD and RBAC into config/
	@$(CONTROLLER_GEN) crd rbac:roleName=numastream-operator paths=./api/... paths=./controllers/... \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac

.PHONY: verify-generated
verify-generated: generate manifests ## Fail when generated files are not committed
	@git diff --exit-code -- api config || { echo "generated files are stale: run make generate manifests and commit"; exit 1; }

.PHONY: operator
operator: ## Build the operator and the node daemon into bin/
	@go build -o $(BIN)/operator ./cmd/operator
	@go build -o $(BIN)/node-daemon ./cmd/node-daemon

.PHONY: test-operator
test-operator: k8s-bins verify-generated agent operator ## Operator + node daemon tests, envtest suites (real kube-apiserver + etcd)
	@go vet ./...
	@KUBEBUILDER_ASSETS=$(K8S_BIN) NUMASTREAM_REQUIRE_ENVTEST=1 \
		NUMASTREAM_AGENT=$(CURDIR)/$(AGENT) NUMASTREAM_REQUIRE_AGENT=1 go test -count=1 ./...

##@ Whole project

.PHONY: test
test: test-agent test-agent-asan test-operator ## The whole suite
	@echo "make test: all suites passed"

.PHONY: demo
demo: agent ## The main job (today: a verified loopback stream between two agents)
	@bash hack/demo.sh

.PHONY: clean
clean: ## Remove build output
	rm -rf $(BUILD) $(BIN)
