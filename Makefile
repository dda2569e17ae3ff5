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
HELM := $(K8S_BIN)/helm
# Helm keeps no state outside the build tree.
HELM_ENV := HELM_CACHE_HOME=$(CURDIR)/$(BUILD)/helm/cache HELM_CONFIG_HOME=$(CURDIR)/$(BUILD)/helm/config HELM_DATA_HOME=$(CURDIR)/$(BUILD)/helm/data

# One version for every binary and the chart (test/chart checks Chart.yaml against it).
VERSION := $(shell cat VERSION)
RELEASE_DIR ?= $(BUILD)/release/numastream-$(VERSION)
GO_LDFLAGS := -X github.com/numastream/numastream/internal/version.Version=$(VERSION)

# The C++ builds go through ccache when it is installed (hack/install-deps.sh): a fresh clone
# compiles only the files whose preprocessed text changed. Its cache lives with the other tool
# caches, shared by every checkout (paths below the checkout are hashed relative to it).
export CCACHE_DIR ?= $(HOME)/.cache/numastream/ccache
export CCACHE_BASEDIR ?= $(CURDIR)
export CCACHE_NOHASHDIR ?= 1
export CCACHE_MAXSIZE ?= 6G
CMAKE_LAUNCHER := $(shell command -v ccache >/dev/null 2>&1 && echo -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

AGENT_BUILD := $(BUILD)/agent
# More cmake options for `make agent` (the Dockerfile's builder: -DNUMASTREAM_TESTS=OFF).
AGENT_CMAKE_FLAGS ?=
AGENT_ASAN_BUILD := $(BUILD)/agent-asan
# AGENT_ARCH=arm64 make agent: cross-compiled on an x86-64 machine against Debian's arm64
# libraries installed beside its own (DEPS=build-arm64; the Dockerfile's builder for linux/arm64).
HOST_ARCH := $(shell dpkg --print-architecture 2>/dev/null || echo amd64)
AGENT_ARCH ?= $(HOST_ARCH)
ifneq ($(AGENT_ARCH),$(HOST_ARCH))
ifneq ($(AGENT_ARCH),arm64)
$(error AGENT_ARCH=$(AGENT_ARCH): the agent cross-compiles for arm64 only)
endif
AGENT_BUILD := $(BUILD)/agent-arm64
AGENT_CROSS_FLAGS := -DCMAKE_TOOLCHAIN_FILE=$(CURDIR)/agent/cmake/aarch64-linux-gnu.cmake
export PKG_CONFIG_LIBDIR := /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig
endif
AGENT_TSAN_BUILD := $(BUILD)/agent-tsan
AGENT := $(BIN)/numastream-agent

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: deps
# DEPS=build: only what building needs (the Dockerfile's builder).
DEPS ?= all
deps: ## Install the Debian packages the build needs (idempotent)
	@bash hack/install-deps.sh $(DEPS)

##@ Agent (C++)

.PHONY: agent
agent: deps ## Build the C++ agent into bin/numastream-agent
	@hack/quiet.sh "agent: cmake configure" -- cmake -S agent -B $(AGENT_BUILD) -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_LAUNCHER) $(AGENT_CROSS_FLAGS) $(AGENT_CMAKE_FLAGS)
	@cmake --build $(AGENT_BUILD) -j $(JOBS)
	@mkdir -p $(BIN) && cp $(AGENT_BUILD)/numastream-agent $(AGENT)

.PHONY: agent-asan
# The sanitizer builds take a lock on their build directory: make warm-tools may be building one.
agent-asan: deps ## Build the agent and all its tests with AddressSanitizer + UBSan
	@mkdir -p $(BUILD) && flock $(AGENT_ASAN_BUILD).lock hack/quiet.sh "agent-asan: cmake configure" -- cmake -S agent -B $(AGENT_ASAN_BUILD) -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=Debug -DNUMASTREAM_SANITIZE=ON -DNUMASTREAM_E2E=ON $(CMAKE_LAUNCHER)
	@flock $(AGENT_ASAN_BUILD).lock cmake --build $(AGENT_ASAN_BUILD) -j $(JOBS)

