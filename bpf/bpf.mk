# bpf/bpf.mk - included by the top-level Makefile.
#
#   make bpf        recompile bpf/c/*.bpf.c and regenerate the Go bindings
#                   (installs clang, llvm and libbpf-dev from Debian if missing)
#   make bpf-check  regenerate into a temporary directory and fail if the
#                   result differs from what is committed (part of make test)
#
# The compiled objects are committed, so go build / go test need no clang.
# Objects are byte-for-byte reproducible with the same clang (Debian 12:
# clang 14); a different clang version makes bpf-check fail with a diff.

BPF_GENERATED := steer_bpfel.go steer_bpfel.o fault_bpfel.go fault_bpfel.o xsk_bpfel.go xsk_bpfel.o sources.sha256 \
	capture/capture_bpfel.go capture/capture_bpfel.o

.PHONY: bpf bpf-check bpf-deps

bpf-deps:
	@bash .ci/need.sh clang llvm libbpf libcdev

bpf: bpf-deps
	bpf/gen.sh

bpf-check: bpf-deps
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	bpf/gen.sh "$$tmp" >/dev/null && \
	ok=1 && for f in $(BPF_GENERATED); do \
		cmp -s "bpf/$$f" "$$tmp/$$f" || { echo "bpf-check: bpf/$$f differs from a fresh build (run make bpf and commit; $$(clang --version | head -1))"; ok=0; }; \
	done && [ $$ok = 1 ] && echo "bpf-check: committed BPF objects match the sources"

TEST_EXTRA += bpf-check

# bpf/capture's tests read their pcapng files back with tshark (Wireshark's
# command-line reader, an independent pcapng implementation). Installed
# before the Go tests run; the debconf question of wireshark-common
# (setuid dumpcap for non-root users) is answered "no" beforehand.
.PHONY: capture-deps
capture-deps:
	@bash .ci/need.sh tshark

gotest: capture-deps

# What capture costs the flows it records (bench/cmd/capbench, root): zc bulk and echo
# across a veth pair with capture off / attached but not matching / headers / full.
.PHONY: capbench
capbench:
	@mkdir -p $(BUILD)
	cd bench && $(GO) build -o $(BUILD)/capbench ./cmd/capbench
	$(BUILD)/capbench $(CAPBENCH_FLAGS)
