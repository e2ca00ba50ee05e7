package rawfd

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestPipeSplice: a pipe of the asked size; splice between two pipes moves the bytes and
// says EAGAIN on an empty source; Dup and Close; Read of the bytes.
func TestPipeSplice(t *testing.T) {
	r1, w1, sized, err := Pipe(1 << 16)
	if err != nil || !sized {
		t.Fatalf("Pipe: %v (sized %v)", err, sized)
	}
	defer Close(r1)
	defer Close(w1)
	if sz, err := unix.FcntlInt(uintptr(w1), unix.F_GETPIPE_SZ, 0); err != nil || sz < 1<<16 {
		t.Fatalf("pipe size %d, %v", sz, err)
	}
	r2, w2, _, err := Pipe(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer Close(r2)
	defer Close(w2)
	if _, err := Splice(r1, w2, 100); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("Splice from an empty pipe: %v", err)
	}
	unix.Write(w1, []byte("hello"))
	if n, err := Splice(r1, w2, 100); n != 5 || err != nil {
		t.Fatalf("Splice: %d, %v", n, err)
	}
	d, err := Dup(r2)
	if err != nil {
		t.Fatal(err)
	}
	if fl, err := unix.FcntlInt(uintptr(d), unix.F_GETFD, 0); err != nil || fl&unix.FD_CLOEXEC == 0 {
		t.Fatalf("Dup: not close-on-exec (%v)", err)
	}
	buf := make([]byte, 16)
	if n, err := Read(d, buf); n != 5 || err != nil || string(buf[:5]) != "hello" {
		t.Fatalf("Read: %d %q %v", n, buf[:n], err)
	}
	if n, err := Read(d, buf); n != 0 || !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("Read of an empty non-blocking pipe: %d, %v", n, err)
	}
	if err := Close(d); err != nil {
		t.Fatal(err)
	}
	if err := Close(d); !errors.Is(err, unix.EBADF) {
		t.Fatalf("second Close: %v", err)
	}
}

func TestFileInfo(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, make([]byte, 1234), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mode, size, flags, err := FileInfo(int(f.Fd()))
	if err != nil || mode != unix.S_IFREG || size != 1234 || flags&unix.O_ACCMODE != unix.O_WRONLY {
		t.Fatalf("FileInfo: mode %#o size %d flags %#x, %v", mode, size, flags, err)
	}
	r, w, _, err := Pipe(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer Close(r)
	defer Close(w)
	if mode, _, _, err := FileInfo(r); err != nil || mode != unix.S_IFIFO {
		t.Fatalf("FileInfo of a pipe: %#o, %v", mode, err)
	}
	if _, _, _, err := FileInfo(-1); !errors.Is(err, unix.EBADF) {
		t.Fatalf("FileInfo(-1): %v", err)
	}
}