.PHONY: agent-tsan
agent-tsan: deps ## Build the agent, its unit and end-to-end tests with ThreadSanitizer
	@mkdir -p $(BUILD) && flock $(AGENT_TSAN_BUILD).lock hack/quiet.sh "agent-tsan: cmake configure" -- cmake -S agent -B $(AGENT_TSAN_BUILD) -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNUMASTREAM_TSAN=ON -DNUMASTREAM_E2E=ON $(CMAKE_LAUNCHER)
	@flock $(AGENT_TSAN_BUILD).lock cmake --build $(AGENT_TSAN_BUILD) -j $(JOBS) --target numastream-agent agent_unit_tests agent_e2e_tests

.PHONY: test-agent
test-agent: agent ## Agent unit, end-to-end (real processes) and fault tests (network namespaces, root)
	@cd $(AGENT_BUILD) && ctest --output-on-failure -j $(JOBS)

.PHONY: test-arm64
test-arm64: agent ## arm64 from this machine: the agent cross-compiled, its unit tests under qemu-aarch64, streams between arm64 and x86-64 both ways; the Go programs and their packages' tests
	@JOBS=$(JOBS) NUMASTREAM_AGENT=$(AGENT) GO_LDFLAGS="$(GO_LDFLAGS)" bash hack/arm64.sh $(BUILD)/arm64

.PHONY: test-oracles
# Side by side, two at a time, the longest first: most of their time is agents killed and
# restarted, DIALS starting and a browser rendering.
ORACLES := stream2_hdf5_test mx_programs_test preview_test hdf5_test nxmx_test dectris_decoder_test oracle_test
test-oracles: agent ## The agent's bslz4, HDF5 files, Stream V2 series files, NXmx master and data files and live preview held against the reference libraries (bitshuffle, lz4, h5py, hdf5plugin, cbor2, Pillow, the NeXus NXmx definition) and the field's programs (DIALS, silx, nxmx, DECTRIS's decoder), real EIGER2 frames and headless Chromium
	@PY=$$(bash hack/pyenv.sh) && export NUMASTREAM_AGENT=$(CURDIR)/$(AGENT) && \
		bash hack/side-by-side.sh 2 $(foreach t,$(ORACLES),"$$PY -W error::ResourceWarning test/codec/$(t).py")

.PHONY: test-faults
test-faults: agent ## Fault scenarios in network namespaces (root), with their figures
	@$(AGENT_BUILD)/agent_fault_tests

.PHONY: fuzz
fuzz: deps ## libFuzzer on the frame decoder, the receiving state machine, Stream V2 and the config parser (FUZZ_SECONDS each, default 60)
	@FUZZ_SECONDS=$${FUZZ_SECONDS:-60} bash hack/fuzz.sh

.PHONY: fuzz-long
fuzz-long: deps ## A long fuzzing run (FUZZ_SECONDS each, default 1800), growing the corpora kept under ~/.cache/numastream/fuzz-corpus
	@FUZZ_SECONDS=$${FUZZ_SECONDS:-1800} bash hack/fuzz.sh

.PHONY: test-fuzz
test-fuzz: deps ## A short fuzzing pass (10 s per target), part of make test
	@FUZZ_SECONDS=10 bash hack/fuzz.sh

