# zcbench (issue 4). Included by the top-level Makefile.
#   make bench        the full run, about 3 minutes: table on stdout, JSON and PNG in build/bench/
#   make bench-quick  the same in about 60 s
#   make bench-netns  the full run across two network namespaces joined by a veth pair (root)
# Extra flags: make bench BENCH_FLAGS='-modes net,zc -reps 7'
BENCH_OUT ?= $(BUILD)/bench
BENCH_FLAGS ?=
BENCH_ARGS ?= -json $(BENCH_OUT)/bench.json -png $(BENCH_OUT)/bench.png $(BENCH_FLAGS)

.PHONY: zcbench bench-quick bench-netns

zcbench:
	@mkdir -p $(BUILD) $(BENCH_OUT)
	cd bench && $(GO) build -o $(BUILD)/zcbench ./cmd/zcbench

# iperf3 is the outside reference; without it (no root for apt-get) zcbench says so and goes on.
bench: zcbench
	-$(call apt_need,iperf3,iperf3)
	$(BUILD)/zcbench $(BENCH_ARGS)

bench-quick: zcbench
	-$(call apt_need,iperf3,iperf3)
	$(BUILD)/zcbench -quick $(BENCH_ARGS)

bench-netns: zcbench
	-$(call apt_need,iperf3,iperf3)
	$(BUILD)/zcbench -netns -json $(BENCH_OUT)/bench-netns.json -png $(BENCH_OUT)/bench-netns.png $(BENCH_FLAGS)
