# kmod/kmod.mk - included by the top-level Makefile.
#   make kmod [KDIR=...]   build kmod/zcshim.ko against a kernel's build tree
#                          (default: the running kernel's)
#   make vmtest            boot Debian 12 cloud kernels (6.1, 6.12) in qemu (TCG), load
#                          the module, run the VM tests; installs what it needs
#   make kmod-clean
KDIR ?= /lib/modules/$(shell uname -r)/build

.PHONY: kmod kmod-clean vmtest

kmod:
	$(call apt_need,make,make)
	$(call apt_need,gcc,gcc)
	@test -d $(KDIR) || { echo "kmod: no kernel build tree at $(KDIR): install linux-headers-$$(uname -r) or pass KDIR=..."; exit 1; }
	$(MAKE) -C $(KDIR) M=$(CURDIR)/kmod modules

kmod-clean:
	rm -f kmod/*.o kmod/*.ko kmod/*.mod kmod/*.mod.c kmod/.*.cmd kmod/Module.symvers kmod/modules.order

vmtest:
	GO="$(GO)" BUILD="$(BUILD)" bash kmod/vm/vmtest.sh

TEST_EXTRA += vmtest
