#!/usr/bin/env bash
# make vmtest: for each pinned kernel (kmod/vm/kernels/NAME.pin: Debian's 6.1 and 6.12 cloud
# kernels with zcshim.ko built against their headers, and 7.3 from trixie-backports without
# it), boot the kernel in qemu (software emulation) with an initramfs of busybox-static +
# static Go test binaries (+ the modules the pin's GUEST_MODULES name), and decide pass/fail
# from the console output (qemu exits 0 on any poweroff).
#
# The .debs come from kmod/vm/debfetch.sh: each package at its pinned version and checksum,
# from a cache keyed by pin and ABI, through a private apt configuration (the machine's apt
# sources are never used for kernels); a pin that left the archive moves to its line's newest
# build for the run, with one log line. Both Debian image layouts are understood:
# /boot/vmlinuz-ABI (linux-image, up to 6.18) and /usr/lib/modules/ABI/vmlinuz (linux-binary,
# from 6.19 on). A pin with NET=pair gives its guest two virtio-net NICs joined on the host.
#
# Each guest's top-level test results must match kmod/vm/expect/NAME.txt (count_tests).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
GO=${GO:-go}
BUILD=${BUILD:-$ROOT/build}
VM=$BUILD/kmodvm
TIMEOUT=${ZCVM_TIMEOUT:-900}
mkdir -p "$VM"

log() { echo "vmtest: $*"; }

# --- host tools (named once, in .ci/packages.txt) ------------------------------
bash .ci/need.sh make gcc12 libelf qemu busybox cpio xz iproute2 openssl keyrings

# --- Go test binaries (static) ----------------------------------------------
log "building test binaries"
CGO_ENABLED=0 "$GO" test -c -o "$VM/kmod.test" ./kmod
CGO_ENABLED=0 "$GO" test -c -o "$VM/shim.test" ./kmod/shim
CGO_ENABLED=0 "$GO" build -o "$VM/shimbench" ./kmod/vm/shimbench
# zc's tests over the shim backend (TestShim*: echo/bulk with checksums, nettest, seccomp
# fallback picking the shim).
CGO_ENABLED=0 "$GO" test -c -o "$VM/zc.test" ./zc

# --- per kernel: packages, module, initramfs, boot, verdict ------------------
# Each entry names a pin, kmod/vm/kernels/NAME.pin: 6.1 (Debian 12's cloud kernel, zcshim's
# oldest line), 6.12 (the module's version checks for newer kernel APIs), 7.3 (device-less
# zcrx, no module). debfetch.sh makes the pinned .debs available (or the line's newest build,
# with one log line, when the pin left the archive).
KERNELS=${ZCVM_KERNELS:-6.1 6.12 7.3}
tot_pass=0 tot_fail=0 tot_skip=0 failed_kernels=() fail_summaries=()

pinval() { awk -F= -v k="$2" '$1 == k { sub(/^[^=]*=/, ""); print; exit }' "$1"; }

# guest_modules ROOT ABI IR NAMES...: the kernel's modules NAMES with what they depend on, and
# the crypto modules the kernel asks for by algorithm name (kernel TLS: gcm(aes), ghash,
# chacha20poly1305), uncompressed into IR/lib/modules/ABI with a modules.dep (busybox
# depmod); IR/modules.list names what the guest's init loads with modprobe.
guest_modules() {
	local root=$1 abi=$2 ir=$3 mdir m f rel dst
	shift 3
	[ $# -gt 0 ] || return 0
	mdir=$root/lib/modules/$abi
	[ -d "$mdir" ] || mdir=$root/usr/lib/modules/$abi
	[ -d "$mdir/kernel" ] || { log "no modules in $mdir"; return 1; }
	local want=("$@") seen=" " todo=("$@")
	while [ ${#todo[@]} -gt 0 ]; do
		m=${todo[0]} todo=("${todo[@]:1}")
		case "$seen" in *" $m "*) continue ;; esac
		seen+="$m "
		f=$(find "$mdir/kernel" -name "$m.ko*" -o -name "${m//_/-}.ko*" | head -1)
		[ -n "$f" ] || { log "module $m not in $mdir"; return 1; }
		local deps
		deps=$(case $f in *.xz) xz -dc "$f" ;; *.zst) zstd -dc "$f" ;; *) cat "$f" ;; esac |
			strings | awk -F= '$1 == "depends" { gsub(/,/, " ", $2); print $2; exit }')
		# shellcheck disable=SC2206
		todo+=($deps)
	done
	# the algorithms' modules (loaded on demand through modprobe's aliases)
	local extra
	extra=$(find "$mdir/kernel/crypto" "$mdir/kernel/arch/x86/crypto" "$mdir/kernel/lib" -name '*.ko*' 2>/dev/null)
	for f in $(for m in $seen; do find "$mdir/kernel" -name "$m.ko*" -o -name "${m//_/-}.ko*"; done) $extra; do
		rel=${f#"$mdir"/}
		dst=$ir/lib/modules/$abi/${rel%.xz}
		dst=${dst%.zst}
		mkdir -p "$(dirname "$dst")"
		case $f in *.xz) xz -dc "$f" > "$dst" ;; *.zst) zstd -dc "$f" > "$dst" ;; *) cp "$f" "$dst" ;; esac
	done
	/bin/busybox depmod -b "$ir" "$abi" || { log "depmod failed"; return 1; }
	printf '%s\n' "${want[@]}" > "$ir/modules.list"
}

