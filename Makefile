# The two commands a newcomer needs: `make demo` and `make test`.
# Each installs what it needs first (Debian packages via scripts/deps.sh; the
# testbed's kernel is fetched and cached by bin/rxevm on first use).

GO      ?= go
RXEVM   := $(CURDIR)/bin/rxevm
# Device tests must run, never skip, under make: a missing device is a failure.
export RDMACM_REQUIRE_DEVICE := 1
export CGO_ENABLED := 1

# Packages whose tests need no RDMA device run on the host; every package
# runs again on rxe inside the testbed (one fresh guest per test binary, one
# at a time: Soft-RoCE drops completions when many processes drive it).
HOST_PKGS := ./...
GUEST_PKGS := ./...

.PHONY: all deps build test test-host test-rxe demo vet clean

all: build

deps:
	@./scripts/deps.sh

build: deps
	$(GO) build ./...
	$(GO) build -o bin/rxevm ./cmd/rxevm
	$(GO) build -o bin/ ./examples/...

vet: deps
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }

# Host: race-checked unit tests; device tests are skipped here only because
# RDMACM_REQUIRE_DEVICE is cleared for this step (they run on rxe next).
test-host: build
	RDMACM_REQUIRE_DEVICE= $(GO) test -race -count=1 $(HOST_PKGS)

test-rxe: build
	$(GO) test -race -count=1 -p 1 -v -exec $(RXEVM) $(GUEST_PKGS)

test: vet test-host test-rxe

demo: build
	$(RXEVM) $(CURDIR)/bin/echo -demo

clean:
	rm -rf bin
