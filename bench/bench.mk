# zcbench (issues 4, 10 and 20). Included by the top-level Makefile.
#   make bench        the full run, about 7-8 minutes (about 3 of them the services suite): table on stdout,
#                     JSON and PNG in build/bench/
#   make bench-quick  the same, short (every scenario, the services included)
#   make bench-netns  the full run across two network namespaces joined by a veth pair (root)
#   make bench-kit    build/bench-kit/: what a machine without Go needs to run the benchmark
# Extra flags: make bench BENCH_FLAGS='-modes net,zc -reps 7'
BENCH_OUT ?= $(BUILD)/bench
BENCH_FLAGS ?=
BENCH_ARGS ?= -json $(BENCH_OUT)/bench.json -png $(BENCH_OUT)/bench.png $(BENCH_FLAGS)
BENCH_KIT ?= $(BUILD)/bench-kit

.PHONY: zcbench bench-quick bench-netns bench-kit

zcbench:
	@mkdir -p $(BUILD) $(BENCH_OUT)
	cd bench && $(GO) build -o $(BUILD)/zcbench ./cmd/zcbench

# iperf3 is the outside reference, wrk the services suite's HTTP load generator, gcc and the
# kernel's uapi headers build the C reference servers (c-uring, c-epoll); without them (no
# root for apt-get) zcbench says so ("mode c-uring: not available: ...") and goes on without
# those runs.
bench: zcbench
	@bash .ci/need.sh -optional iperf3 wrk gcc uringhdr
	$(BUILD)/zcbench $(BENCH_ARGS)

bench-quick: zcbench
	@bash .ci/need.sh -optional iperf3 wrk gcc uringhdr
	$(BUILD)/zcbench -quick $(BENCH_ARGS)

bench-netns: zcbench
	@bash .ci/need.sh -optional iperf3 gcc uringhdr
	$(BUILD)/zcbench -netns -json $(BENCH_OUT)/bench-netns.json -png $(BENCH_OUT)/bench-netns.png $(BENCH_FLAGS)

# A static zcbench (no Go, no C library needed there), the C reference servers linked
# statically (cref/: no gcc needed there; run.sh points ZCBENCH_CREF_BIN at them), iperf3 and wrk with their libraries from this
# machine's Debian packages (apt-get download + dpkg -x: nothing is installed, here or there)
# and run.sh, which puts them on PATH / LD_LIBRARY_PATH and writes bench.json, bench.png and
# bench.txt beside itself. Copy the folder to the machine and run ./run.sh there (as root:
# the zc-cpu steering mode needs BPF); extra arguments go to zcbench.
BENCH_KIT_DEBS := iperf3 libiperf0 libsctp1 libssl3 wrk libluajit-5.1-2 libluajit-5.1-common
bench-kit:
	rm -rf $(BENCH_KIT)
	mkdir -p $(BENCH_KIT)/debs $(BENCH_KIT)/root
	cd bench && CGO_ENABLED=0 $(GO) build -trimpath -o $(BENCH_KIT)/zcbench ./cmd/zcbench
	mkdir -p $(BENCH_KIT)/cref
	for k in uring epoll; do gcc -O2 -Wall -pthread -static -o $(BENCH_KIT)/cref/c-$$k bench/internal/cref/c/$$k.c || exit 1; done
	cd $(BENCH_KIT)/debs && apt-get download $(BENCH_KIT_DEBS)
	for d in $(BENCH_KIT)/debs/*.deb; do dpkg -x "$$d" $(BENCH_KIT)/root || exit 1; done
	rm -rf $(BENCH_KIT)/debs $(BENCH_KIT)/root/usr/share
	cp bench/run-kit.sh $(BENCH_KIT)/run.sh
	chmod +x $(BENCH_KIT)/run.sh
	@du -sh $(BENCH_KIT)
