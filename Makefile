# A newcomer needs two commands: `make demo` and `make test`. Each installs
# what it needs first: Debian packages through scripts/deps.sh; the testbed's
# kernel is downloaded and cached by bin/rxevm on first use.

SHELL   := /bin/bash
GO      ?= go
RXEVM   := $(CURDIR)/bin/rxevm
export CGO_ENABLED := 1

.PHONY: all deps build vet test test-host test-rxe test-siw test-norace test-faults test-examples test-grpc test-fuzz test-wire cover demo bench clean

# staticcheck comes through the Go module proxy at a pinned version.
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

# The build tag of fault injection (internal/verbs/fault.go, test-faults).
FAULTS := rdmacm_faultinject

all: build

deps:
	@./scripts/deps.sh

# examples/grpc is a module of its own (the library's go.mod does not
# require grpc); its go.mod points at this repository.
GRPC_EXAMPLE := examples/grpc

build: deps
	$(GO) build ./...
	$(GO) build -o bin/ ./cmd/... ./examples/...
	cd $(GRPC_EXAMPLE) && $(GO) build -o $(CURDIR)/bin/grpc .

vet: deps
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	$(GO) vet -tags $(FAULTS) ./internal/verbs ./integration
	$(GO) run $(STATICCHECK) -tags $(FAULTS) ./internal/verbs ./integration
	cd $(GRPC_EXAMPLE) && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt would change: $$unformatted"; exit 1; fi

# Host: every package with the race detector. Device tests skip here, and
# only here (RDMACM_REQUIRE_DEVICE is unset); test-rxe runs them next.
# msg's credit model, one goroutine through millions of states, is built
# without the detector only (credits_test.go) and runs on its own.
test-host: build
	RDMACM_REQUIRE_DEVICE= $(GO) test -race -count=1 ./...
	$(GO) test -count=1 -run '^(TestCreditRulesSettle|TestStreamHoldSettles)$$' ./msg
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime 100000x ./msg
	$(GO) test -run '^$$' -fuzz '^FuzzParseHello$$' -fuzztime 100000x ./msg
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeRequest$$' -fuzztime 100000x ./msg
	$(GO) test -run '^$$' -fuzz '^FuzzGRHSource$$' -fuzztime 100000x ./dgram
	$(GO) test -run '^$$' -fuzz '^FuzzSplitHostPort$$' -fuzztime 100000x ./dgram

# rxe: the device tests (integration/) run in a fresh Soft-RoCE guest, one
# test binary at a time
# (-p 1: Soft-RoCE drops completions when many processes drive it at once).
# A missing device fails these tests instead of skipping them.
# integration/removal removes the device under a process and puts it back,
# and integration/portdown deletes its address, gives its netdev another
# MAC address, then takes its link down, under traffic (which leaves rxe's
# CM unable to connect), each in a guest of its own.
test-rxe: build
	RDMACM_REQUIRE_DEVICE=1 $(GO) test -race -count=1 -p 1 -v -timeout 20m -exec $(RXEVM) ./integration ./integration/removal ./integration/portdown

# soft-iWARP: the same device suite on siw0. bin/rxevm builds siw.ko for the
# guest's kernel once (Debian ships none) and caches it beside the kernel.
# What iWARP lacks (atomics, immediate data) is asserted as a typed refusal.
test-siw: build
	RDMACM_REQUIRE_DEVICE=1 $(GO) test -race -count=1 -p 1 -v -timeout 20m -exec '$(RXEVM) -device siw' ./integration ./integration/removal ./integration/portdown

# The same device suite on rxe0 and on siw0 without the race detector,
# which slows the process several times over and can hide a race between
# the library and the device that shows at full speed. It is built with
# the cgo pointer checks that cost nothing here (cgocheck2): a Go pointer
# stored in C memory (a work request's, the device's) fails at once,
# instead of corrupting the heap after a collection.
test-norace: build
	GOEXPERIMENT=cgocheck2 RDMACM_REQUIRE_DEVICE=1 $(GO) test -count=1 -p 1 -v -timeout 20m -exec $(RXEVM) ./integration
	GOEXPERIMENT=cgocheck2 RDMACM_REQUIRE_DEVICE=1 $(GO) test -count=1 -p 1 -v -timeout 20m -exec '$(RXEVM) -device siw' ./integration

