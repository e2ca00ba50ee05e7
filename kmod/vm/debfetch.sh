#!/usr/bin/env bash
# debfetch.sh PIN            make the pinned kernel's .debs available; print their directory
# debfetch.sh --repin [PIN]  move PIN (every kmod/vm/kernels/*.pin without one) and its
#                            .sha256 to the newest build of its kernel line
# debfetch.sh --check [PIN]  say, for each pin, whether the archive still has its versions
#
# A pin (kmod/vm/kernels/NAME.pin, key=value lines) names where a kernel line comes from
# (SOURCE lines: "mirror suite", one or more, and the KEYRING that signs them), the line
# (LINE, and META: the cloud metapackage whose newest version is the line's newest build), the
# kernel ABI and the packages the qemu harness needs (PACKAGES; @ABI@ is the ABI, @BASE@ the ABI
# without its flavour, @LINE@ the line). NAME.sha256 pins each package's own version and
# checksum: its file names are apt's (package_version_arch.deb), so an image and its kbuild may
# differ in Debian revision (6.1.192-2 and 6.1.192-3 were the same kernel).
#
# The .debs live in a cache, $ZCVM_DEB_CACHE (default $BUILD/debcache), one folder per pin and
# ABI: present and matching the checksums, nothing is downloaded (no network needed). Missing,
# they are fetched with apt-get through a private apt configuration under $BUILD/apt/NAME (its
# own sources.list, state, cache and Dir::Etc; the machine's /etc/apt is never read or changed;
# apt checks every file against the archive's signed index).
#
# When a pinned version has left the archive (security updates and backports keep only the
# newest builds), the run does not fail: it takes the newest build of the same line, every
# package's version resolved on its own (matched to the image by upstream version), says so in
# one line ("old -> new") and goes on; the guests' expect lists are per line, so what must pass
# does not change. --repin then moves the committed pin. The directory printed on stdout holds
# pin.env (ABI=, VERSION=, MOVED=) describing what it holds.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD:-$ROOT/build}
CACHE=${ZCVM_DEB_CACHE:-$BUILD/debcache}

die() { echo "debfetch: $*" >&2; exit 1; }
log() { echo "debfetch: $*" >&2; }

