// Package kmod builds, loads and unloads zcshim.ko, zcnet's kernel-queue
// shim, and holds its ABI.
//
// The shim gives applications io_uring's queue model without io_uring — for
// hosts and containers where io_uring is disabled or blocked by seccomp:
// memory regions pinned once and named by key, submission and completion
// rings in shared memory, one doorbell ioctl per batch, and zero-copy TCP
// sends whose notification arrives when the stack releases the pages.
//
// Layout:
//
//	kmod/zcshim.c, kmod/Kbuild   the module (C), built with `make kmod KDIR=...`
//	kmod/uapi/zcshim.h           the ABI: the single source of truth, documented
//	                             like a man page (fields, RETURN VALUE, ERRORS)
//	kmod/internal/abi            Go structs and constants generated from the
//	                             header by cgo -godefs, layout-tested against gcc
//	kmod                         this package: Load, Unload, Loaded
//	kmod/shim                    the queue client: Open, RegisterRegion, Attach,
//	                             PrepSend/PrepRecv/PrepNop, Submit, completions
//	kmod/vm                      the VM test harness (`make vmtest`)
//
// # Loading
//
// Load calls finit_module(2) and Unload delete_module(2). Their errors are
// *Error values wrapping one of the sentinels below, matched with errors.Is:
//
//	ErrNotSupported     the kernel has no loadable-module support (ENOSYS);
//	                    conclusive: this machine can never load the shim
//	ErrPermission       CAP_SYS_MODULE missing, modules disabled, or lockdown
//	ErrVersionMismatch  the module was built for another kernel (vermagic,
//	                    checked before the syscall, or ENOEXEC from the kernel)
//	ErrInvalidModule    the file is not a kernel module
//	ErrAlreadyLoaded    Load: a module named zcshim is already loaded
//	ErrNotLoaded        Unload: no module named zcshim is loaded
//	ErrBusy             Unload: /dev/zcshim is still open, or sends it queued
//	                    are still referenced by the TCP stack
//
// # Building and loading on a real host
//
//	apt-get install linux-headers-$(uname -r)   # Debian/Ubuntu
//	make kmod                                   # KDIR defaults to /lib/modules/$(uname -r)/build
//	sudo insmod kmod/zcshim.ko                  # or kmod.Load("kmod/zcshim.ko")
//	ls -l /dev/zcshim                           # misc device, mode 0666
//	sudo rmmod zcshim                           # or kmod.Unload()
//
// On kernels that enforce module signatures, sign zcshim.ko with a key the
// kernel trusts (scripts/sign-file) or Load fails with ErrPermission.
package kmod