# guest_binaries IR NAMES...: this machine's programs NAMES (installed through .ci/need.sh,
# e.g. openssl for the TLS interop tests) in IR/bin, with the shared libraries and the dynamic
# loader they need at the same paths.
guest_binaries() {
	local ir=$1 name path lib
	shift
	for name in "$@"; do
		path=$(command -v "$name") || { log "no $name on this machine (bash .ci/need.sh $name)"; return 1; }
		cp -L "$path" "$ir/bin/$name"
		if [ "$name" = openssl ] && [ -e /usr/lib/ssl/openssl.cnf ]; then
			mkdir -p "$ir/usr/lib/ssl" && cp -L /usr/lib/ssl/openssl.cnf "$ir/usr/lib/ssl/"
		fi
		for lib in $(ldd "$path" | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }'); do
			mkdir -p "$ir$(dirname "$lib")"
			cp -L "$lib" "$ir$lib"
		done
	done
	# /lib64 may be a link on this machine: the loader's path must resolve in the guest too
	[ -e "$ir/lib64/ld-linux-x86-64.so.2" ] || [ ! -e /lib64/ld-linux-x86-64.so.2 ] || {
		mkdir -p "$ir/lib64" && cp -L /lib64/ld-linux-x86-64.so.2 "$ir/lib64/"; }
}

# qemu_net LABEL: the guest's network. "pair" gives the guest two virtio-net NICs joined on
# the host by a bridge between two taps, inside a network namespace of this run's own (nothing
# is added to the host's namespace), so that TCP between them leaves through one NIC's TX
# queue and arrives on the other's RX queue: there the kernel does not copy zero-copy sends.
# Sets QEMU_PRE (the command prefix) and QEMU_NET_ARGS.
NETNS_MADE=()
cleanup_netns() { local n; for n in "${NETNS_MADE[@]}"; do ip netns del "$n" 2>/dev/null || true; done; }
trap cleanup_netns EXIT
qemu_net() {
	local mode=$1 ns
	QEMU_PRE=() QEMU_NET_ARGS=()
	[ "$mode" = pair ] || return 0
	ns=zcvm-$$-$RANDOM
	ip netns add "$ns" || { log "cannot create network namespace $ns"; return 1; }
	NETNS_MADE+=("$ns")
	ip -n "$ns" link add zcbr type bridge &&
		ip -n "$ns" tuntap add dev zctap0 mode tap vnet_hdr &&
		ip -n "$ns" tuntap add dev zctap1 mode tap vnet_hdr &&
		ip -n "$ns" link set zctap0 master zcbr &&
		ip -n "$ns" link set zctap1 master zcbr &&
		ip -n "$ns" link set zcbr up && ip -n "$ns" link set zctap0 up && ip -n "$ns" link set zctap1 up ||
		{ log "cannot build the taps and bridge in $ns"; return 1; }
	QEMU_PRE=(ip netns exec "$ns")
	QEMU_NET_ARGS=(
		-netdev tap,id=zn0,ifname=zctap0,script=no,downscript=no,vhost=off
		-device virtio-net-pci,netdev=zn0,mac=52:54:00:5a:43:00
		-netdev tap,id=zn1,ifname=zctap1,script=no,downscript=no,vhost=off
		-device virtio-net-pci,netdev=zn1,mac=52:54:00:5a:43:01
	)
}

