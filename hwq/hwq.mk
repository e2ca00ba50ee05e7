# hwq/hwq.mk - included by the top-level Makefile.
#
#   make uapi-headers  the uapi headers of the pinned Linux 7.3 (linux-libc-dev of
#                      kmod/vm/kernels/7.3.pin, unpacked by make uapi73 into build/uapi73;
#                      build/uapi points there)
#   make uapi-check    compile hwq's constants and struct layouts against those headers,
#                      every identifier required (part of make test)
#
# This machine's own headers (Debian 12: Linux 6.1) lack include/uapi/linux/netdev.h and
# the newer ethtool attributes; hwq's plain go test checks what they have.

UAPI_DIR := $(BUILD)/uapi

.PHONY: uapi-headers uapi-check

uapi-headers: uapi73
	@bash .ci/need.sh gcc
	@test -f $(UAPI73)/usr/include/linux/netdev.h || { echo "uapi-headers: no Linux 7.3 uapi headers in $(UAPI73) (make uapi73 says why)"; exit 1; }
	@ln -sfn uapi73 $(UAPI_DIR) && echo "uapi-headers: $$(cat $(UAPI73)/.from) in $(UAPI_DIR)"

uapi-check: uapi-headers
	ZCNET_UAPI_INCLUDE=$(UAPI_DIR)/usr/include ZCNET_UAPI_STRICT=1 CGO_ENABLED=1 \
		$(GO) test -count=1 -run 'TestUAPIAgainstHeaders' ./hwq/

TEST_EXTRA += uapi-check
