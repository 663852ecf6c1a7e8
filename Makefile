# runfleet: every command a developer or CI runs. `make dev` and `make test`
# need nothing but this repository and a machine of the documented kind:
# whatever else they need, they install (Debian packages:
# infra/scripts/test-deps.sh) or leave to the tests that use it, which build
# (h2spec, the runtime interface emulator, from Go modules) and start
# (moto_server, the emulator) it themselves, so a plain `go test` works too.

SHELL     := /bin/bash
GO        ?= go
FUNCTIONS := api stream sweep probe dispatcher
BUILD     := $(CURDIR)/build
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X github.com/runfleet/runfleet/shared/version.Version=$(VERSION)
# Lambda: linux/arm64, static, and without the RPC shim the provided.al2023 runtime never uses.
LAMBDA_ENV   := GOOS=linux GOARCH=arm64 CGO_ENABLED=0
LAMBDA_FLAGS := -tags lambda.norpc -trimpath -ldflags '$(LDFLAGS)'
# go test's -timeout bounds each package's test binary: the slowest (tests/)
# takes about 270 s under -race on a 2-core machine, so 20m is margin, not a
# budget. A stuck wait fails sooner, by name (tests/kit/await: 2 minutes).
TEST_TIMEOUT ?= 20m
FUZZTIME  ?= 200000x
# A bare `make` lists the targets: nothing runs a bare make (CI runs `make test`,
# sam build `make build-<LogicalId>`), and a long-running `make dev` is no surprise to start by.
.DEFAULT_GOAL := help

.PHONY: dev test test-go deps build build-cli build-functions build-ApiFunction build-StreamFunction build-SweepFunction build-ProbeFunction build-DispatcherFunction build-edge bench bench-proxy lint fuzz fuzz-short clean

## help: this list of targets (the default goal)
# Each `## target: summary` line is the target's entry (one line; more goes in plain # comments
# below it); tests/make_test.go fails on a target without one.
.PHONY: help
help:
	@echo 'usage: make [target] [VARIABLE=value]   (no target: this list)'
	@echo
	@awk 'match($$0, /^## [^ :]+: /) { printf "  %-18s %s\n", substr($$0, 4, RLENGTH - 5), substr($$0, RLENGTH + 1) }' $(firstword $(MAKEFILE_LIST))
	@echo
	@echo 'variables: FUZZTIME=$(FUZZTIME) (fuzz), TEST_TIMEOUT=$(TEST_TIMEOUT) (test, test-go), GO=$(GO),'
	@echo '           BUILD=$(BUILD); make dev reads RUNFLEET_* (README: The local stack)'

## dev: Fleet and one edge host with a demo, on this machine (README: The local stack)
# Fleet's five handlers on bbolt on RUNFLEET_ADDR, and one edge host with a demo upstream and
# secret. Built, then exec'd rather than `go run`: Ctrl-C then ends it cleanly, with no
# "Error 1" from make.
# The runfleet CLI is built first, so build/runfleet is there for the quick start's next command.
dev: build-cli
	@./infra/scripts/test-deps.sh dev
	@$(GO) build -ldflags '$(LDFLAGS)' -o $(BUILD)/localstack ./infra/localstack
	@exec $(BUILD)/localstack

## test: what CI runs: deps, lint, test-go and fuzz-short
# The tests: unit, the store contract on moto_server, integration (tests/).
test: deps lint test-go fuzz-short

## test-go: every Go test under -race, without lint or fuzzing (TEST_TIMEOUT, default 20m)
test-go:
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...

## deps: check the tools the tests need beyond Go; install the missing Debian packages
deps:
	@./infra/scripts/test-deps.sh

## build: build-functions, build-edge and build-cli: everything, under build/
build: build-functions build-edge build-cli

## build-cli: the runfleet CLI for this machine, static, as build/runfleet
build-cli:
	@CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BUILD)/runfleet ./shared/cli/runfleet

## build-functions: every Lambda as build/functions/<fn>/bootstrap, static, for linux/arm64
build-functions:
	@for fn in $(FUNCTIONS); do \
		echo "build functions/$$fn -> build/functions/$$fn/bootstrap (linux/arm64)"; \
		$(LAMBDA_ENV) $(GO) build $(LAMBDA_FLAGS) -o $(BUILD)/functions/$$fn/bootstrap ./functions/$$fn || exit 1; \
	done

SAM_BUILD = $(if $(ARTIFACTS_DIR),,$(error ARTIFACTS_DIR is not set: sam build sets it)) \
	$(LAMBDA_ENV) $(GO) build $(LAMBDA_FLAGS) -o $(ARTIFACTS_DIR)/bootstrap ./functions/$(1)

## build-<LogicalId>: one function of template.yaml into ARTIFACTS_DIR, as `sam build` runs it
# What template.yaml's functions (BuildMethod: makefile) build with: build-ApiFunction,
# build-StreamFunction, build-SweepFunction, build-ProbeFunction, build-DispatcherFunction.
build-ApiFunction:
	$(call SAM_BUILD,api)
build-StreamFunction:
	$(call SAM_BUILD,stream)
build-SweepFunction:
	$(call SAM_BUILD,sweep)
build-ProbeFunction:
	$(call SAM_BUILD,probe)
build-DispatcherFunction:
	$(call SAM_BUILD,dispatcher)

## build-edge: edge for this machine, static, as build/edge
build-edge:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BUILD)/edge ./edge

## bench: every Go benchmark, figures printed
bench: deps
	$(GO) test -run '^$$' -bench . -benchmem -count=1 -timeout 60m ./...

## bench-proxy: the proxy table: edge beside direct, goproxy and a zero-work TLS relay (root)
# infra/bench/proxy-table.sh at 1, 8, 16 and 64 connections, keep-alive and a new connection per
# request; it needs the harness's proxybench (PROXYBENCH, default ../shared/bench/proxybench).
# About 4 minutes, and it loads every core: not part of `make test` nor `make bench`.
bench-proxy:
	@./infra/bench/proxy-table.sh

## lint: gofmt and go vet
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

## fuzz: every fuzz target for FUZZTIME inputs each (make fuzz FUZZTIME=5000000x)
fuzz:
	@./infra/scripts/fuzz.sh $(FUZZTIME)

## fuzz-short: every fuzz target for 30000 inputs each, as `make test` runs it
fuzz-short:
	@./infra/scripts/fuzz.sh 30000x

# e2e-agents installs the agents' CLIs here (git-ignored .tools/; nobody,
# the task user, must reach it: not under /root or /tmp), at these versions.
AGENTS_PREFIX       ?= $(CURDIR)/.tools/agents
CLAUDE_CODE_VERSION ?= 2.1.197
CODEX_VERSION       ?= 0.171.0

.PHONY: screenshots
## screenshots: infra/dashboard.png, README's dashboard screenshot, from the browser test
# TestDashboardInABrowser with RUNFLEET_UPDATE_SCREENSHOTS=1 writes its run page's screenshot there
# (make test checks the committed file instead). Needs chromium (make deps).
screenshots:
	RUNFLEET_UPDATE_SCREENSHOTS=1 $(GO) test -count=1 -run '^TestDashboardInABrowser$$' ./tests/

.PHONY: e2e-agents
## e2e-agents: Claude Code and Codex from npm as edge tasks, against fakes (not in make test)
e2e-agents:
	@./infra/scripts/e2e-agents.sh '$(AGENTS_PREFIX)' '$(CLAUDE_CODE_VERSION)' '$(CODEX_VERSION)'

## clean: remove build/ (not make dev's data dir)
clean:
	rm -rf $(BUILD)