.PHONY: test-agent-asan
# A small quarantine: ASan holds freed memory back, and the end-to-end tests bound the agents' RSS.
# Not under ASan: the three tests that pace a stream for half a minute or more to measure a rate
# or a plan's growth (a paced spill, adaptive threads, oversubscribed decompressors); the code
# they run is run under ASan by the shorter spill, fan-out and end-to-end tests beside them.
ASAN_NOT := ^(Spill.APacedSourceFasterThanTheSinkSpillsAndDrainsWithNothingLost|Adaptive.ACompressionBottleneckGrowsIntoTheIdleSendingCpus|EndToEnd.FileSinkKeepsEveryChunkWithOversubscribedDecompressors)$$
test-agent-asan: agent-asan ## Agent unit, end-to-end and fault tests, the agents under AddressSanitizer + UBSan
	@cd $(AGENT_ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:quarantine_size_mb=8 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		ctest --output-on-failure -j $(JOBS) -E '$(ASAN_NOT)'

.PHONY: test-agent-tsan
# ThreadSanitizer on what shares memory between threads: the unit tests (queues, pools, the spill,
# the governor) and the end-to-end tests that run whole senders and receivers with fan-out, spill,
# the onward hop and adaptive threads (agents built with TSan; a report fails the agent and so the
# test). Not the paced half-minute ones (as ASan). The end-to-end tests run as two shards side by
# side: they mostly wait on paced streams.
TSAN_E2E := FanOut.*:Spill.*:Adaptive.*-Spill.APacedSourceFasterThanTheSinkSpillsAndDrainsWithNothingLost:Adaptive.ACompressionBottleneckGrowsIntoTheIdleSendingCpus
test-agent-tsan: agent-tsan ## Agent unit tests and the fan-out, spill, onward-hop and adaptive end-to-end tests under ThreadSanitizer
	@cd $(AGENT_TSAN_BUILD) && export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:exitcode=66:suppressions=$(CURDIR)/agent/tsan.supp && \
		./agent_unit_tests --gtest_brief=1 && \
		bash $(CURDIR)/hack/side-by-side.sh 2 $(foreach i,0 1,"GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=$(i) ./agent_e2e_tests --gtest_brief=1 --gtest_filter='$(TSAN_E2E)'")

.PHONY: bench-agent
bench-agent: agent ## Codec speeds and loopback throughput vs the CPU-work limit
	@$(AGENT) bench all

.PHONY: bench-codecs
bench-codecs: agent ## bslz4 vs the reference bitshuffle library per core; lz4 vs bslz4 on loopback; HDF5 pass-through CPU per GB; send and receive processes from a file vs the CPU-work limit
	@PY=$$(bash hack/pyenv.sh) && NUMASTREAM_AGENT=$(CURDIR)/$(AGENT) $$PY hack/bench-codecs.py

.PHONY: bench-adaptive
bench-adaptive: agent ## placement.adaptive false vs true alternated (a 1-compressor plan and the agent's own; a steady and a changing stream): raw MB/s, CPU-s per GB, ratios
	@NUMASTREAM_AGENT=$(CURDIR)/$(AGENT) python3 hack/bench-adaptive.py

.PHONY: bench-stream2
bench-stream2: agent ## A simulated DECTRIS detector at fixed rates through the pipeline on loopback: highest sustained rate with 0 lost, CPU-s per GB and message rate against a bare ZeroMQ forwarder (SIZES=16,64,256: small synthetic messages)
	@NUMASTREAM_AGENT=$(CURDIR)/$(AGENT) python3 hack/bench-stream2.py

.PHONY: bench-fanout
bench-fanout: agent ## One stream into 1-4 lossless file consumers at once (sinks): gateway MB/s and CPU-s per GB, the cost of each extra consumer
	@NUMASTREAM_AGENT=$(CURDIR)/$(AGENT) python3 hack/bench-fanout.py

.PHONY: bench-onward
bench-onward: agent ## An onward consumer across a delay line (20 ms RTT, 0 and 0.1% loss, BBR and Reno) over 1, 2, 4, 8 connections: the far receiver's MB/s, medians and ratios (root)
	@NUMASTREAM_REQUIRE_REAL=1 $(AGENT_BUILD)/agent_fault_tests --gtest_also_run_disabled_tests --gtest_filter='*BenchOnward*'

##@ Operator (Go)

.PHONY: k8s-bins
k8s-bins: ## Build kube-apiserver, etcd, controller-gen and helm from the Go module proxy (cached)
	@command -v go >/dev/null || { echo "Go 1.26 is needed (https://go.dev/dl)"; exit 1; }
	@BIN_DIR=$(K8S_BIN) COMPONENTS="envtest controller-gen helm" WRAPPER_SRC=hack/k8s-wrapper K8S_VERSION=$(K8S_VERSION) \
		bash hack/build-k8s-bins.sh
	@test -x $(K8S_BIN)/kube-apiserver && test -x $(K8S_BIN)/etcd && test -x $(CONTROLLER_GEN) && test -x $(K8S_BIN)/helm

.PHONY: generate
generate: k8s-bins ## Generate deepcopy code for the API types
	@$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...

CRD_REF_DOCS_VERSION ?= 0.3.0
.PHONY: manifests
manifests: k8s-bins ## Generate the CRD and RBAC into config/ and the chart, docs/api-reference.md from the types; render config/default from the chart
	@$(CONTROLLER_GEN) crd rbac:roleName=numastream-operator paths=./api/... paths=./controllers/... \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	@go run ./hack/crd-versions -served v1alpha1 config/crd/bases/numastream.io_streampipelines.yaml config/crd/bases/numastream.io_storageroots.yaml
	@cp config/crd/bases/numastream.io_streampipelines.yaml config/crd/bases/numastream.io_storageroots.yaml \
		config/crd/bases/numastream.io_remotesites.yaml charts/numastream/files/crds/
	@cp config/rbac/role.yaml charts/numastream/files/rbac/operator-role.yaml
	@{ echo "# Generated by make manifests from charts/numastream (default values). Do not edit."; \
		$(HELM_ENV) $(HELM) template numastream charts/numastream --namespace numastream-system; } > config/default/numastream.yaml
	@$$(bash hack/build-go-tool.sh crd-ref-docs github.com/elastic/crd-ref-docs $(CRD_REF_DOCS_VERSION) github.com/elastic/crd-ref-docs) \
		--source-path=api/v1beta1 --config=hack/api-docs/config.yaml --renderer=markdown \
		--output-path=docs/api-reference.md --log-level=ERROR

.PHONY: verify-generated
verify-generated: generate manifests ## Fail when generated files are not committed
	@git diff --exit-code -- api config charts docs/api-reference.md || { echo "generated files are stale: run make generate manifests and commit"; exit 1; }

.PHONY: operator
operator: ## Build the operator and the node daemon into bin/
	@go build -ldflags "$(GO_LDFLAGS)" -o $(BIN)/operator ./cmd/operator
	@go build -ldflags "$(GO_LDFLAGS)" -o $(BIN)/node-daemon ./cmd/node-daemon

.PHONY: plugin
plugin: ## Build the kubectl plugin into bin/kubectl-numastream (copy it onto the PATH: kubectl numastream)
	@go build -ldflags "$(GO_LDFLAGS)" -o $(BIN)/kubectl-numastream ./cmd/kubectl-numastream

.PHONY: test-operator
# The end-to-end packages (test/e2e, test/facility, test/realnode) run in their own targets, with
# the clusters they need.
test-operator: k8s-bins monitoring-bins verify-generated agent operator ## Operator + node daemon tests, envtest suites (real kube-apiserver + etcd)
	@go vet ./...
	@$(HELM_ENV) $(HELM) lint --strict charts/numastream
	@KUBEBUILDER_ASSETS=$(K8S_BIN) NUMASTREAM_REQUIRE_ENVTEST=1 NUMASTREAM_MONITORING_BIN=$(MONITORING_BIN) \
		NUMASTREAM_AGENT=$(CURDIR)/$(AGENT) NUMASTREAM_REQUIRE_AGENT=1 \
		NUMASTREAM_HELM=$(HELM) $(HELM_ENV) go test -count=1 $$(go list ./... | grep -vE '/test/(e2e|facility|realnode)$$')

##@ Simulated facility cluster

K8S_SIM_BIN ?= $(HOME)/.cache/numastream/k8s-$(K8S_VERSION)-sim
SIM_DIR ?= /tmp/numastream-sim
SIM := BIN_DIR=$(K8S_SIM_BIN) SIM_DIR=$(SIM_DIR) bash hack/sim-cluster.sh

K8S_NODE_BIN ?= $(HOME)/.cache/numastream/k8s-$(K8S_VERSION)-node

.PHONY: k8s-bins-node
k8s-bins-node: ## Build a real kubelet (cached; for the real node)
	@BIN_DIR=$(K8S_NODE_BIN) COMPONENTS="kubelet" WRAPPER_SRC=hack/k8s-wrapper K8S_VERSION=$(K8S_VERSION) \
		bash hack/build-k8s-bins.sh
	@test -x $(K8S_NODE_BIN)/kubelet

FACILITY_BIN ?= $(HOME)/.cache/numastream/facility-nfd0.17.3-multus4.2.2
MONITORING_BIN ?= $(HOME)/.cache/numastream/monitoring-prometheus0.316.0-operator0.95.2

.PHONY: monitoring-bins
monitoring-bins: k8s-bins ## Build Prometheus and promtool (Kubernetes discovery only), and the Prometheus Operator's CRDs, from the Go module proxy (cached; ~6 min cold)
	@BIN_DIR=$(MONITORING_BIN) CONTROLLER_GEN=$(K8S_BIN)/controller-gen bash hack/build-monitoring-bins.sh
	@test -x $(MONITORING_BIN)/prometheus && test -x $(MONITORING_BIN)/promtool && test -f $(MONITORING_BIN)/crds/monitoring.coreos.com_podmonitors.yaml
FACILITY := KUBELET_BIN=$(K8S_NODE_BIN) SIM_BIN=$(K8S_SIM_BIN) SIM_DIR=$(SIM_DIR) FACILITY_BIN=$(FACILITY_BIN) bash hack/facility.sh

.PHONY: facility-bins
facility-bins: ## Build nfd-master, the Multus thin plugin and kube-network-policies (+ its image) from the Go module proxy (cached)
	@BIN_DIR=$(FACILITY_BIN) bash hack/build-facility-bins.sh
	@test -x $(FACILITY_BIN)/nfd-master && test -x $(FACILITY_BIN)/multus && test -f $(FACILITY_BIN)/kube-network-policies.tar

.PHONY: images
images: ## Container images for the real nodes from the Dockerfile (buildah), as archives in build/images
	@bash hack/images.sh $(BUILD)/images

# syft writes the releases' SBOMs
SYFT_VERSION := 1.57.1

.PHONY: warm-tools
warm-tools: ## Build what the suites use, in the order they need it (the sanitizer builds, the Python oracles, Go tools, the image builder's layers); make test runs it niced beside the first suites
	@$(MAKE) --no-print-directory agent-asan agent-tsan
	@hack/quiet.sh "warm-tools: go mod download" -- go mod download
	@hack/quiet.sh "warm-tools: go build ./..." -- go build ./...
	@echo "warm-tools: the Python environment: $$(bash hack/pyenv.sh)"
	@$(MAKE) --no-print-directory -k k8s-bins monitoring-bins k8s-bins-sim
	@if why=$$($(FACILITY) check); then \
		$(MAKE) --no-print-directory -k k8s-bins-node facility-bins && WARM_ONLY=1 PLATFORMS="$(RELEASE_PLATFORMS)" bash hack/images.sh $(BUILD)/images && \
		echo "warm-tools: syft $$(bash hack/build-go-tool.sh syft github.com/anchore/syft $(SYFT_VERSION) github.com/anchore/syft/cmd/syft)"; \
	else echo "warm-tools: not the facility's tools: $$why"; fi

.PHONY: release
# The architectures of the release's images (each image one index of them).
RELEASE_PLATFORMS ?= amd64 arm64
release: k8s-bins ## What a release ships, into build/release/numastream-$(VERSION): OCI image archives (linux/amd64 and linux/arm64), the chart pinned to their digests, the CRDs, SBOMs, release notes, SHA256SUMS
	@VERSION=$(VERSION) HELM=$(HELM) SYFT_VERSION=$(SYFT_VERSION) PLATFORMS="$(RELEASE_PLATFORMS)" bash hack/release.sh $(RELEASE_DIR)

.PHONY: facility-up facility-down
facility-up: k8s-bins-sim k8s-bins-node facility-bins images ## The facility in a box: control plane + detector-a, detector-b, gateway-a, gw-numa (real kubelets; gw-numa two NUMA nodes, static CPU manager), NFD, Multus
	@API_BIND=0.0.0.0 API_ADVERTISE=10.212.0.1 $(SIM) up >$(SIM_DIR).log 2>&1 || { cat $(SIM_DIR).log; exit 1; }
	@IMAGES_DIR=$(BUILD)/images $(FACILITY) up
facility-down: ## Stop it and check nothing is left
	@$(FACILITY) down; $(SIM) down >/dev/null; $(FACILITY) clean

.PHONY: k8s-bins-sim
k8s-bins-sim: ## Build etcd, apiserver, scheduler, controller-manager, kubectl and kwok (cached; ~7 min cold)
	@BIN_DIR=$(K8S_SIM_BIN) COMPONENTS="control-plane kwok" WRAPPER_SRC=hack/k8s-wrapper K8S_VERSION=$(K8S_VERSION) \
		bash hack/build-k8s-bins.sh
	@test -x $(K8S_SIM_BIN)/kube-scheduler && test -x $(K8S_SIM_BIN)/kwok && test -x $(K8S_SIM_BIN)/kubectl

.PHONY: sim-up sim-down
sim-up: k8s-bins-sim ## Start the simulated facility cluster (KUBECONFIG=$(SIM_DIR)/admin.kubeconfig)
	@$(SIM) up
sim-down: ## Stop it
	@$(SIM) down

.PHONY: bench-operator
bench-operator: k8s-bins-sim operator ## 200 simulated nodes, 100 pipelines at once (PIPELINES, NODES): time to plan, the operator's CPU and API writes per pipeline against the least it needs, each control-plane process's CPU, reconciles once converged, memory
	@K8S_SIM_BIN=$(K8S_SIM_BIN) bash hack/bench-operator.sh

.PHONY: test-e2e
test-e2e: k8s-bins-sim operator ## End-to-end tests: the operator on the simulated facility cluster
	@trap '$(SIM) down >/dev/null' EXIT; $(SIM) up >$(SIM_DIR).log 2>&1 || { cat $(SIM_DIR).log; exit 1; }; \
		$(K8S_SIM_BIN)/kubectl --kubeconfig $(SIM_DIR)/admin.kubeconfig apply --server-side -f config/crd/bases >/dev/null && \
		$(K8S_SIM_BIN)/kubectl --kubeconfig $(SIM_DIR)/admin.kubeconfig wait --for condition=established --timeout=60s crd/storageroots.numastream.io >/dev/null && \
		$(K8S_SIM_BIN)/kubectl --kubeconfig $(SIM_DIR)/admin.kubeconfig apply -f config/samples/storage-roots.yaml >/dev/null && \
		NUMASTREAM_SIM_KUBECONFIG=$(SIM_DIR)/admin.kubeconfig NUMASTREAM_OPERATOR=$(CURDIR)/$(BIN)/operator \
		NUMASTREAM_REQUIRE_E2E=1 go test -count=1 -v ./test/e2e/ 2>&1 | grep -E '^(=== RUN|--- |PASS|FAIL|ok|\s+e2e_test|        )' ; exit $${PIPESTATUS[0]}

REAL_NODE := KUBELET_BIN=$(K8S_NODE_BIN) SIM_BIN=$(K8S_SIM_BIN) SIM_DIR=$(SIM_DIR) REAL_NODE_DIR=/tmp/numastream-real-node bash hack/real-node.sh

.PHONY: test-e2e-real
test-e2e-real: ## Real kubelets (root): the static-CPU node's checks, then whole pipelines on the facility in a box
	@$(MAKE) --no-print-directory test-e2e-realnode
	@$(MAKE) --no-print-directory test-e2e-facility

# A skipped real test passes unless NUMASTREAM_REQUIRE_REAL=1.
SKIP_REAL = { echo "$@: skipped: $$why"; [ "$${NUMASTREAM_REQUIRE_REAL:-0}" != 1 ] || { echo "NUMASTREAM_REQUIRE_REAL=1: a skipped real test is a failure"; exit 1; }; exit 0; }

.PHONY: test-e2e-realnode test-e2e-facility
test-e2e-realnode: ## A real kubelet node with the static CPU manager: device plugin, exclusive CPUs, a verified stream into a real pod
	@if ! why=$$($(REAL_NODE) check); then $(SKIP_REAL); fi; \
	$(MAKE) --no-print-directory k8s-bins-sim k8s-bins-node agent operator && \
	trap '$(REAL_NODE) down >/dev/null 2>&1; $(SIM) down >/dev/null' EXIT; \
	$(SIM) up >$(SIM_DIR).log 2>&1 || { cat $(SIM_DIR).log; exit 1; }; \
	$(REAL_NODE) up >/tmp/numastream-real-node.log 2>&1 || { tail -30 /tmp/numastream-real-node.log; exit 1; }; \
	grep -E '^\[' /tmp/numastream-real-node.log; \
	export NUMASTREAM_SIM_KUBECONFIG=$(SIM_DIR)/admin.kubeconfig NUMASTREAM_REAL_NODE=real-node \
		NUMASTREAM_REAL_NODE_DIR=/tmp/numastream-real-node NUMASTREAM_AGENT=$(CURDIR)/$(AGENT); \
	go test -count=1 -v ./test/realnode/ 2>&1 | grep -E '^(=== RUN|--- |PASS|FAIL|ok|\s+realnode_test|        )'; \
	rc=$${PIPESTATUS[0]}; [ $$rc -eq 0 ] || exit $$rc; \
	$(REAL_NODE) topology-policy single-numa-node >>/tmp/numastream-real-node.log 2>&1 || { tail -30 /tmp/numastream-real-node.log; exit 1; }; \
	tail -1 /tmp/numastream-real-node.log; \
	NUMASTREAM_TOPOLOGY_POLICY=single-numa-node go test -count=1 -v -run 'TestAgentPins|TestTheKubeletRefuses' ./test/realnode/ 2>&1 | \
		grep -E '^(=== RUN|--- |PASS|FAIL|ok|\s+realnode_test|        )'; exit $${PIPESTATUS[0]}

# FACILITY_TESTS: a go test -run pattern, to run some of the facility tests after one bring-up.
FACILITY_TESTS ?= .
test-e2e-facility: agent ## Whole StreamPipelines as real pods on the facility in a box (root): installed from make release's artifacts through its own registry, NFD, Multus, a shaped link
	@if ! why=$$($(FACILITY) check); then $(SKIP_REAL); fi; \
	$(MAKE) --no-print-directory k8s-bins k8s-bins-sim k8s-bins-node facility-bins monitoring-bins release plugin || exit 1; \
	export RELEASE_DIR=$(abspath $(RELEASE_DIR)); \
	trap '$(FACILITY) down >/dev/null 2>&1; $(SIM) down >/dev/null; $(FACILITY) clean || exit 1' EXIT; \
	API_BIND=0.0.0.0 API_ADVERTISE=10.212.0.1 $(SIM) up >$(SIM_DIR).log 2>&1 || { cat $(SIM_DIR).log; exit 1; }; \
	$(FACILITY) up && HELM=$(HELM) $(FACILITY) install && \
	NUMASTREAM_FACILITY_KUBECONFIG=$(SIM_DIR)/admin.kubeconfig NUMASTREAM_KUBECTL=$(K8S_SIM_BIN)/kubectl \
		NUMASTREAM_AGENT=$(CURDIR)/$(AGENT) NUMASTREAM_DELAY_LINE=$(CURDIR)/$(AGENT_BUILD)/delay-line NUMASTREAM_PYTHON=$$(bash hack/pyenv.sh) HELM=$(HELM) NUMASTREAM_MONITORING_BIN=$(MONITORING_BIN) NUMASTREAM_PLUGIN=$(CURDIR)/$(BIN)/kubectl-numastream \
		go test -count=1 -v -timeout 35m -run '$(FACILITY_TESTS)' ./test/facility/ 2>&1 | grep -E '^(=== RUN|--- |PASS|FAIL|ok|\s+[a-z0-9_]+_test\.go:|        )' ; exit $${PIPESTATUS[0]}

##@ Whole project

.PHONY: check
check: agent ## The fast loop: formatting (clang-format, gofmt), golangci-lint, Go unit and table tests, the agent's unit tests; no root, no cluster
	@AGENT_BUILD=$(AGENT_BUILD) bash hack/check.sh

.PHONY: lint
lint: ## golangci-lint over the Go code (.golangci.yml; built from the module proxy, cached)
	@$$(bash hack/build-golangci-lint.sh) run ./...

.PHONY: test-docs
test-docs: ## The user docs: no table cell over 400 characters, links resolve, the README matches the demo and the CRD
	@python3 hack/check-docs.py

.PHONY: check-deps
check-deps: deps ## Prove each toolchain the suite uses links and runs a program (names the package when not)
	@bash hack/check-deps.sh

.PHONY: test
test: ## The whole suite, ending with each suite's wall time against the budget (docs/development.md)
	@MAKE="$(MAKE)" bash hack/test-suites.sh check-deps @warm-tools test-docs test-agent @test-arm64 test-agent-asan test-agent-tsan test-oracles test-fuzz+test-operator test-e2e test-e2e-real

.PHONY: demo
demo: agent operator plugin k8s-bins k8s-bins-sim ## The main job: a StreamPipeline as real pods on the facility in a box (root), else simulated
	@if why=$$($(FACILITY) check); then \
		$(MAKE) --no-print-directory k8s-bins-node facility-bins images && \
		IMAGES_DIR=$(BUILD)/images HELM=$(HELM) KUBELET_BIN=$(K8S_NODE_BIN) FACILITY_BIN=$(FACILITY_BIN) \
			SIM_BIN=$(K8S_SIM_BIN) bash hack/demo-facility.sh; \
	else DEMO_FALLBACK="$$why" K8S_SIM_BIN=$(K8S_SIM_BIN) bash hack/demo.sh; fi

.PHONY: clean
clean: ## Remove build output
	rm -rf $(BUILD) $(BIN)
