# hwq/hwq.mk - included by the top-level Makefile.
#
#   make uapi-headers  unpack a recent linux-libc-dev (Debian trixie-backports, Linux 7.x)
#                      under build/uapi, through a private apt configuration under
#                      build/apt-uapi (the machine's apt sources are never touched)
#   make uapi-check    compile hwq's constants and struct layouts against those headers,
#                      every identifier required (part of make test)
#
# This machine's own headers (Debian 12: Linux 6.1) lack include/uapi/linux/netdev.h and
# the newer ethtool attributes; hwq's plain go test checks what they have.

UAPI_DIR := $(BUILD)/uapi
UAPI_APT := $(BUILD)/apt-uapi
UAPI_SUITE ?= trixie-backports
UAPI_APTOPTS = -o Dir::Etc::SourceList=$(UAPI_APT)/sources.list -o Dir::Etc::SourceParts=/dev/null \
	-o Dir::State=$(UAPI_APT)/state -o Dir::Cache=$(UAPI_APT)/cache -o Debug::NoLocking=1

.PHONY: uapi-headers uapi-check

uapi-headers:
	$(call apt_need,gcc,gcc)
	@if [ -f $(UAPI_DIR)/usr/include/linux/netdev.h ]; then echo "uapi-headers: $$(cat $(UAPI_DIR)/VERSION) in $(UAPI_DIR)"; else \
	set -e; mkdir -p $(UAPI_APT)/state/lists/partial $(UAPI_APT)/cache/archives/partial $(UAPI_DIR); \
	echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $(UAPI_SUITE) main" > $(UAPI_APT)/sources.list; \
	apt-get -qq $(UAPI_APTOPTS) update; \
	ver=$$(apt-cache $(UAPI_APTOPTS) policy linux-libc-dev | awk '/Candidate:/ {print $$2}'); \
	case "$$ver" in ""|"(none)") echo "uapi-headers: no linux-libc-dev in $(UAPI_SUITE)"; exit 1;; esac; \
	rm -f $(UAPI_APT)/*.deb; \
	(cd $(UAPI_APT) && apt-get -qq $(UAPI_APTOPTS) download "linux-libc-dev=$$ver" 2>&1 | grep -v 'unsandboxed' || true); \
	deb=$$(ls $(UAPI_APT)/linux-libc-dev_*.deb); \
	dpkg-deb -x "$$deb" $(UAPI_DIR); echo "$$ver" > $(UAPI_DIR)/VERSION; \
	echo "uapi-headers: linux-libc-dev $$ver in $(UAPI_DIR)"; fi

uapi-check: uapi-headers
	ZCNET_UAPI_INCLUDE=$(UAPI_DIR)/usr/include ZCNET_UAPI_STRICT=1 CGO_ENABLED=1 \
		$(GO) test -count=1 -run 'TestUAPIAgainstHeaders' ./hwq/

TEST_EXTRA += uapi-check