mode=fetch
case "${1:-}" in
--repin) mode=repin; shift ;;
--check) mode=check; shift ;;
esac
if [ $# = 0 ]; then
	[ $mode = fetch ] && die "usage: debfetch.sh [--repin|--check] [kmod/vm/kernels/NAME.pin]"
	rc=0
	for p in kmod/vm/kernels/*.pin; do bash "$0" --$mode "$p" || rc=1; done
	exit $rc
fi
PIN=$1
[ -f "$PIN" ] || die "no pin file $PIN"
NAME=$(basename "$PIN" .pin)
SUMS=$(realpath -m "${PIN%.pin}.sha256")

pinval() { awk -F= -v k="$1" '$1 == k { sub(/^[^=]*=/, ""); print; exit }' "$PIN"; }
KEYRING=$(pinval KEYRING)
LINE=$(pinval LINE)
META=$(pinval META)
ABI=$(pinval ABI)
mapfile -t SOURCES < <(awk -F= '$1 == "SOURCE" { sub(/^[^=]*=/, ""); print }' "$PIN")
[ ${#SOURCES[@]} -gt 0 ] && [ -n "$LINE" ] && [ -n "$META" ] && [ -n "$ABI" ] ||
	die "$PIN lacks SOURCE, LINE, META or ABI"
# packages ABI: the pin's package names for that ABI
packages() {
	local abi=$1 base=${1%-cloud-amd64}
	pinval PACKAGES | sed -e "s/@ABI@/$abi/g" -e "s/@BASE@/$base/g" -e "s/@LINE@/$LINE/g"
}
# the version in an apt file name (package_version_arch.deb; apt writes an epoch's ':' as %3a)
file_version() { local f=${1%_*.deb}; f=${f#*_}; echo "${f//%3a/:}"; }
upstream() { echo "${1%-*}"; }

# --- private apt --------------------------------------------------------------------------
APTDIR=$BUILD/apt/$NAME
apt_ready=0
apt_setup() {
	[ $apt_ready = 1 ] && return
	[ -f "$KEYRING" ] || die "no archive keyring $KEYRING for $NAME: run as root: bash .ci/need.sh keyrings"
	command -v apt-get >/dev/null || die "no apt-get: debfetch needs a Debian-like machine"
	mkdir -p "$APTDIR"/etc/apt.conf.d "$APTDIR"/etc/preferences.d "$APTDIR"/etc/sources.list.d \
		"$APTDIR"/state/lists/partial "$APTDIR"/cache/archives/partial
	touch "$APTDIR/state/status"
	local s want=""
	for s in "${SOURCES[@]}"; do
		want+="deb [signed-by=$KEYRING] ${s% *} ${s##* } main"$'\n'
	done
	# A changed source list invalidates the index.
	if [ "$(cat "$APTDIR/etc/sources.list" 2>/dev/null)"$'\n' != "$want" ]; then
		printf '%s' "$want" > "$APTDIR/etc/sources.list"
		rm -f "$APTDIR"/state/lists/*_Packages
	fi
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
	# Refresh the index when it is older than an hour (or missing): a move must see today's archive.
	if [ -z "$(find "$APTDIR/state/lists" -maxdepth 1 -name '*_Packages' -mmin -60 2>/dev/null)" ]; then
		log "[$NAME] apt-get update (${SOURCES[*]}; private configuration in $APTDIR)"
		apt-get update -qq >&2 || die "[$NAME] apt-get update failed (network?); with the .debs in $CACHE/$NAME no network is needed"
	fi
	apt_ready=1
}
# has PKG VER: the archive offers PKG at VER
has() { apt-cache madison "$1" | awk -v v="$2" '$3 == v { f = 1 } END { exit !f }'; }

# resolve_line: the line's newest build; sets R_ABI and R_FILES ("pkg=ver" words)
resolve_line() {
	apt_setup
	local mver img up p v
	mver=$(apt-cache madison "$META" | awk '{ print $3 }' | while read -r v; do
		case $v in "$LINE".*) echo "$v" ;; esac
	done | sort -V -r | head -1)
	[ -n "$mver" ] || die "[$NAME] the archive has no $META of line $LINE"
	img=$(apt-cache depends "$META=$mver" | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
	R_ABI=${img#linux-image-}
	[ -n "$R_ABI" ] || die "[$NAME] cannot tell the ABI of $META=$mver"
	up=$(upstream "$mver")
	R_FILES=""
	for p in $(packages "$R_ABI"); do
		# this package's newest version of the same upstream kernel (its Debian revision may differ)
		v=$(apt-cache madison "$p" | awk '{ print $3 }' | while read -r v; do
			if [ "$(upstream "$v")" = "$up" ]; then echo "$v"; fi
		done | sort -V -r | head -1)
		[ -n "$v" ] || die "[$NAME] the archive has no $p of upstream $up (for $META=$mver)"
		R_FILES+="$p=$v "
	done
	R_VERSION=$mver
}

# download DIR pkg=ver...: fetch what DIR lacks
download() {
	local dir=$1 pv p v
	shift
	mkdir -p "$dir"
	for pv in "$@"; do
		p=${pv%%=*} v=${pv#*=}
		ls "$dir/${p}_"*.deb >/dev/null 2>&1 && continue
		apt_setup
		log "[$NAME] downloading $p=$v"
		(cd "$dir" && apt-get download -qq "$p=$v" 2>&1 | grep -v 'unsandboxed' >&2 || true)
		ls "$dir/${p}_"*.deb >/dev/null 2>&1 || die "[$NAME] download of $p=$v failed"
	done
}

# pinned: "pkg=ver" for each of the pin's packages, from the .sha256 file names
pinned() {
	local p f out=""
	[ -f "$SUMS" ] || die "no checksum file $SUMS (bash kmod/vm/debfetch.sh --repin $PIN writes it)"
	for p in $(packages "$ABI"); do
		f=$(awk -v p="$p" 'index($2, p "_") == 1 { print $2; exit }' "$SUMS")
		[ -n "$f" ] || die "$SUMS has no $p (bash kmod/vm/debfetch.sh --repin $PIN)"
		out+="$p=$(file_version "$f") "
	done
	echo "$out"
}

write_env() { # dir abi version moved
	printf 'ABI=%s\nVERSION=%s\nMOVED=%s\n' "$2" "$3" "$4" > "$1/pin.env"
}

case $mode in
repin)
	resolve_line
	dir=$CACHE/$NAME/$R_ABI
	# a folder of another build of this ABI would mix files: start it afresh when it differs
	for pv in $R_FILES; do
		p=${pv%%=*}
		for f in "$dir/${p}_"*.deb; do
			[ -e "$f" ] && [ "$(file_version "$(basename "$f")")" != "${pv#*=}" ] && rm -f "$f"
		done
	done
	# shellcheck disable=SC2086
	download "$dir" $R_FILES
	sed -i -e "s/^ABI=.*/ABI=$R_ABI/" -e "s/^VERSION=.*/VERSION=$R_VERSION/" "$PIN"
	(cd "$dir" && for pv in $R_FILES; do sha256sum "${pv%%=*}_"*.deb; done) > "$SUMS"
	write_env "$dir" "$R_ABI" "$R_VERSION" ""
	log "[$NAME] pinned $R_ABI: $R_FILES; commit $PIN and $SUMS"
	echo "$dir"
	exit 0
	;;
check)
	apt_setup
	gone=""
	for pv in $(pinned); do has "${pv%%=*}" "${pv#*=}" || gone+="$pv "; done
	if [ -n "$gone" ]; then
		resolve_line
		log "[$NAME] gone from the archive: $gone-> newest of line $LINE: $R_ABI $R_FILES"
		exit 1
	fi
	log "[$NAME] the archive still has every pinned version"
	exit 0
	;;