# Failures no device produces on purpose (a CQ poll, a CQ event's read, a
# CQ's arm, a disconnect or a QP's move to the error state that fails, a
# request the device refuses in the middle of a post, a send whose
# completion reports a failure, send completions held back, a device object
# whose creation is refused), injected through
# internal/verbs in a build with the FAULTS tag, on rxe0 and on siw0, whose
# flushes and CM events come in another order: the tests named Injected
# exist only in that build.
test-faults: build
	RDMACM_REQUIRE_DEVICE=1 $(GO) test -race -count=1 -tags $(FAULTS) -run Injected -v -exec $(RXEVM) ./integration
	RDMACM_REQUIRE_DEVICE=1 $(GO) test -race -count=1 -tags $(FAULTS) -run Injected -v -exec '$(RXEVM) -device siw' ./integration

# Two guests joined by a UDP link, rxe0 on each one's eth0: the same test
# binary runs in both (guest 0 serves, guest 1 dials and injects netem faults).
test-wire: build
	RDMACM_REQUIRE_DEVICE=1 $(GO) test -race -count=1 -v -exec '$(RXEVM) -guests 2' ./integration/wire

# The runnable godoc examples of msg, endpoint, bufpool and rdmanet (their
# output checked) on rxe0, the rpc example's metrics test, and udaddy's and
# mckey's interop with librdmacm's tools of those names; on a host without
# a device they skip.
test-examples: build
	RDMACM_REQUIRE_DEVICE=1 $(GO) test -count=1 -p 1 -v -run '^Example' -exec $(RXEVM) ./msg ./endpoint ./bufpool ./rdmanet
	RDMACM_REQUIRE_DEVICE=1 $(GO) test -race -count=1 -v -exec $(RXEVM) ./examples/rpc
	RDMACM_REQUIRE_DEVICE=1 $(GO) test -race -count=1 -p 1 -v -exec $(RXEVM) ./examples/udaddy ./examples/mckey

# FuzzPostRequest fuzzing on rxe0 (20,000 inputs, about 15 s): arbitrary
# endpoint.Requests on a real connection. The engine's cache stays in the
# guest's /var/tmp; a failing input is written to integration/testdata/fuzz,
# the one directory the guest may write.
#
# Fuzzing budgets are counts, not durations: with a duration, Go 1.26's
# fuzzing coordinator can fail a clean run with "context deadline
# exceeded" as the time runs out (golang/go#75804, fixed in Go 1.27).
test-fuzz: build
	$(GO) test -c -fuzz '^FuzzPostRequest$$' -o bin/integration.fuzz ./integration
	cd integration && RDMACM_REQUIRE_DEVICE=1 $(RXEVM) -w $(CURDIR)/integration $(CURDIR)/bin/integration.fuzz \
	  -test.run '^$$' -test.fuzz '^FuzzPostRequest$$' -test.fuzztime 20000x -test.parallel 1 -test.fuzzcachedir /var/tmp/fuzz

# grpc-go over rdmanet (examples/grpc's tests) on rxe0 and on siw0.
test-grpc: build
	cd $(GRPC_EXAMPLE) && RDMACM_REQUIRE_DEVICE=1 $(GO) test -race -count=1 -v -exec $(RXEVM) ./...
	cd $(GRPC_EXAMPLE) && RDMACM_REQUIRE_DEVICE=1 $(GO) test -race -count=1 -v -exec '$(RXEVM) -device siw' ./...

test: vet test-host test-rxe test-siw test-norace test-faults test-examples test-grpc test-fuzz test-wire

