# kmod/vm/kernels.mk - included by the top-level Makefile: pinned kernels of the qemu harness.
#   make uapi73   unpack Linux 7.3's uapi headers (linux-libc-dev of kmod/vm/kernels/7.3.pin,
#                 through kmod/vm/debfetch.sh and its version-keyed .deb cache) into
#                 build/uapi73, where internal/uring's layout test compares the zcrx
#                 structs with them. gotest depends on it; when the packages cannot be had
#                 (offline, pin gone) it says why and the layout test skips, while vmtest,
#                 which needs the same packages, fails.
UAPI73 := $(BUILD)/uapi73

.PHONY: uapi73
uapi73:
	-@dir=$$(BUILD="$(BUILD)" bash kmod/vm/debfetch.sh kmod/vm/kernels/7.3.pin) && \
	if [ "$$(cat $(UAPI73)/.from 2>/dev/null)" != "$$dir" ]; then \
		rm -rf $(UAPI73) && mkdir -p $(UAPI73) && \
		dpkg-deb -x "$$dir"/linux-libc-dev_*.deb $(UAPI73) && echo "$$dir" > $(UAPI73)/.from && \
		echo "uapi73: Linux 7.3 uapi headers in $(UAPI73)"; \
	fi

gotest: uapi73

# What debfetch.sh promises (cache without network, a pin that left the archive moves with one
# line, errors that say what to run), on copies of the 6.1 pin: kmod/vm/debfetch-check.sh.
.PHONY: debfetch-check
debfetch-check:
	BUILD="$(BUILD)" bash kmod/vm/debfetch-check.sh

TEST_EXTRA += debfetch-check
