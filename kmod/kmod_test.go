package kmod

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// koPath is the module under test, set by the VM harness (kmod/vm/init).
func koPath() string { return os.Getenv("ZCSHIM_KO") }

func TestErrorShape(t *testing.T) {
	err := &Error{Op: "load", Path: "/x.ko", Err: kindErr(ErrPermission, os.ErrPermission)}
	if !errors.Is(err, ErrPermission) || !errors.Is(err, os.ErrPermission) {
		t.Fatalf("errors.Is fails through %v", err)
	}
	var ke *Error
	if !errors.As(error(err), &ke) || ke.Op != "load" {
		t.Fatal("errors.As(*Error) failed")
	}
	if got := err.Error(); got == "" || !bytes.Contains([]byte(got), []byte("/x.ko")) {
		t.Fatalf("message %q lacks the path", got)
	}
}

// On a kernel without module support every entry point says so, typed.
func TestNoModuleSupport(t *testing.T) {
	if moduleSupport() {
		t.Skip("this kernel supports modules (/proc/modules exists); covered by the VM tests")
	}
	err := Load("/nonexistent.ko")
	var ke *Error
	if !errors.Is(err, ErrNotSupported) || !errors.As(err, &ke) || ke.Op != "load" {
		t.Fatalf("Load: %v, want *Error wrapping ErrNotSupported", err)
	}
	if err := Unload(); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("Unload: %v, want ErrNotSupported", err)
	}
	ok, err := Loaded()
	if ok || !errors.Is(err, ErrNotSupported) {
		t.Fatalf("Loaded: %v %v, want false, ErrNotSupported", ok, err)
	}
	t.Logf("Load on this kernel: %v", Load("/nonexistent.ko"))
}

// moduleWithVermagic returns a module file whose vermagic is vm: a copy of
// the real module with the string patched when one is available (the VM),
// otherwise an object file with a .modinfo section compiled by gcc (host).
func moduleWithVermagic(t *testing.T, vm string) string {
	t.Helper()
	dir := t.TempDir()
	if ko := koPath(); ko != "" {
		data, err := os.ReadFile(ko)
		if err != nil {
			t.Fatal(err)
		}
		i := bytes.Index(data, []byte("vermagic="))
		if i < 0 {
			t.Fatal("real module has no vermagic")
		}
		j := bytes.IndexByte(data[i:], ' ')
		old := data[i+len("vermagic=") : i+j]
		if len(vm) > len(old) {
			t.Fatalf("vermagic %q longer than %q", vm, old)
		}
		repl := append([]byte(vm), bytes.Repeat([]byte("x"), len(old)-len(vm))...)
		copy(data[i+len("vermagic="):], repl)
		p := filepath.Join(dir, "patched.ko")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return string(p) + "|" + string(repl)
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Fatal("gcc not found: needed to build a test object file")
	}
	src := filepath.Join(dir, "m.c")
	code := `__attribute__((section(".modinfo"), used)) static const char a[] = "license=GPL";` + "\n" +
		`__attribute__((section(".modinfo"), used)) static const char b[] = "vermagic=` + vm + ` SMP mod_unload ";` + "\n"
	if err := os.WriteFile(src, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	obj := filepath.Join(dir, "m.ko")
	if out, err := exec.Command("gcc", "-c", "-o", obj, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return obj + "|" + vm
}

func TestVermagic(t *testing.T) {
	pv := moduleWithVermagic(t, "0.0.0-zctest")
	path, want, _ := bytes.Cut([]byte(pv), []byte("|"))
	got, err := Vermagic(string(path))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix([]byte(got), want) {
		t.Fatalf("vermagic %q, want prefix %q", got, want)
	}
	if moduleSupport() {
		err := Load(string(path))
		if !errors.Is(err, ErrVersionMismatch) {
			t.Fatalf("Load of a foreign-vermagic module: %v, want ErrVersionMismatch", err)
		}
	}
}

func TestVermagicInvalid(t *testing.T) {
	dir := t.TempDir()
	notELF := filepath.Join(dir, "text.ko")
	if err := os.WriteFile(notELF, []byte("not an ELF file at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Vermagic(notELF); !errors.Is(err, ErrInvalidModule) {
		t.Fatalf("Vermagic(text): %v, want ErrInvalidModule", err)
	}
	if _, err := Vermagic(filepath.Join(dir, "missing.ko")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Vermagic(missing): %v, want ErrNotExist", err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Vermagic(self); !errors.Is(err, ErrInvalidModule) {
		t.Fatalf("Vermagic(test binary): %v, want ErrInvalidModule (no .modinfo)", err)
	}
	if moduleSupport() {
		if err := Load(notELF); !errors.Is(err, ErrInvalidModule) {
			t.Fatalf("Load(text): %v, want ErrInvalidModule", err)
		}
	}
}

// TestVMLoad runs in the VM (ZCSHIM_KO set): the real module loads, shows
// as Live, and a second Load says ErrAlreadyLoaded.
func TestVMLoad(t *testing.T) {
	ko := koPath()
	if ko == "" {
		t.Skip("ZCSHIM_KO not set: the module can only be loaded in the VM (make vmtest)")
	}
	if err := Load(ko); err != nil && !errors.Is(err, ErrAlreadyLoaded) {
		t.Fatalf("Load(%s): %v", ko, err)
	}
	ok, err := Loaded()
	if err != nil || !ok {
		t.Fatalf("Loaded after Load: %v %v", ok, err)
	}
	if err := Load(ko); !errors.Is(err, ErrAlreadyLoaded) {
		t.Fatalf("second Load: %v, want ErrAlreadyLoaded", err)
	}
	f, err := os.OpenFile("/dev/zcshim", os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("/dev/zcshim: %v", err)
	}
	// In use: unload refuses, typed, and the module stays.
	if err := Unload(); !errors.Is(err, ErrBusy) {
		t.Fatalf("Unload with /dev/zcshim open: %v, want ErrBusy", err)
	}
	f.Close()
	if ok, _ := Loaded(); !ok {
		t.Fatal("module gone after a refused unload")
	}
}

// TestVMUnload runs last in the VM (ZCSHIM_UNLOAD=1): rmmod while idle.
func TestVMUnload(t *testing.T) {
	if os.Getenv("ZCSHIM_UNLOAD") != "1" {
		t.Skip("ZCSHIM_UNLOAD not set: unload is the VM harness's last step")
	}
	// The last contexts are freed on a workqueue after close: allow it a moment.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := Unload()
		if err == nil {
			break
		}
		if !errors.Is(err, ErrBusy) || time.Now().After(deadline) {
			t.Fatalf("Unload: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ok, err := Loaded(); ok || err != nil {
		t.Fatalf("Loaded after Unload: %v %v", ok, err)
	}
	if err := Unload(); !errors.Is(err, ErrNotLoaded) {
		t.Fatalf("second Unload: %v, want ErrNotLoaded", err)
	}
}
