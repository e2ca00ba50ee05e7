#!/bin/sh
# run.sh of the benchmark kit (make bench-kit): runs the static zcbench beside it, with
# iperf3 and wrk with their libraries from the Debian packages unpacked under root/, and writes
# bench.txt, bench.json and bench.png beside itself. Arguments go to zcbench
# (./run.sh -quick, ./run.sh -scenarios multicore,idle).
set -e
here=$(cd "$(dirname "$0")" && pwd)
PATH="$here/root/usr/bin:$PATH"
libs=""
for d in "$here"/root/usr/lib/*-linux-gnu "$here"/root/lib/*-linux-gnu; do
	[ -d "$d" ] && libs="$libs${libs:+:}$d"
done
LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# the C reference servers (c-uring, c-epoll), prebuilt: no gcc there
ZCBENCH_CREF_BIN="$here/cref"
export PATH LD_LIBRARY_PATH ZCBENCH_CREF_BIN
"$here/zcbench" -json "$here/bench.json" -png "$here/bench.png" "$@" | tee "$here/bench.txt"
