# zcnet build. Every target installs what it needs (apt-get / go install); nothing relies on a
# hand-installed tool. Package fragments (kmod/kmod.mk, kmod/vm/kernels.mk, bpf/bpf.mk, bench/bench.mk) add targets
# and append to TEST_EXTRA.
SHELL := /bin/bash
GO ?= go
GOFLAGS ?=
export GOFLAGS
TEST_EXTRA :=
BUILD := $(CURDIR)/build

.PHONY: all build test gotest skipcheck vet lint bench fresh-test
all: build

# bench/ is its own module (so the library's go.mod does not pull plotting into users' builds).
MODULES := . bench

build:
	$(GO) build ./...
	cd bench && $(GO) build ./...

vet:
	$(GO) vet ./...
	cd bench && $(GO) vet ./...

# go test -race needs cgo (gcc is on this kind of machine). The runs' JSON goes through
# skipcheck (internal/testutil/skipcheck): it prints what go test prints, keeps the stream in
# build/, and then fails on any skip that internal/testutil/skips.txt does not allow with a
# reason, so a capability that regresses cannot turn into a skip.
SKIPCHECK := $(BUILD)/skipcheck
SKIPS_ALLOWED := internal/testutil/skips.txt
gotest:
	@bash .ci/need.sh gcc wrk iperf3 uringhdr
	@mkdir -p $(BUILD)
	$(GO) build -o $(SKIPCHECK) ./internal/testutil/skipcheck
	set -o pipefail; CGO_ENABLED=1 $(GO) test -json -race -count=1 -timeout 20m ./... | $(SKIPCHECK) -echo -record $(BUILD)/gotest.json
	set -o pipefail; cd bench && CGO_ENABLED=1 $(GO) test -json -race -count=1 -timeout 10m ./... | $(SKIPCHECK) -echo -record $(BUILD)/gotest-bench.json
	$(SKIPCHECK) -allow $(SKIPS_ALLOWED) $(BUILD)/gotest.json $(BUILD)/gotest-bench.json

# skipcheck alone, on the JSON of the last make gotest.
skipcheck:
	$(SKIPCHECK) -allow $(SKIPS_ALLOWED) $(BUILD)/gotest.json $(BUILD)/gotest-bench.json

# lint also cross-builds for arm64 (the library must build on every 64-bit Linux we support),
# and fails on a change of the public packages' exported API that doc/api.txt does not hold
# (internal/testutil/apigolden: a change is deliberate when its diff is committed with it).
lint: vet
	$(GO) run ./internal/testutil/apigolden -check doc/api.txt
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	GOARCH=arm64 $(GO) build ./...
	GOARCH=arm64 $(GO) vet ./...
	cd bench && GOARCH=arm64 $(GO) build ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
	cd bench && $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

# What make test and make bench install is named once, in .ci/packages.txt; fragments call
# .ci/need.sh NAME... (a missing package it cannot install fails with the command to run).

-include kmod/kmod.mk
-include kmod/vm/kernels.mk
-include bpf/bpf.mk
-include bench/bench.mk
-include hwq/hwq.mk

# The io_uring ABI (internal/uring/zabi_linux.go) is generated from the pinned Linux 7.3 uapi
# headers (go generate ./internal/uring: types_uring.go names what is taken, mkabi.go writes
# it); uring-abi-check regenerates it and fails on any difference from the committed file, and
# fails when the headers cannot be had (make uapi73 says why).
.PHONY: uring-abi-check
uring-abi-check: uapi73
	@bash .ci/need.sh gcc
	cd internal/uring && ZCNET_UAPI73=$(UAPI73)/usr/include $(GO) run mkabi.go -check

TEST_EXTRA += uring-abi-check

test: vet gotest $(TEST_EXTRA)

# make test as a machine that never ran it sees it: the committed tree (HEAD, not the working
# tree) cloned into a temporary folder, with an empty build/ (no cached kernels) and an empty
# Go build cache. Run it before a submission that touches the harness. FRESH_KEEP=1 keeps the
# folder; FRESH_ARGS adds make arguments (FRESH_ARGS='vmtest' runs only the guests).
FRESH_ARGS ?= test
fresh-test:
	@tmp=$$(mktemp -d /tmp/zcnet-fresh.XXXXXX) && echo "fresh-test: $$(git rev-parse --short HEAD) in $$tmp" && \
	git clone -q --no-hardlinks "$(CURDIR)" "$$tmp/zcnet" && \
	( cd "$$tmp/zcnet" && GOCACHE="$$tmp/gocache" $(MAKE) --no-print-directory $(FRESH_ARGS) ); rc=$$?; \
	if [ -z "$(FRESH_KEEP)" ]; then rm -rf "$$tmp"; else echo "fresh-test: kept $$tmp"; fi; \
	echo "fresh-test: make $(FRESH_ARGS) exited $$rc"; exit $$rc
