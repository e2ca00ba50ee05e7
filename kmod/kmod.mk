# kmod/kmod.mk - included by the top-level Makefile.
#   make kmod [KDIR=...]   build kmod/zcshim.ko against a kernel's build tree
#                          (default: the running kernel's)
#   make vmtest            boot the pinned kernels (kmod/vm/kernels/*.pin: 6.1 and 6.12 with
#                          the module, 7.3 without) in qemu (TCG), run the VM tests; installs
#                          what it needs (.ci/need.sh)
#   make kmod-clean
KDIR ?= /lib/modules/$(shell uname -r)/build

.PHONY: kmod kmod-clean vmtest

# Kbuild writes its objects (and a generated .mod.c, which the Go toolchain
# would reject in package kmod's directory) next to the sources, so the
# module is built in a copy under build/kmod and only zcshim.ko comes back.
KMOD_OUT := $(BUILD)/kmod

kmod:
	@bash .ci/need.sh make gcc
	@test -d $(KDIR) || { echo "kmod: no kernel build tree at $(KDIR): install linux-headers-$$(uname -r) or pass KDIR=..."; exit 1; }
	rm -rf $(KMOD_OUT) && mkdir -p $(KMOD_OUT)/uapi
	cp kmod/zcshim.c kmod/Kbuild $(KMOD_OUT)/ && cp kmod/uapi/zcshim.h $(KMOD_OUT)/uapi/
	$(MAKE) -C $(KDIR) M=$(KMOD_OUT) modules
	cp $(KMOD_OUT)/zcshim.ko kmod/zcshim.ko
	@echo "kmod: built kmod/zcshim.ko for $$(modinfo -F vermagic kmod/zcshim.ko 2>/dev/null || echo $(KDIR))"

kmod-clean:
	rm -rf $(KMOD_OUT) kmod/zcshim.ko

vmtest:
	GO="$(GO)" BUILD="$(BUILD)" bash kmod/vm/vmtest.sh

TEST_EXTRA += vmtest
