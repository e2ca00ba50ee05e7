#!/usr/bin/env bash
# debfetch.sh PIN          make the pinned kernel's .debs available, print their directory
# debfetch.sh --repin PIN  move PIN (and its .sha256) to the newest build of its kernel line
#
# A pin (kmod/vm/kernels/*.pin) names a Debian suite, a kernel ABI, a package version and the
# packages the qemu harness needs; PIN's .sha256 holds their checksums. The .debs live in a
# cache keyed by suite and version, $ZCVM_DEB_CACHE (default $BUILD/debcache):
#   $ZCVM_DEB_CACHE/<suite>/<version>/*.deb
# Present and matching the checksums: nothing is downloaded. Missing: they are fetched with
# apt-get through a private apt configuration under $BUILD/apt/<suite> (its own sources.list,
# state, cache and Dir::Etc; the machine's /etc/apt is never read or changed). Backports
# suites drop old versions: when the pinned one is gone the error says how to restore the
# cache or move the pin. CI keeps the cache between runs (key: the pin files).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD:-$ROOT/build}
CACHE=${ZCVM_DEB_CACHE:-$BUILD/debcache}

die() { echo "debfetch: $*" >&2; exit 1; }
log() { echo "debfetch: $*" >&2; }

repin=0
if [ "${1:-}" = --repin ]; then repin=1; shift; fi
PIN=${1:?usage: debfetch.sh [--repin] kmod/vm/kernels/X.pin}
[ -f "$PIN" ] || die "no pin file $PIN"
SUMS=$(realpath -m "${PIN%.pin}.sha256")

pinval() { awk -F= -v k="$1" '$1 == k { sub(/^[^=]*=/, ""); print; exit }' "$PIN"; }
SUITE=$(pinval SUITE)
KEYRING=$(pinval KEYRING)
LINE=$(pinval LINE)
ABI=$(pinval ABI)
VERSION=$(pinval VERSION)
[ -n "$SUITE" ] && [ -n "$ABI" ] && [ -n "$VERSION" ] || die "$PIN lacks SUITE, ABI or VERSION"
packages() { pinval PACKAGES | sed "s/@ABI@/$1/g"; }

# --- private apt --------------------------------------------------------------------------
APTDIR=$BUILD/apt/$SUITE
apt_ready=0
apt_setup() {
	[ $apt_ready = 1 ] && return
	[ -f "$KEYRING" ] || die "no archive keyring $KEYRING for $SUITE (install debian-archive-keyring)"
	mkdir -p "$APTDIR"/etc/apt.conf.d "$APTDIR"/etc/preferences.d "$APTDIR"/etc/sources.list.d \
		"$APTDIR"/state/lists/partial "$APTDIR"/cache/archives/partial
	touch "$APTDIR/state/status"
	echo "deb [signed-by=$KEYRING] http://deb.debian.org/debian $SUITE main" > "$APTDIR/etc/sources.list"
	cat > "$APTDIR/apt.conf" <<-EOF
		Dir::Etc "$APTDIR/etc";
		Dir::Etc::sourcelist "sources.list";
		Dir::Etc::sourceparts "sources.list.d";
		Dir::Etc::parts "apt.conf.d";
		Dir::Etc::preferencesparts "preferences.d";
		Dir::State "$APTDIR/state";
		Dir::State::status "$APTDIR/state/status";
		Dir::Cache "$APTDIR/cache";
		APT::Architecture "amd64";
		Acquire::Languages "none";
		APT::Sandbox::User "root";
	EOF
	export APT_CONFIG=$APTDIR/apt.conf
	# Refresh the index when it is older than a day (or missing).
	if [ -z "$(find "$APTDIR/state/lists" -maxdepth 1 -name '*_Packages' -mmin -1440 2>/dev/null)" ]; then
		log "apt-get update ($SUITE, private configuration in $APTDIR)"
		apt-get update -qq >&2 || die "apt-get update for $SUITE failed (network?)"
	fi
	apt_ready=1
}

# newest VERSION/ABI of the pin's kernel line in the suite, from the cloud metapackage
newest() {
	apt_setup
	apt-cache madison linux-image-cloud-amd64 | awk -v line="$LINE." '
		{ v = $3; if (index(v, line) == 1) { print v; exit } }'
}

fetch_into() { # dir version abi
	local dir=$1 ver=$2 abi=$3 p
	mkdir -p "$dir"
	for p in $(packages "$abi"); do
		ls "$dir/${p}_"*.deb >/dev/null 2>&1 && continue
		apt_setup
		if ! apt-cache madison "$p" | awk -v v="$ver" '$3 == v { found = 1 } END { exit !found }'; then
			local now
			now=$(newest || true)
			cat >&2 <<-EOF
				debfetch: $p version $ver is no longer in $SUITE (backports keeps only recent kernels).
				  The qemu harness needs the pinned packages. Either
				  - restore the cached .debs into $dir
				    (CI: keep $CACHE between runs, keyed by kmod/vm/kernels/*.pin and *.sha256), or
				  - move the pin to what $SUITE has now (${now:-nothing for line $LINE}):
				      bash kmod/vm/debfetch.sh --repin $PIN
				    and commit the updated $PIN and $SUMS.
			EOF
			exit 1
		fi
		log "downloading $p=$ver"
		(cd "$dir" && apt-get download -q "$p=$ver" >&2 2>&1) || die "download of $p=$ver failed"
	done
}

if [ $repin = 1 ]; then
	apt_setup
	ver=$(newest)
	[ -n "$ver" ] || die "$SUITE has no linux-image-cloud-amd64 of line $LINE"
	abi=$(apt-cache depends "linux-image-cloud-amd64=$ver" | awk '/Depends: linux-image-[0-9]/ { sub(/^linux-image-/, "", $2); print $2; exit }')
	[ -n "$abi" ] || die "cannot resolve the ABI of linux-image-cloud-amd64=$ver"
	dir=$CACHE/$SUITE/$ver
	fetch_into "$dir" "$ver" "$abi"
	sed -i -e "s/^ABI=.*/ABI=$abi/" -e "s/^VERSION=.*/VERSION=$ver/" "$PIN"
	(cd "$dir" && for p in $(packages "$abi"); do sha256sum "${p}_"*.deb; done) > "$SUMS"
	log "pinned $abi ($ver); commit $PIN and $SUMS"
	echo "$dir"
	exit 0
fi

[ -f "$SUMS" ] || die "no checksum file $SUMS"
dir=$CACHE/$SUITE/$VERSION
fetch_into "$dir" "$VERSION" "$ABI"
(cd "$dir" && sha256sum --quiet -c "$SUMS" >&2) || die "the .debs in $dir do not match $SUMS (delete them to download again)"
echo "$dir"
