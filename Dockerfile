# syntax=docker/dockerfile:1
# One Dockerfile, one target per image:
#   docker build --target agent    -t numastream/agent .     (agent + node daemon)
#   docker build --target operator -t numastream/operator .
# The builder stages run the same scripts and make targets as CI (hack/install-deps.sh,
# make agent, make operator), so what CI tests is what the images carry.
# Multi-arch (linux/amd64, linux/arm64): the builder runs on the build platform and cross-compiles
# for the target's (`--platform linux/arm64`); the agent image's RUN runs on the target's base,
# under qemu where the build machine is another architecture (binfmt, as buildx sets up).

FROM --platform=$BUILDPLATFORM golang:1.26-bookworm AS build
ARG TARGETARCH
WORKDIR /src
COPY hack/install-deps.sh hack/quiet.sh hack/
RUN bash hack/install-deps.sh "build-$TARGETARCH"
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# Caches: Go's module and build caches and the agent's compiler cache (ccache: a changed tree
# recompiles only the files whose text changed). Only the agent itself, not its tests.
# For another architecture than the build platform's: Debian's cross compiler and the target's
# libraries (multiarch), agent/cmake/<target>.cmake.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    --mount=type=cache,target=/root/.cache/numastream/ccache \
    make agent DEPS="build-$TARGETARCH" AGENT_ARCH="$TARGETARCH" AGENT_CMAKE_FLAGS=-DNUMASTREAM_TESTS=OFF \
 && CGO_ENABLED=0 GOARCH="$TARGETARCH" make operator

# The data plane: the C++ agent and the node daemon, on Debian's runtime libraries.
FROM debian:bookworm-slim AS agent
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends liblz4-1 libnuma1 libzmq5 libxxhash0 libhdf5-103-1 libcbor0.8 zlib1g libssl3 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/bin/numastream-agent /usr/local/bin/numastream-agent
COPY --from=build /src/bin/node-daemon /usr/local/bin/node-daemon
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/numastream-agent"]

# The operator: a static Go binary on a distroless, non-root base.
FROM gcr.io/distroless/static-debian12:nonroot AS operator
COPY --from=build /src/bin/operator /operator
USER 65532:65532
ENTRYPOINT ["/operator"]
