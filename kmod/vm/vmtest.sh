#!/usr/bin/env bash
# make vmtest: for each kernel line (Debian 12's 6.1 cloud kernel, and its
# 6.12 cloud kernel), build zcshim.ko against that kernel's headers, boot the
# kernel in qemu (software emulation) with an initramfs of busybox-static +
# static Go test binaries, and decide pass/fail from the console output (qemu
# exits 0 on any poweroff).
#
# Everything is fetched with apt-get download + dpkg-deb -x (no system
# install of kernels), pinned to the version the kernel line's metapackage
# points at, and cached under $BUILD/kmodvm/<metapackage>.
#
# Each guest's top-level test results must match kmod/vm/expect/<kernel>.txt (count_tests).
#
# Entries "pin:NAME" are kernels pinned in kmod/vm/kernels/NAME.pin (Linux 7.3
# from trixie-backports): fetched by kmod/vm/debfetch.sh through a private apt
# configuration into a version-keyed cache, booted without the module, running
# the test binaries listed in kmod/vm/tests-NAME. Both Debian image layouts are
# understood: /boot/vmlinuz-ABI (linux-image, up to 6.18) and
# /usr/lib/modules/ABI/vmlinuz (linux-binary, from 6.19 on).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
GO=${GO:-go}
BUILD=${BUILD:-$ROOT/build}
VM=$BUILD/kmodvm
TIMEOUT=${ZCVM_TIMEOUT:-900}
mkdir -p "$VM"

log() { echo "vmtest: $*"; }