# run_kernel NAME: the kernel of kmod/vm/kernels/NAME.pin; with MODULE=yes zcshim.ko is built
# against its headers and kmod/vm/init runs the module's tests, with MODULE=no
# kmod/vm/init-tests runs the test binaries of kmod/vm/tests-NAME.
run_kernel() {
	local name=$1 meta=$1 dir=$VM/pin-$1 pin=kmod/vm/kernels/$1.pin
	local debs ABI root=$VM/pin-$1/root
	[ -f "$pin" ] || { log "[$meta] no $pin"; return 1; }
	debs=$(BUILD="$BUILD" bash kmod/vm/debfetch.sh "$pin") || { log "[$meta] cannot get the pinned packages (above)"; return 1; }
	ABI=$(awk -F= '$1 == "ABI" { print $2; exit }' "$debs/pin.env")
	mkdir -p "$dir"
	if [ "$(cat "$root/.from" 2>/dev/null)" != "$debs" ]; then
		rm -rf "$root" && mkdir -p "$root"
		local d
		for d in "$debs"/*.deb; do dpkg-deb -x "$d" "$root"; done
		echo "$debs" > "$root/.from"
	fi
	local vmlinuz=$root/usr/lib/modules/$ABI/vmlinuz config=$root/usr/lib/modules/$ABI/config
	[ -f "$vmlinuz" ] || vmlinuz=$root/boot/vmlinuz-$ABI
	[ -f "$config" ] || config=$root/boot/config-$ABI
	[ -f "$vmlinuz" ] || { log "[$meta] no kernel image for $ABI in $debs"; return 1; }
	log "[$meta] kernel $ABI ($(basename "$debs")); built in: $(grep -oE '^CONFIG_(IO_URING_ZCRX|UDMABUF|TLS|VIRTIO_NET)=[ym]' "$config" 2>/dev/null | tr '\n' ' ')"

	local ir=$dir/initramfs
	rm -rf "$ir" && mkdir -p "$ir/bin" "$ir/proc" "$ir/sys" "$ir/dev" "$ir/tmp"
	cp /bin/busybox "$ir/bin/busybox"
	if [ "$(pinval "$pin" MODULE)" = yes ]; then
		local kdir=$root/usr/src/linux-headers-$ABI
		# The flavour Makefile includes the -common tree by absolute path.
		sed -i "s#^include .*/usr/src/linux-headers-#include $root/usr/src/linux-headers-#" "$kdir/Makefile"
		local src=$dir/src
		rm -rf "$src" && mkdir -p "$src/uapi"
		cp kmod/zcshim.c kmod/Kbuild "$src/" && cp kmod/uapi/zcshim.h "$src/uapi/"
		log "[$meta] building zcshim.ko"
		make -s -C "$kdir" M="$src" CONFIG_DEBUG_INFO_BTF_MODULES= modules 2>&1 | grep -v 'Skipping BTF generation' | tee "$dir/build.log" || true
		[ -f "$src/zcshim.ko" ] || { log "[$meta] module build failed"; return 1; }
		if grep -q 'warning:' "$dir/build.log"; then log "[$meta] compiler warnings (above)"; return 1; fi
		cp kmod/vm/init "$ir/init"
		cp "$src/zcshim.ko" "$ir/zcshim.ko"
		cp "$VM/kmod.test" "$VM/shim.test" "$VM/zc.test" "$VM/shimbench" "$ir/"
		if [ -n "${ZCVM_SHIM_ARGS:-}" ]; then echo "$ZCVM_SHIM_ARGS" > "$ir/shim.args"; fi
		if [ -n "${ZCVM_ZC_ARGS:-}" ]; then echo "$ZCVM_ZC_ARGS" > "$ir/zc.args"; fi
	else
		cp kmod/vm/init-tests "$ir/init"
	fi
	# Test binaries of kmod/vm/tests-NAME ("binary package [flags]" a line), on every guest.
	local list=kmod/vm/tests-$name bin pkg
	: > "$ir/tests.list"
	if [ -f "$list" ]; then
		while read -r bin pkg args; do
			case "$bin" in ''|'#'*) continue ;; esac
			if [ ! -f "$VM/bin/$bin" ] || [ -z "${built[$bin]:-}" ]; then
				mkdir -p "$VM/bin"
				CGO_ENABLED=0 "$GO" test -c -o "$VM/bin/$bin" "$pkg" || { log "[$meta] cannot build $pkg"; return 1; }
				built[$bin]=1
			fi
			cp "$VM/bin/$bin" "$ir/$bin"
			echo "$bin $args" >> "$ir/tests.list"
		done < "$list"
	fi
	# shellcheck disable=SC2046
	guest_modules "$root" "$ABI" "$ir" $(pinval "$pin" GUEST_MODULES) || { log "[$meta] cannot put the guest's modules together"; return 1; }
	# shellcheck disable=SC2046
	guest_binaries "$ir" $(pinval "$pin" GUEST_BINARIES) || { log "[$meta] cannot put the guest's programs together"; return 1; }
	local genv
	genv=$(pinval "$pin" GUEST_ENV)
	: > "$ir/env"
	if [ -n "$genv" ]; then echo "export $genv" >> "$ir/env"; fi
	if [ -n "${ZCVM_BENCH_MB:-}" ]; then echo "export ZCVM_BENCH_MB=$ZCVM_BENCH_MB" >> "$ir/env"; fi
	if [ -n "${ZCVM_PIN_ARGS:-}" ]; then sed -i "s#\$# $ZCVM_PIN_ARGS#" "$ir/tests.list"; fi
	qemu_net "$(pinval "$pin" NET)" || return 1
	if [ ${#QEMU_NET_ARGS[@]} -gt 0 ]; then echo "export ZCVM_NET=pair" >> "$ir/env"; fi
	(cd "$ir" && find . | cpio -o -H newc --quiet | gzip -1 > "$dir/initrd.gz")
	boot_and_judge "$meta" "$dir" "$vmlinuz"
}
declare -A built=()

# boot_and_judge LABEL DIR VMLINUZ: boot DIR/initrd.gz under TCG, decide from the console.
boot_and_judge() {
	local meta=$1 dir=$2 vmlinuz=$3
	local console=$dir/console.log qrc
	log "[$meta] booting (TCG, timeout ${TIMEOUT}s); console in $console"
	local boot
	for boot in 1 2; do
		set +e
		timeout --foreground -k 10 "$TIMEOUT" "${QEMU_PRE[@]}" qemu-system-x86_64 -accel tcg -cpu max -smp 2 -m 1536 \
			-nographic -no-reboot -nodefaults -serial stdio "${QEMU_NET_ARGS[@]}" \
			-kernel "$vmlinuz" -initrd "$dir/initrd.gz" \
			-append "console=ttyS0 panic=-1 loglevel=4 rdinit=/init" > "$console" 2>&1
		qrc=$?
		set -e
		tr -d '\r' < "$console" > "$console.txt"
		# Under TCG the 6.12 kernel now and then dies patching its own text (int3 Oops in
		# an initcall) before /init runs: that is no verdict on our code, boot once more.
		if [ $boot = 1 ] && ! grep -q 'ZCVM: start' "$console.txt"; then
			cp "$console.txt" "$dir/console.boot1.txt"
			log "[$meta] the kernel died before /init ran (see $dir/console.boot1.txt); booting again"
			continue
		fi
		break
	done
	grep -E '^(--- (FAIL|SKIP)|FAIL|ZCVM:|MEASURE)' "$console.txt" | sed "s#^#[$meta] #" || true
	grep '^MEASURE' "$console.txt" > "$dir/measure.txt" || true

	local fail=0 np nf ns
	count_tests "$meta" "$console.txt" || fail=1
	if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then log "[$meta] FAIL: timed out after ${TIMEOUT}s"; fail=1; fi
	grep -q '^ZCVM: result rc=0' "$console.txt" || { log "[$meta] FAIL: tests did not report success"; fail=1; }
	if grep -nE 'BUG:|WARNING:|Oops|general protection|Call Trace|zcshim: LEAK|kernel panic|Kernel panic|refcount_t:|list_(add|del) corruption' "$console.txt"; then
		log "[$meta] FAIL: kernel log shows a bug, warning or leak (above)"
		fail=1
	fi
	if grep -q '^--- FAIL' "$console.txt"; then log "[$meta] FAIL: a test failed"; fail=1; fi
	np=$(grep -c '^--- PASS' "$console.txt" || true)
	nf=$(grep -c '^--- FAIL' "$console.txt" || true)
	ns=$(grep -c '^--- SKIP' "$console.txt" || true)
	log "[$meta] $np passed, $nf failed, $ns skipped"
	tot_pass=$((tot_pass + np)) tot_fail=$((tot_fail + nf)) tot_skip=$((tot_skip + ns))
	if [ $fail != 0 ]; then
		log "[$meta] see $console.txt"
		fail_summary "$meta" "$console.txt" > "$dir/fail-summary.txt"
		fail_summaries+=("$dir/fail-summary.txt")
		return 1
	fi
	return 0
}

# fail_summary LABEL CONSOLE: each failed test with the lines it logged, and any panic with
# its first goroutine, so that the tail of a CI log (the last screen is often all a reader
# gets) says what failed and why. Under -test.v a test's log lines come before its "--- FAIL"
# (after its "=== RUN"/"=== NAME"/"=== CONT" line; subtests' results are printed as a tree
# when the parent ends), so each test's last 40 log lines are kept and printed under its
# FAIL line; without -v they follow it (the indented lines under "--- FAIL", at most 40).
fail_summary() {
	awk -v m="[$1] " '
		/^=== (RUN|NAME|CONT) / { n = 0; cur = $3; if ($2 == "RUN") c[cur] = 0; next }
		/^[ \t]*--- FAIL: / {
			n = 40; print m $0
			t = $3
			for (i = (c[t] > 40 ? c[t] - 39 : 1); i <= c[t]; i++) print m "  | " l[t, i % 40]
			next
		}
		/^panic: / { p = 40; n = 0; print m $0; next }
		p > 0 { p--; print m $0; next }
		cur != "" && /^[ \t]/ && !/^[ \t]*--- (PASS|SKIP): / { c[cur]++; l[cur, c[cur] % 40] = $0 }
		n > 0 && (/^[ \t]/ || /^goroutine / || /^$/) { n--; print m $0; next }
		{ n = 0 }' "$2"
}

# count_tests LABEL CONSOLE: the guest's top-level test results ("BINARY STATUS Test" a line,
# the binary from the "ZCVM: run BINARY" marker before it) must be exactly
# kmod/vm/expect/LABEL.txt: a renamed test, a -test.run pattern that matches nothing, a new
# skip or a test that stopped running fails the kernel. ZCVM_WRITE_EXPECT=1 writes the file
# from this run instead (review the diff before committing it).
count_tests() {
	local meta=$1 console=$2 want got
	want=kmod/vm/expect/$(echo "$meta" | tr ':/' '--').txt
	got=$(awk '
		match($0, /ZCVM: run [^ ]+/) { bin = substr($0, RSTART + 10, RLENGTH - 10) }
		/^--- (PASS|FAIL|SKIP): / { print bin, substr($2, 1, length($2) - 1), $3 }
	' "$console" | sort)
	if [ "${ZCVM_WRITE_EXPECT:-}" = 1 ]; then
		if grep -q ' FAIL ' <<< "$got"; then
			log "[$meta] FAIL: not writing $want from a run with failed tests"
			return 1
		fi
		mkdir -p "$(dirname "$want")"
		printf '%s\n' "$got" > "$want"
		log "[$meta] wrote $want ($(wc -l < "$want") tests)"
		return 0
	fi
	if [ ! -f "$want" ]; then
		log "[$meta] FAIL: no $want (ZCVM_WRITE_EXPECT=1 writes it from a run)"
		return 1
	fi
	local gp gs wp ws
	gp=$(grep -c ' PASS ' <<< "$got" || true) gs=$(grep -c ' SKIP ' <<< "$got" || true)
	wp=$(grep -c ' PASS ' "$want" || true) ws=$(grep -c ' SKIP ' "$want" || true)
	if ! diff -u "$want" <(printf '%s\n' "$got") > "$console.expect.diff"; then
		log "[$meta] FAIL: $gp passed and $gs skipped, $want expects $wp and $ws; the difference (- expected, + this run):"
		grep -E '^[-+][^-+]' "$console.expect.diff" | sed "s#^#[$meta]   #"
		return 1
	fi
	log "[$meta] $gp passed and $gs skipped, as $want expects"
}

for k in $KERNELS; do
	run_kernel "$k" || failed_kernels+=("$k")
done
if [ ${#failed_kernels[@]} -gt 0 ] && [ "$tot_fail" = 0 ]; then tot_fail=${#failed_kernels[@]}; fi
for f in "${fail_summaries[@]}"; do
	[ -s "$f" ] || continue
	log "what failed, again ($f):"
	cat "$f"
done
echo "vmtest: $tot_pass passed, $tot_fail failed, $tot_skip skipped"
if [ ${#failed_kernels[@]} -gt 0 ]; then
	log "FAIL on: ${failed_kernels[*]}"
	exit 1
fi
log "PASS"
