# meshagent developer commands. `make run` tries the agent; `make test` is what CI runs.

GO        ?= go
BIN       := bin/meshagent
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)
STATUS_PORT ?= 15020
RUN_DIR   := .run
FUZZTIME  ?= 5s
FUZZ_PKGS ?= ./...

.PHONY: build run test tools vet fmt-check bench soak docs fuzz proto clean

## build: compile the agent into bin/meshagent (static; flags as in test/agentproc.BuildCommand)
build:
	CGO_ENABLED=0 $(GO) build -tags grpcnotrace -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/agent

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

## proto: regenerate the Linkerd identity API code
proto:
	bash scripts/proto.sh

clean:
	rm -rf bin $(RUN_DIR)
