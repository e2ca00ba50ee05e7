#!/usr/bin/env bash
# make debfetch-check (part of make test): what debfetch.sh promises, tried on copies of the
# 6.1 pin in a temporary folder (the committed pins are not touched):
#  1. the pinned .debs, cached, are used without the network (the copy's sources point at a
#     closed local port: any apt-get would fail);
#  2. a pin whose versions left the archive (an ABI that never existed) moves to the line's
#     newest build for the run, with one "left the archive: OLD -> NEW" line, and the folder
#     it prints holds that build (pin.env MOVED= names the old ABI);
#  3. a damaged .deb in the cache is fetched again (and, with no network, fails the run); a pin
#     without its checksum file fails with an error that says what to run.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-$PWD/build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "debfetch-check: FAIL: $*" >&2; exit 1; }

# The real pin's files, fetched (or found) once.
dir=$(BUILD="$BUILD" bash kmod/vm/debfetch.sh kmod/vm/kernels/6.1.pin)

# 1. cached: no network
mkdir -p "$tmp/p1"
sed 's#^SOURCE=.*#SOURCE=http://127.0.0.1:9/debian nowhere#' kmod/vm/kernels/6.1.pin > "$tmp/p1/6.1.pin"
cp kmod/vm/kernels/6.1.sha256 "$tmp/p1/"
got=$(ZCVM_DEB_CACHE=$(dirname "$(dirname "$dir")") BUILD=$tmp/b1 bash kmod/vm/debfetch.sh "$tmp/p1/6.1.pin" 2> "$tmp/p1/err") ||
	fail "a cached pin needed the network: $(cat "$tmp/p1/err")"
[ "$got" = "$dir" ] || fail "cached pin: got $got, want $dir"
echo "debfetch-check: a cached pin is used without the network"

# 2. the pin left the archive
mkdir -p "$tmp/p2"
abi=$(awk -F= '$1 == "ABI" { print $2 }' kmod/vm/kernels/6.1.pin)
sed 's/^ABI=.*/ABI=6.1.0-1-cloud-amd64/' kmod/vm/kernels/6.1.pin > "$tmp/p2/6.1.pin"
sed -e "s/${abi%-cloud-amd64}/6.1.0-1/g" -e 's/_6\.1\.[0-9]*-[0-9]*_/_6.1.1-1_/' kmod/vm/kernels/6.1.sha256 > "$tmp/p2/6.1.sha256"
got=$(ZCVM_DEB_CACHE=$tmp/cache BUILD=$tmp/b2 bash kmod/vm/debfetch.sh "$tmp/p2/6.1.pin" 2> "$tmp/p2/err") ||
	fail "a pin that left the archive failed the run: $(cat "$tmp/p2/err")"
n=$(grep -c 'left the archive: 6.1.0-1-cloud-amd64 -> ' "$tmp/p2/err" || true)
[ "$n" = 1 ] || fail "want one 'left the archive' line, got $n: $(cat "$tmp/p2/err")"
grep -q '^MOVED=6.1.0-1-cloud-amd64$' "$got/pin.env" || fail "$got/pin.env: $(cat "$got/pin.env")"
new=$(awk -F= '$1 == "ABI" { print $2 }' "$got/pin.env")
ls "$got/linux-image-${new}_"*.deb "$got/linux-headers-${new}_"*.deb >/dev/null || fail "no image or headers of $new in $got"
grep 'left the archive' "$tmp/p2/err" | sed 's/^/debfetch-check: (moved) /'

# 3. errors that say what to run
mkdir -p "$tmp/p3"
cp kmod/vm/kernels/6.1.pin "$tmp/p3/"
if BUILD=$tmp/b3 bash kmod/vm/debfetch.sh "$tmp/p3/6.1.pin" 2> "$tmp/p3/err" >/dev/null; then fail "a pin without its .sha256 was accepted"; fi
grep -q -- '--repin' "$tmp/p3/err" || fail "no checksum file: the error does not say what to run: $(cat "$tmp/p3/err")"
mkdir -p "$tmp/c4/6.1/$abi"
cp "$dir"/*.deb "$tmp/c4/6.1/$abi/"
f=$(ls "$tmp/c4/6.1/$abi"/linux-kbuild-*.deb)
printf 'x' >> "$f"
sed 's#^SOURCE=.*#SOURCE=http://127.0.0.1:9/debian nowhere#' kmod/vm/kernels/6.1.pin > "$tmp/p3/6.1.pin"
cp kmod/vm/kernels/6.1.sha256 "$tmp/p3/"
if ZCVM_DEB_CACHE=$tmp/c4 BUILD=$tmp/b4 bash kmod/vm/debfetch.sh "$tmp/p3/6.1.pin" 2> "$tmp/p3/err2" >/dev/null; then
	fail "a damaged .deb was accepted"
fi
cp kmod/vm/kernels/6.1.pin kmod/vm/kernels/6.1.sha256 "$tmp/p1/"
got=$(ZCVM_DEB_CACHE=$tmp/c4 BUILD=$tmp/b4 bash kmod/vm/debfetch.sh "$tmp/p1/6.1.pin" 2> "$tmp/p3/err3") ||
	fail "a damaged .deb was not fetched again: $(cat "$tmp/p3/err3")"
cmp -s "$f" "$dir/$(basename "$f")" || fail "the damaged $(basename "$f") is still damaged"
echo "debfetch-check: a damaged .deb is fetched again (and fails the run without the network); a missing checksum file says what to run"
echo "debfetch-check: PASS"