# --- host tools ------------------------------------------------------------
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
command -v gcc-12 >/dev/null || need+=(gcc-12)
command -v make >/dev/null || need+=(make)
dpkg -s libelf1 >/dev/null 2>&1 || need+=(libelf1)
updated=0
apt_update() { [ $updated = 1 ] || { apt-get update -qq; updated=1; }; }
if [ ${#need[@]} -gt 0 ]; then
	log "installing ${need[*]}"
	apt_update
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# --- Go test binaries (static) ----------------------------------------------
log "building test binaries"
CGO_ENABLED=0 "$GO" test -c -o "$VM/kmod.test" ./kmod
CGO_ENABLED=0 "$GO" test -c -o "$VM/shim.test" ./kmod/shim
CGO_ENABLED=0 "$GO" build -o "$VM/shimbench" ./kmod/vm/shimbench
# zc's tests over the shim backend (TestShim*: echo/bulk with checksums, nettest, seccomp
# fallback picking the shim).
CGO_ENABLED=0 "$GO" test -c -o "$VM/zc.test" ./zc

# --- per kernel: packages, module, initramfs, boot, verdict ------------------
# Each entry is a Debian metapackage; its pin (ABI, version, kbuild package)
# is cached in $VM/<meta>/pin: delete it to move to a newer kernel.
# linux-image-cloud-amd64 is Debian 12's 6.1; the 6.12 line exercises the
# module's version checks for newer kernel APIs.
KERNELS=${ZCVM_KERNELS:-linux-image-cloud-amd64 linux-image-6.12-cloud-amd64 pin:7.3}
tot_pass=0 tot_fail=0 tot_skip=0 failed_kernels=() fail_summaries=()

run_kernel() {
	local meta=$1 dir=$VM/$1
	case $meta in pin:*) run_pinned "${meta#pin:}"; return ;; esac
	mkdir -p "$dir"
	if [ ! -s "$dir/pin" ]; then
		apt_update
		local ver img abi kb
		ver=$(apt-cache policy "$meta" | awk '/Candidate:/ {print $2}')
		img=$(apt-cache depends "$meta" | awk '/Depends: linux-image-/ {print $2; exit}')
		abi=${img#linux-image-}
		abi=${abi%-cloud-amd64}
		kb=$(apt-cache depends "linux-headers-$abi-cloud-amd64" | awk '/Depends: linux-kbuild-/ {print $2; exit}')
		if [ -z "$ver" ] || [ -z "$abi" ] || [ -z "$kb" ]; then
			log "cannot resolve $meta (apt-get update failed?)"
			return 1
		fi
		echo "$abi $ver $kb" > "$dir/pin"
	fi
	local ABI VER KBUILD
	read -r ABI VER KBUILD < "$dir/pin"
	log "[$meta] kernel $ABI-cloud-amd64, packages $VER"
	local debs=$dir/debs root=$dir/root p
	mkdir -p "$debs"
	for p in "linux-image-$ABI-cloud-amd64" "linux-headers-$ABI-cloud-amd64" "linux-headers-$ABI-common" "$KBUILD"; do
		if ! ls "$debs/${p}_"*.deb >/dev/null 2>&1; then
			apt_update
			(cd "$debs" && apt-get download -q "$p=$VER" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
			ls "$debs/${p}_"*.deb >/dev/null 2>&1 || { log "download of $p=$VER failed"; return 1; }
		fi
	done
	if [ ! -f "$root/.unpacked" ]; then
		rm -rf "$root" && mkdir -p "$root"
		local d
		for d in "$debs"/*.deb; do dpkg-deb -x "$d" "$root"; done
		touch "$root/.unpacked"
	fi
	local kdir=$root/usr/src/linux-headers-$ABI-cloud-amd64
	# The flavour Makefile includes the -common tree by absolute path.
	sed -i "s#^include .*/usr/src/linux-headers-#include $root/usr/src/linux-headers-#" "$kdir/Makefile"
	local vmlinuz=$root/boot/vmlinuz-$ABI-cloud-amd64

	local src=$dir/src
	rm -rf "$src" && mkdir -p "$src/uapi"
	cp kmod/zcshim.c kmod/Kbuild "$src/" && cp kmod/uapi/zcshim.h "$src/uapi/"
	log "[$meta] building zcshim.ko"
	make -s -C "$kdir" M="$src" CONFIG_DEBUG_INFO_BTF_MODULES= modules 2>&1 | grep -v 'Skipping BTF generation' | tee "$dir/build.log" || true
	[ -f "$src/zcshim.ko" ] || { log "[$meta] module build failed"; return 1; }
	if grep -q 'warning:' "$dir/build.log"; then log "[$meta] compiler warnings (above)"; return 1; fi

	local ir=$dir/initramfs
	rm -rf "$ir" && mkdir -p "$ir/bin" "$ir/proc" "$ir/sys" "$ir/dev" "$ir/tmp"
	cp /bin/busybox "$ir/bin/busybox"
	cp kmod/vm/init "$ir/init"
	cp "$src/zcshim.ko" "$ir/zcshim.ko"
	cp "$VM/kmod.test" "$VM/shim.test" "$VM/zc.test" "$VM/shimbench" "$ir/"
	if [ -n "${ZCVM_SHIM_ARGS:-}" ]; then echo "$ZCVM_SHIM_ARGS" > "$ir/shim.args"; fi
	if [ -n "${ZCVM_ZC_ARGS:-}" ]; then echo "$ZCVM_ZC_ARGS" > "$ir/zc.args"; fi
	if [ -n "${ZCVM_BENCH_MB:-}" ]; then echo "ZCVM_BENCH_MB=$ZCVM_BENCH_MB" > "$ir/env"; fi
	(cd "$ir" && find . | cpio -o -H newc --quiet | gzip -1 > "$dir/initrd.gz")
	boot_and_judge "$meta" "$dir" "$vmlinuz"
}

# boot_and_judge LABEL DIR VMLINUZ: boot DIR/initrd.gz under TCG, decide from the console.
boot_and_judge() {
	local meta=$1 dir=$2 vmlinuz=$3
	local console=$dir/console.log qrc
	log "[$meta] booting (TCG, timeout ${TIMEOUT}s); console in $console"
	local boot
	for boot in 1 2; do
		set +e
		timeout --foreground -k 10 "$TIMEOUT" qemu-system-x86_64 -accel tcg -cpu max -smp 2 -m 1536 \
			-nographic -no-reboot -nodefaults -serial stdio \
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

# fail_summary LABEL CONSOLE: each failed test with the lines it logged (the indented
# lines under "--- FAIL", at most 40), and any panic with its first goroutine, so that
# the tail of a CI log (the last screen is often all a reader gets) says what failed.
fail_summary() {
	awk -v m="[$1] " '
		/^--- FAIL/ { n = 40; print m $0; next }
		/^panic: / { p = 40; n = 0; print m $0; next }
		p > 0 { p--; print m $0; next }
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

# run_pinned NAME: the kernel of kmod/vm/kernels/NAME.pin, no module, the test binaries of
# kmod/vm/tests-NAME.
run_pinned() {
	local name=$1 meta=pin:$1 dir=$VM/pin-$1 pin=kmod/vm/kernels/$1.pin list=kmod/vm/tests-$1
	local debs abi root=$VM/pin-$1/root
	[ -f "$pin" ] && [ -f "$list" ] || { log "[$meta] no $pin or $list"; return 1; }
	grep -q '^MODULE=no' "$pin" || { log "[$meta] pinned kernels run without the module only (MODULE=no)"; return 1; }
	debs=$(BUILD="$BUILD" bash kmod/vm/debfetch.sh "$pin") || { log "[$meta] cannot get the pinned packages (above)"; return 1; }
	abi=$(awk -F= '$1 == "ABI" { print $2; exit }' "$pin")
	mkdir -p "$dir"
	if [ "$(cat "$root/.from" 2>/dev/null)" != "$debs" ]; then
		rm -rf "$root" && mkdir -p "$root"
		local d
		for d in "$debs"/*.deb; do dpkg-deb -x "$d" "$root"; done
		echo "$debs" > "$root/.from"
	fi
	local vmlinuz=$root/usr/lib/modules/$abi/vmlinuz config=$root/usr/lib/modules/$abi/config
	[ -f "$vmlinuz" ] || vmlinuz=$root/boot/vmlinuz-$abi
	[ -f "$config" ] || config=$root/boot/config-$abi
	[ -f "$vmlinuz" ] || { log "[$meta] no kernel image for $abi in $debs"; return 1; }
	log "[$meta] kernel $abi ($(basename "$debs")), no module; $(grep -cE '^CONFIG_(IO_URING_ZCRX|UDMABUF)=y' "$config" 2>/dev/null || echo 0)/2 of CONFIG_IO_URING_ZCRX, CONFIG_UDMABUF built in"

	local ir=$dir/initramfs bin pkg args
	rm -rf "$ir" && mkdir -p "$ir/bin" "$ir/proc" "$ir/sys" "$ir/dev" "$ir/tmp"
	cp /bin/busybox "$ir/bin/busybox"
	cp kmod/vm/init-tests "$ir/init"
	: > "$ir/tests.list"
	while read -r bin pkg args; do
		case "$bin" in ''|'#'*) continue ;; esac
		CGO_ENABLED=0 "$GO" test -c -o "$ir/$bin" "$pkg" || { log "[$meta] cannot build $pkg"; return 1; }
		echo "$bin $args" >> "$ir/tests.list"
	done < "$list"
	local genv
	genv=$(awk '/^GUEST_ENV=/ { sub(/^GUEST_ENV=/, ""); print; exit }' "$pin")
	if [ -n "$genv" ]; then echo "export $genv" > "$ir/env"; fi
	if [ -n "${ZCVM_PIN_ARGS:-}" ]; then sed -i "s#\$# $ZCVM_PIN_ARGS#" "$ir/tests.list"; fi
	(cd "$ir" && find . | cpio -o -H newc --quiet | gzip -1 > "$dir/initrd.gz")
	boot_and_judge "$meta" "$dir" "$vmlinuz"
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
