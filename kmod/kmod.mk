# kmod/kmod.mk - included by the top-level Makefile.
#   make kmod [KDIR=...]   build kmod/zcshim.ko against a kernel's build tree
#                          (default: the running kernel's)
#   make vmtest            boot Debian 12 cloud kernels (6.1, 6.12) in qemu (TCG), load
#                          the module, run the VM tests; installs what it needs
#   make kmod-clean
KDIR ?= /lib/modules/$(shell uname -r)/build

.PHONY: kmod kmod-clean vmtest

# Kbuild writes its objects (and a generated .mod.c, which the Go toolchain
# would reject in package kmod's directory) next to the sources, so the
# module is built in a copy under build/kmod and only zcshim.ko comes back.
KMOD_OUT := $(BUILD)/kmod

kmod:
	$(call apt_need,make,make)
	$(call apt_need,gcc,gcc)
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
