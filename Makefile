# meshagent developer commands. `make run` tries the agent; `make test` is what CI runs.

GO        ?= go
BIN       := bin/meshagent
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)
STATUS_PORT ?= 15020
RUN_DIR   := .run
FUZZTIME  ?= 5s
# The frozen Go Cryptographic Module `make build-fips` builds against (go/lib/fips140: v1.0.0 is the
# CMVP-validated one; "latest" is the module in this Go's source tree, not validated).
GOFIPS140 ?= v1.0.0
FUZZ_PKGS ?= ./...

# The image `make image` builds: the chart's default (deploy/helm/meshagent: image.repository
# and appVersion). IMAGE_PUSH=1 pushes it to IMAGE's registry instead of writing the archive.
CHART_VERSION := $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' deploy/helm/meshagent/Chart.yaml)
IMAGE     ?= meshagent/meshagent:$(CHART_VERSION)
IMAGE_TAR := bin/meshagent-image.tar
IMAGE_PUSH ?=

.PHONY: build build-fips image-fips run test tools vet fmt-check bench soak docs fuzz proto clean image e2e bench-node

## build: compile the agent into bin/meshagent (static; flags as in test/agentproc.BuildCommand)
build:
	CGO_ENABLED=0 $(GO) build -tags grpcnotrace -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/agent

## build-fips: bin/meshagent-fips, built against Go's frozen FIPS 140-3 module (GOFIPS140=v1.0.0, the
## validated version this Go ships): FIPS 140-3 mode is on by default; run it with COMPLIANCE_POLICY=fips-140-3
## (docs/operations.md). GODEBUG=fips140=only also refuses every algorithm outside the module.
build-fips:
	CGO_ENABLED=0 GOFIPS140=$(GOFIPS140) $(GO) build -tags grpcnotrace -ldflags "$(LDFLAGS)" -o $(BIN)-fips ./cmd/agent

## image-fips: bin/meshagent-fips-image.tar, the image of bin/meshagent-fips, tagged IMAGE with -fips appended
image-fips: build-fips
	cd tools/image && GOWORK=off $(GO) build -o ../../bin/image-tool .
	bin/image-tool -binary $(BIN)-fips -tag $(IMAGE)-fips $(if $(IMAGE_PUSH),-push,-o bin/meshagent-fips-image.tar)

## image: bin/meshagent-image.tar, an image of the static agent (non-root, the binary as entry point,
## nothing else) built without a container daemon by tools/image; IMAGE_PUSH=1 pushes IMAGE instead
image: build
	cd tools/image && GOWORK=off $(GO) build -o ../../bin/image-tool .
	bin/image-tool -binary $(BIN) -tag $(IMAGE) $(if $(IMAGE_PUSH),-push,-o $(IMAGE_TAR))

## e2e: the end-to-end tests on a real single-node cluster (root; see test/e2e): installs
## containerd, runc, CNI plugins and iptables with apt-get when missing, builds the node's tools
## (scripts/tools.sh -node) and the image, then runs test/e2e. Never at the same time as `make test`.
e2e: image
	bash scripts/e2e-deps.sh
	bash scripts/tools.sh -node
	$(GO) test -tags e2e -count=1 -v -timeout 20m ./test/e2e/

## bench-node: on the real single-node cluster of make e2e (root, its tools and image), how long a new pod
## waits for its first SVID: node agent with and without certificates fetched ahead, the pod agent shape
## and Istio's own pilot-agent, BENCH_NODE_PODS pods each (50), BENCH_NODE_PARALLEL at once (1); prints the
## table of docs/performance.md. Not for CI.
BENCH_NODE_PODS ?= 50
BENCH_NODE_PARALLEL ?= 1
bench-node: image
	bash scripts/e2e-deps.sh
	bash scripts/tools.sh -node
	MESHAGENT_BENCH_NODE=1 BENCH_NODE_PODS=$(BENCH_NODE_PODS) BENCH_NODE_PARALLEL=$(BENCH_NODE_PARALLEL) \
		$(GO) test -tags e2e -count=1 -v -timeout 40m -run '^TestBenchNode$$' ./test/e2e/

## run: start the agent in dev mode (in-memory CA) in ./.run, status on $(STATUS_PORT)
run: build
	mkdir -p $(RUN_DIR)
	cd $(RUN_DIR) && STATUS_PORT=$(STATUS_PORT) exec ../$(BIN) run --dev

## test: go vet, gofmt check, race-enabled tests of every package (builds the test tools first)
test: tools vet fmt-check
	$(GO) test -race ./...

## tools: build etcd, kube-apiserver, helm, spiffe-helper (pinned in test/tools) into $MESHAGENT_TOOLS_DIR, default ~/.cache/meshagent/tools/<key>
tools:
	bash scripts/tools.sh

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(find . -name '*.go' -not -path './.run/*' -not -path './.tools/*')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

## bench: the figures of docs/performance.md against the real binary, then the Go benchmarks once
bench: build tools
	$(GO) run ./cmd/meshbench -agent $(abspath $(BIN))
	$(GO) test -run '^$$' -bench . -benchtime=1x ./xdsproxy ./sds ./secretmanager

## bench-compare: make bench's figures of BASE (a git ref, built in a temporary worktree) and of the working tree, side by side in alternating rounds, with each figure's ratio (ROUNDS=3, ONLY=groups); not for CI
bench-compare:
	@test -n "$(BASE)" || { echo "usage: make bench-compare BASE=<git ref>"; exit 2; }
	bash scripts/bench-compare.sh $(BASE)

## soak: fault-injection soak of bin/meshagent (default 3 minutes, at most 5, then 1 minute of hostile pods); prints SOAK figures; SOAK_FLAGS="-duration 1m -pods-duration 30s" shortens it
soak: build
	$(GO) run ./cmd/meshsoak -agent $(abspath $(BIN)) $(SOAK_FLAGS)

## docs: regenerate docs/configuration.md from the settings registry
docs:
	$(GO) run ./cmd/agent docs -o docs/configuration.md

## fuzz: run every fuzz target in $(FUZZ_PKGS) for $(FUZZTIME) each
fuzz:
	@set -e; pkgs=$$($(GO) list $(FUZZ_PKGS)); for pkg in $$pkgs; do \
		for target in $$($(GO) test -list 'Fuzz.*' $$pkg | grep '^Fuzz' || true); do \
			echo "== $$pkg $$target"; \
			$(GO) test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) $$pkg; \
		done; \
	done

## proto: regenerate the Linkerd identity API and SPIFFE Broker API code
proto:
	bash scripts/proto.sh

clean:
	rm -rf bin $(RUN_DIR)
