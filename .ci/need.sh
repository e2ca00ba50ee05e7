#!/usr/bin/env bash
# .ci/need.sh [-optional] NAME...: make sure the tools NAME (rows of .ci/packages.txt) are
# here, installing the missing ones with one apt-get install. A tool that cannot be had fails
# with the command that installs it; with -optional it only says so.
set -uo pipefail
cd "$(dirname "$0")/.."
optional=0
if [ "${1:-}" = -optional ]; then optional=1; shift; fi
list=.ci/packages.txt
missing=() pkgs=()
for name in "$@"; do
	row=$(awk -v n="$name" '$1 == n { print $2, $3; exit }' "$list")
	[ -n "$row" ] || { echo "need: $name is not in $list" >&2; exit 2; }
	read -r probe pkg <<< "$row"
	case $probe in
	cmd:*) command -v "${probe#cmd:}" >/dev/null 2>&1 && continue ;;
	file:*) [ -e "${probe#file:}" ] && continue ;;
	dpkg:*) dpkg -s "${probe#dpkg:}" >/dev/null 2>&1 && continue ;;
	esac
	missing+=("$name") pkgs+=("$pkg")
done
[ ${#pkgs[@]} = 0 ] && exit 0
echo "need: installing ${pkgs[*]} (for ${missing[*]})" >&2
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
	# tshark's debconf question (setuid dumpcap for non-root users) is answered "no" first.
	echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections 2>/dev/null
	out=$(mktemp)
	apt-get update -qq > "$out" 2>&1 || true
	if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >> "$out" 2>&1; then
		rm -f "$out"
		exit 0
	fi
	cat "$out" >&2
	rm -f "$out"
fi
msg="need: cannot install ${pkgs[*]} (for ${missing[*]}); run as root: apt-get update && apt-get install -y --no-install-recommends ${pkgs[*]}"
if [ $optional = 1 ]; then echo "$msg (going on without)" >&2; exit 0; fi
echo "$msg" >&2
exit 1
