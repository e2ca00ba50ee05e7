package kmod

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"github.com/zcnet/zcnet/internal/eintr"
	"github.com/zcnet/zcnet/internal/errs"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// ModuleName is the name the kernel knows the shim by.
const ModuleName = "zcshim"

// Sentinel errors; see the package documentation.
var (
	// ErrNotSupported: the kernel has no loadable module support (the one sentinel every
	// zcnet package shares; the error wrapping it says so).
	ErrNotSupported    = errs.ErrNotSupported
	errNoModules       = errs.NotSupported("kernel modules", "a kernel built with CONFIG_MODULES=y; the shim needs a kernel that can load modules", nil)
	ErrPermission      = errors.New("not permitted to load or unload modules (needs CAP_SYS_MODULE; check kernel.modules_disabled, lockdown and module signing)")
	ErrVersionMismatch = errors.New("module was built for a different kernel: rebuild with make kmod KDIR=/lib/modules/$(uname -r)/build")
	ErrInvalidModule   = errors.New("not a kernel module")
	ErrAlreadyLoaded   = errors.New("module already loaded")
	ErrNotLoaded       = errors.New("module not loaded")
	ErrBusy            = errors.New("module in use: close every /dev/zcshim user and wait for in-flight sends")
)

// Error is the error type of this package: an operation, the module file
// (for Load) and the cause, which wraps a sentinel and, when the kernel said
// something, an errno.
type Error struct {
	Op   string // "load", "unload", "loaded"
	Path string // module file, for load
	Err  error
}

func (e *Error) Error() string {
	if e.Path != "" {
		return "kmod " + e.Op + " " + e.Path + ": " + e.Err.Error()
	}
	return "kmod " + e.Op + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// wrapped joins a sentinel with the underlying cause so that errors.Is works
// for both (e.g. ErrPermission and unix.EPERM).
type wrapped struct {
	kind  error
	cause error
}

func (w *wrapped) Error() string {
	if w.cause == nil {
		return w.kind.Error()
	}
	return w.kind.Error() + ": " + w.cause.Error()
}

func (w *wrapped) Unwrap() []error {
	if w.cause == nil {
		return []error{w.kind}
	}
	return []error{w.kind, w.cause}
}

func kindErr(kind, cause error) error { return &wrapped{kind: kind, cause: cause} }

// Vermagic returns the vermagic string recorded in a module file's .modinfo
// section ("6.1.0-56-cloud-amd64 SMP mod_unload modversions ").
func Vermagic(path string) (string, error) {
	f, err := elf.Open(path)
	if err != nil {
		var fe *elf.FormatError
		if errors.As(err, &fe) {
			return "", kindErr(ErrInvalidModule, err)
		}
		return "", err
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return "", kindErr(ErrInvalidModule, errors.New("no .modinfo section"))
	}
	data, err := sec.Data()
	if err != nil {
		return "", kindErr(ErrInvalidModule, err)
	}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("vermagic=")); ok {
			return string(v), nil
		}
	}
	return "", kindErr(ErrInvalidModule, errors.New("no vermagic in .modinfo"))
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// Load loads the module file at path with finit_module(2).
func Load(path string) error {
	return load(path, "")
}

// LoadParams is Load with module parameters ("name=value ...").
func LoadParams(path, params string) error {
	return load(path, params)
}

func load(path, params string) error {
	fail := func(err error) error { return &Error{Op: "load", Path: path, Err: err} }
	if !moduleSupport() {
		return fail(kindErr(errNoModules, unix.ENOSYS))
	}
	vm, err := Vermagic(path)
	if err != nil {
		return fail(err)
	}
	if rel := kernelRelease(); rel != "" && strings.Fields(vm)[0] != rel {
		return fail(kindErr(ErrVersionMismatch, fmt.Errorf("module vermagic %q, running kernel %s", strings.TrimSpace(vm), rel)))
	}
	f, err := os.Open(path)
	if err != nil {
		return fail(err)
	}
	defer f.Close()
	err = eintr.Retry(func() error { return unix.FinitModule(int(f.Fd()), params, 0) })
	if err == nil {
		return nil
	}
	errno, _ := err.(unix.Errno)
	sys := os.NewSyscallError("finit_module", err)
	switch errno {
	case unix.ENOSYS:
		return fail(kindErr(errNoModules, sys))
	case unix.EPERM, unix.EACCES, unix.EKEYREJECTED, unix.ENOKEY, unix.EBADMSG:
		return fail(kindErr(ErrPermission, sys))
	case unix.EEXIST:
		return fail(kindErr(ErrAlreadyLoaded, sys))
	case unix.ENOEXEC:
		return fail(kindErr(ErrVersionMismatch, sys))
	}
	return fail(sys)
}

// Unload removes the module with delete_module(2), without waiting: a module
// still in use gives ErrBusy.
func Unload() error {
	fail := func(err error) error { return &Error{Op: "unload", Err: err} }
	if !moduleSupport() {
		return fail(kindErr(errNoModules, unix.ENOSYS))
	}
	err := eintr.Retry(func() error { return unix.DeleteModule(ModuleName, unix.O_NONBLOCK) })
	if err == nil {
		return nil
	}
	errno, _ := err.(unix.Errno)
	sys := os.NewSyscallError("delete_module", err)
	switch errno {
	case unix.ENOSYS:
		return fail(kindErr(errNoModules, sys))
	case unix.EPERM:
		return fail(kindErr(ErrPermission, sys))
	case unix.ENOENT:
		return fail(kindErr(ErrNotLoaded, sys))
	case unix.EBUSY, unix.EAGAIN:
		return fail(kindErr(ErrBusy, sys))
	}
	return fail(sys)
}

// Loaded reports whether the module is loaded and live, from /proc/modules.
// On a kernel without module support it returns false and ErrNotSupported.
func Loaded() (bool, error) {
	f, err := os.Open("/proc/modules")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, &Error{Op: "loaded", Err: kindErr(errNoModules, err)}
		}
		return false, &Error{Op: "loaded", Err: err}
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		w := strings.Fields(sc.Text())
		if len(w) >= 5 && w[0] == ModuleName {
			return w[4] == "Live", nil
		}
	}
	if err := sc.Err(); err != nil {
		return false, &Error{Op: "loaded", Err: err}
	}
	return false, nil
}

// moduleSupport probes for CONFIG_MODULES: /proc/modules exists exactly when
// the kernel can load modules.
func moduleSupport() bool {
	_, err := os.Stat("/proc/modules")
	return err == nil
}