esac

# --- fetch --------------------------------------------------------------------------------
dir=$CACHE/$NAME/$ABI
files=$(pinned)
ok=1
for pv in $files; do
	p=${pv%%=*}
	f="$dir/${p}_$(sed 's/:/%3a/' <<< "${pv#*=}")_"*.deb
	# shellcheck disable=SC2086
	ls $f >/dev/null 2>&1 || { ok=0; break; }
done
if [ $ok = 1 ] && (cd "$dir" && sha256sum --quiet -c "$SUMS" >&2 2>/dev/null); then
	write_env "$dir" "$ABI" "$(pinval VERSION)" ""
	echo "$dir"
	exit 0
fi
# Not cached (or damaged): download the pinned versions while the archive has them.
apt_setup
gone=""
for pv in $files; do has "${pv%%=*}" "${pv#*=}" || gone+="$pv "; done
if [ -z "$gone" ]; then
	# a damaged or truncated file in the cache is fetched again
	if [ -d "$dir" ]; then
		(cd "$dir" && sha256sum -c "$SUMS" 2>/dev/null | awk -F': ' '$2 != "OK" { print $1 }' | xargs -r rm -f --) || true
	fi
	# shellcheck disable=SC2086
	download "$dir" $files
	(cd "$dir" && sha256sum --quiet -c "$SUMS" >&2) ||
		die "[$NAME] the .debs in $dir do not match $SUMS (delete them to download again)"
	write_env "$dir" "$ABI" "$(pinval VERSION)" ""
	echo "$dir"
	exit 0
fi
# The pin left the archive: the newest build of the same line, in a folder of its own.
resolve_line
mdir=$CACHE/$NAME/moved-$R_ABI-$(echo "$R_FILES" | sha256sum | cut -c1-12)
# shellcheck disable=SC2086
download "$mdir" $R_FILES
write_env "$mdir" "$R_ABI" "$R_VERSION" "$ABI"
log "[$NAME] pinned ${gone}left the archive: $ABI -> $R_ABI ($R_FILES) for this run; 'bash kmod/vm/debfetch.sh --repin' moves the pins"
echo "$mdir"