# Statement coverage of the library's packages and the internal ones they
# import, not part of `make test`: the host tests, the device suite with
# the fault tests (the build with the FAULTS tag, whose hooks do nothing
# until a test arms them) on rxe0 and on siw0, integration/portdown on
# each in a guest of its own, and the wire tests on two guests, each
# without the race detector, merged. It prints each package's figure and
# the total, and leaves the profile in .cover/cover.out for
# `go tool cover -html=.cover/cover.out`.
COVER    := $(CURDIR)/.cover
COVERPKG  = $(shell $(GO) list -deps ./bufpool ./cm ./dgram ./endpoint ./msg ./rdmanet | grep '^github.com/go-rdma/' | paste -sd,)
# Those of them the test package $(1) imports: integration/wire and
# integration/portdown import fewer (go test warns of the others).
coverpkg_of = $(shell $(GO) list -deps -test ./$(1) | grep -xF "$$(echo '$(COVERPKG)' | tr , '\n')" | paste -sd,)
cover: build
	rm -rf $(COVER) && mkdir -p $(COVER)/host $(COVER)/rxe $(COVER)/siw $(COVER)/portdown-rxe $(COVER)/portdown-siw $(COVER)/wire
	RDMACM_REQUIRE_DEVICE= $(GO) test -count=1 -cover -coverpkg=$(COVERPKG) ./... -args -test.gocoverdir=$(COVER)/host
	$(GO) test -c -cover -coverpkg=$(COVERPKG) -tags $(FAULTS) -o $(COVER)/integration.test ./integration
	cd integration && RDMACM_REQUIRE_DEVICE=1 $(RXEVM) -w $(COVER) $(COVER)/integration.test \
	  -test.count 1 -test.timeout 20m -test.gocoverdir $(COVER)/rxe
	cd integration && RDMACM_REQUIRE_DEVICE=1 $(RXEVM) -device siw -w $(COVER) $(COVER)/integration.test \
	  -test.count 1 -test.timeout 20m -test.gocoverdir $(COVER)/siw
	$(GO) test -c -cover -coverpkg=$(call coverpkg_of,integration/portdown) -o $(COVER)/portdown.test ./integration/portdown
	cd integration/portdown && RDMACM_REQUIRE_DEVICE=1 $(RXEVM) -w $(COVER) $(COVER)/portdown.test \
	  -test.count 1 -test.timeout 5m -test.gocoverdir $(COVER)/portdown-rxe
	cd integration/portdown && RDMACM_REQUIRE_DEVICE=1 $(RXEVM) -device siw -w $(COVER) $(COVER)/portdown.test \
	  -test.count 1 -test.timeout 5m -test.gocoverdir $(COVER)/portdown-siw
	$(GO) test -c -cover -coverpkg=$(call coverpkg_of,integration/wire) -o $(COVER)/wire.test ./integration/wire
	cd integration/wire && RDMACM_REQUIRE_DEVICE=1 $(RXEVM) -guests 2 -w $(COVER) $(COVER)/wire.test \
	  -test.count 1 -test.timeout 20m -test.gocoverdir $(COVER)/wire
	$(GO) tool covdata percent -i $(COVER)/host,$(COVER)/rxe,$(COVER)/siw,$(COVER)/portdown-rxe,$(COVER)/portdown-siw,$(COVER)/wire
	$(GO) tool covdata textfmt -i $(COVER)/host,$(COVER)/rxe,$(COVER)/siw,$(COVER)/portdown-rxe,$(COVER)/portdown-siw,$(COVER)/wire -o $(COVER)/cover.out
	$(GO) tool cover -func $(COVER)/cover.out | tail -1

# The echo, RPC and gRPC servers and clients, one after the other, over rxe0 (in
# the testbed guest when this host has no RDMA device).
demo: build
	$(RXEVM) sh -c '$(CURDIR)/bin/echo -mode demo && $(CURDIR)/bin/rpc -mode demo && $(CURDIR)/bin/grpc -mode demo'

# perftest and rdmaperf in turn in one guest boot, three times each (medians), then gRPC over
# rdmanet against gRPC over TCP (examples/grpc's bench): a table on stdout,
# BENCHMARKS.md and bench.png here; then the go benchmarks of the hot paths.
# The guest may run 45 min, not rxevm's default 20: three rounds take 13-19
# min on this project's machines.
#
# make bench DEVICE=siw runs the comparison on soft-iWARP instead and writes
# its own section of BENCHMARKS.md; the gRPC rows and the go benchmarks run on rxe only.
DEVICE ?= rxe
bench: build
	RDMAPERF_HOST="$$(uname -n), $$(nproc) cores, $$(. /etc/os-release; echo $$PRETTY_NAME)" \
	  $(RXEVM) -device $(DEVICE) -timeout 45m -w $(CURDIR) $(CURDIR)/bin/rdmaperf -compare -repeat 3 -out $(CURDIR)
	if [ "$(DEVICE)" = rxe ]; then \
	  $(GO) test -run '^$$' -bench . -benchmem ./msg && \
	  $(GO) test -run '^$$' -bench . -benchmem -exec $(RXEVM) ./integration; fi

clean:
	rm -rf bin .cover
