#!/usr/bin/env bash
# Compiles the BPF C programs in c/ and generates their Go bindings with
# bpf2go. The one place that lists bpf2go's arguments: used by go:generate
# (gen.go), by `make bpf` and by `make bpf-check` (which passes a temporary
# output directory and diffs the result against the committed files).
#
# usage: gen.sh [output-dir]     (default: this directory)
set -euo pipefail
cd "$(dirname "$0")"
out=${1:-.}
mkdir -p "$out"
# Debian keeps asm/types.h under the multiarch directory.
multiarch=$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)
cflags="-O2 -g -Wall -Werror -I./c -I/usr/include/$multiarch"
b2g() { GOPACKAGE=bpf go run github.com/cilium/ebpf/cmd/bpf2go -no-global-types -target bpfel -output-dir "$out" "$@"; }
# The capture programs belong to package bpf/capture (their own directory).
b2g_capture() { GOPACKAGE=capture go run github.com/cilium/ebpf/cmd/bpf2go -no-global-types -target bpfel -output-dir "$out/capture" "$@"; }

b2g -type flow_key -type config -type conn -type cc_key -type cc_policy \
	-type flow_stats -type queue_stats \
	steer c/steer.bpf.c -- $cflags
b2g -type fault_config fault c/fault.bpf.c -- $cflags
b2g -type xsk_rule -type xsk_config -type xsk_rule_stats -type xsk_meta \
	xsk c/xsk.bpf.c -- $cflags
mkdir -p "$out/capture"
b2g_capture -type flow_key -type cap_record -type cap_config -type cap_ifstats \
	capture c/capture.bpf.c -- $cflags

# Record which sources the committed objects were built from (checked by
# TestGeneratedUpToDate without needing clang).
(cd c && sha256sum zcnet.h steer.bpf.c fault.bpf.c capture.h capture.bpf.c xsk.h xsk.bpf.c) >"$out/sources.sha256"
