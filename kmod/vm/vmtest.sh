#!/usr/bin/env bash
# make vmtest: build zcshim.ko against Debian 12's 6.1 cloud kernel headers,
# boot that kernel in qemu (software emulation) with an initramfs of
# busybox-static + static Go test binaries, and decide pass/fail from the
# console output (qemu exits 0 on any poweroff).
#
# Everything is fetched with apt-get download + dpkg-deb -x (no system
# install of kernels), pinned to the version the linux-image-cloud-amd64
# metapackage points at, and cached under $BUILD/kmodvm.
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

# --- kernel packages, pinned to one version --------------------------------
# The pin is cached; delete $VM/pin to move to a newer kernel.
if [ ! -s "$VM/pin" ]; then
	apt_update
	ver=$(apt-cache policy linux-image-cloud-amd64 | awk '/Candidate:/ {print $2}')
	img=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/ {print $2; exit}')
	abi=${img#linux-image-}
	abi=${abi%-cloud-amd64}
	[ -n "$ver" ] && [ -n "$abi" ] || { log "cannot resolve linux-image-cloud-amd64 (apt-get update failed?)"; exit 1; }
	echo "$abi $ver" > "$VM/pin"
fi
read -r ABI VER < "$VM/pin"
log "kernel $ABI-cloud-amd64, packages $VER"
DEBS=$VM/debs/$VER
KROOT=$VM/root-$VER
pkgs=(linux-image-$ABI-cloud-amd64 linux-headers-$ABI-cloud-amd64 linux-headers-$ABI-common linux-kbuild-6.1)
mkdir -p "$DEBS"
for p in "${pkgs[@]}"; do
	if ! ls "$DEBS/${p}_"*.deb >/dev/null 2>&1; then
		apt_update
		(cd "$DEBS" && apt-get download -q "$p=$VER" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
		ls "$DEBS/${p}_"*.deb >/dev/null 2>&1 || { log "download of $p=$VER failed"; exit 1; }
	fi
done
if [ ! -f "$KROOT/.unpacked" ]; then
	rm -rf "$KROOT"
	mkdir -p "$KROOT"
	for d in "$DEBS"/*.deb; do dpkg-deb -x "$d" "$KROOT"; done
	touch "$KROOT/.unpacked"
fi
KDIR=$KROOT/usr/src/linux-headers-$ABI-cloud-amd64
# The flavour Makefile includes the -common tree by absolute path.
sed -i "s#^include .*/usr/src/linux-headers-#include $KROOT/usr/src/linux-headers-#" "$KDIR/Makefile"
VMLINUZ=$KROOT/boot/vmlinuz-$ABI-cloud-amd64

# --- module ------------------------------------------------------------------
SRC=$VM/src
rm -rf "$SRC" && mkdir -p "$SRC/uapi"
cp kmod/zcshim.c kmod/Kbuild "$SRC/" && cp kmod/uapi/zcshim.h "$SRC/uapi/"
log "building zcshim.ko"
make -s -C "$KDIR" M="$SRC" modules 2>&1 | grep -v 'Skipping BTF generation' || true
[ -f "$SRC/zcshim.ko" ] || { log "module build failed"; exit 1; }
if grep -E 'warning:' "$SRC"/.zcshim.o.cmd >/dev/null 2>&1; then :; fi

# --- Go test binaries (static) ----------------------------------------------
log "building test binaries"
CGO_ENABLED=0 "$GO" test -c -o "$VM/kmod.test" ./kmod
CGO_ENABLED=0 "$GO" test -c -o "$VM/shim.test" ./kmod/shim
CGO_ENABLED=0 "$GO" build -o "$VM/shimbench" ./kmod/vm/shimbench

# --- initramfs ----------------------------------------------------------------
IR=$VM/initramfs
rm -rf "$IR" && mkdir -p "$IR/bin" "$IR/proc" "$IR/sys" "$IR/dev" "$IR/tmp"
cp /bin/busybox "$IR/bin/busybox"
cp kmod/vm/init "$IR/init"
cp "$SRC/zcshim.ko" "$IR/zcshim.ko"
cp "$VM/kmod.test" "$VM/shim.test" "$VM/shimbench" "$IR/"
[ -n "${ZCVM_SHIM_ARGS:-}" ] && echo "$ZCVM_SHIM_ARGS" > "$IR/shim.args"
(cd "$IR" && find . | cpio -o -H newc --quiet | gzip -1 > "$VM/initrd.gz")

# --- boot ------------------------------------------------------------------
CONSOLE=$VM/console.log
log "booting (TCG, timeout ${TIMEOUT}s); console in $CONSOLE"
set +e
timeout --foreground -k 10 "$TIMEOUT" qemu-system-x86_64 -accel tcg -cpu max -smp 2 -m 1536 \
	-nographic -no-reboot -nodefaults -serial stdio \
	-kernel "$VMLINUZ" -initrd "$VM/initrd.gz" \
	-append "console=ttyS0 panic=-1 loglevel=4 rdinit=/init" > "$CONSOLE" 2>&1
qrc=$?
set -e
tr -d '\r' < "$CONSOLE" > "$CONSOLE.txt"
grep -E '^(--- (PASS|FAIL|SKIP)|PASS|FAIL|ok|ZCVM:|MEASURE)' "$CONSOLE.txt" || true
grep '^MEASURE' "$CONSOLE.txt" > "$VM/measure.txt" || true

fail=0
if [ $qrc = 124 ] || [ $qrc = 137 ]; then log "FAIL: timed out after ${TIMEOUT}s"; fail=1; fi
grep -q '^ZCVM: result rc=0' "$CONSOLE.txt" || { log "FAIL: tests did not report success"; fail=1; }
if grep -nE 'BUG:|WARNING:|Oops|general protection|Call Trace|zcshim: LEAK|kernel panic|Kernel panic|refcount_t:|list_(add|del) corruption' "$CONSOLE.txt"; then
	log "FAIL: kernel log shows a bug, warning or leak (above)"
	fail=1
fi
grep -q '^--- FAIL' "$CONSOLE.txt" && { log "FAIL: a test failed"; fail=1; }
npass=$(grep -c '^    --- PASS\|^--- PASS' "$CONSOLE.txt" || true)
nfail=$(grep -c '^    --- FAIL\|^--- FAIL' "$CONSOLE.txt" || true)
nskip=$(grep -c '^    --- SKIP\|^--- SKIP' "$CONSOLE.txt" || true)
echo "vmtest: $npass passed, $nfail failed, $nskip skipped"
if [ $fail = 0 ]; then log "PASS"; else log "see $CONSOLE.txt"; exit 1; fi
