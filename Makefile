# zcnet build. Every target installs what it needs (apt-get / go install); nothing relies on a
# hand-installed tool. Package fragments (kmod/kmod.mk, kmod/vm/kernels.mk, bpf/bpf.mk, bench/bench.mk) add targets
# and append to TEST_EXTRA.
SHELL := /bin/bash
GO ?= go
GOFLAGS ?=
export GOFLAGS
TEST_EXTRA :=
BUILD := $(CURDIR)/build

.PHONY: all build test gotest vet lint bench deps-apt
all: build

# bench/ is its own module (so the library's go.mod does not pull plotting into users' builds).
MODULES := . bench

build:
	$(GO) build ./...
	cd bench && $(GO) build ./...

vet:
	$(GO) vet ./...
	cd bench && $(GO) vet ./...

# go test -race needs cgo (gcc is on this kind of machine).
gotest:
	CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 20m ./...
	cd bench && CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 10m ./...

# lint also cross-builds for arm64 (the library must build on every 64-bit Linux we support).
lint: vet
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	GOARCH=arm64 $(GO) build ./...
	GOARCH=arm64 $(GO) vet ./...
	cd bench && GOARCH=arm64 $(GO) build ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
	cd bench && $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

# apt-get helper used by fragments: $(call apt_need,cmd,package)
define apt_need
	@command -v $(1) >/dev/null 2>&1 || { (apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2); }
endef

-include kmod/kmod.mk
-include kmod/vm/kernels.mk
-include bpf/bpf.mk
-include bench/bench.mk
-include hwq/hwq.mk

test: vet gotest $(TEST_EXTRA)
