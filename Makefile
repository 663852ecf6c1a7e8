# runfleet: every command a developer or CI runs. `make dev` and `make test`
# need nothing but this repository and a machine of the documented kind:
# whatever else they need, they install (infra/scripts/test-deps.sh) or start
# (moto_server, the runtime interface emulator) themselves.

SHELL     := /bin/bash
GO        ?= go
FUNCTIONS := api stream sweep probe
BUILD     := $(CURDIR)/build
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X github.com/runfleet/runfleet/shared/version.Version=$(VERSION)
# Lambda: linux/arm64, static, and without the RPC shim the provided.al2023 runtime never uses.
LAMBDA_ENV   := GOOS=linux GOARCH=arm64 CGO_ENABLED=0
LAMBDA_FLAGS := -tags lambda.norpc -trimpath -ldflags '$(LDFLAGS)'
TEST_TIMEOUT ?= 60m
FUZZTIME  ?= 200000x

.PHONY: dev test test-go deps build build-functions build-ApiFunction build-StreamFunction build-SweepFunction build-ProbeFunction build-edge bench lint fuzz fuzz-short clean

## dev: the whole system on this machine: Fleet (its four handlers, on bbolt, on RUNFLEET_ADDR)
## and one edge host with a demo upstream and secret (README: The local stack). Built, then
## exec'd rather than `go run`: Ctrl-C then ends it cleanly, with no "Error 1" from make.
dev:
	@$(GO) build -o $(BUILD)/localstack ./infra/localstack
	@exec $(BUILD)/localstack

## test: lint, every Go test under -race (unit, store contract on moto_server, integration), brief fuzzing
test: deps lint test-go fuzz-short

test-go:
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...

## deps: check and install what the tests use beyond Go (Debian packages; moto_server must be present)
deps:
	@./infra/scripts/test-deps.sh

## build: every Lambda as bootstrap for linux/arm64, and edge for this machine
build: build-functions build-edge

build-functions:
	@for fn in $(FUNCTIONS); do \
		echo "build functions/$$fn -> build/functions/$$fn/bootstrap (linux/arm64)"; \
		$(LAMBDA_ENV) $(GO) build $(LAMBDA_FLAGS) -o $(BUILD)/functions/$$fn/bootstrap ./functions/$$fn || exit 1; \
	done

## build-<LogicalId>: what `sam build` runs for template.yaml's functions (BuildMethod: makefile),
## each into $(ARTIFACTS_DIR)/bootstrap
SAM_BUILD = $(if $(ARTIFACTS_DIR),,$(error ARTIFACTS_DIR is not set: sam build sets it)) \
	$(LAMBDA_ENV) $(GO) build $(LAMBDA_FLAGS) -o $(ARTIFACTS_DIR)/bootstrap ./functions/$(1)

build-ApiFunction:
	$(call SAM_BUILD,api)
build-StreamFunction:
	$(call SAM_BUILD,stream)
build-SweepFunction:
	$(call SAM_BUILD,sweep)
build-ProbeFunction:
	$(call SAM_BUILD,probe)

build-edge:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BUILD)/edge ./edge

## bench: every Go benchmark, figures printed
bench: deps
	$(GO) test -run '^$$' -bench . -benchmem -count=1 -timeout 60m ./...

## lint: gofmt and go vet
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

## fuzz: every fuzz target for FUZZTIME inputs each (make fuzz FUZZTIME=5000000x)
fuzz:
	@./infra/scripts/fuzz.sh $(FUZZTIME)

fuzz-short:
	@./infra/scripts/fuzz.sh 30000x

# e2e-agents installs the agents' CLIs here (git-ignored .tools/; nobody,
# the task user, must reach it: not under /root or /tmp), at these versions.
AGENTS_PREFIX       ?= $(CURDIR)/.tools/agents
CLAUDE_CODE_VERSION ?= 2.1.197
CODEX_VERSION       ?= 0.171.0

.PHONY: e2e-agents
## e2e-agents: Claude Code and Codex from npm, each run as an edge task against a fake of its API (root, npm registry; not in `make test`)
e2e-agents:
	@./infra/scripts/e2e-agents.sh '$(AGENTS_PREFIX)' '$(CLAUDE_CODE_VERSION)' '$(CODEX_VERSION)'

clean:
	rm -rf $(BUILD)
