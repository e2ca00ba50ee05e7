package errs

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
)

func TestNotSupported(t *testing.T) {
	err := fmt.Errorf("open: %w", NotSupported("SEND_ZC", "Linux 6.0 or newer", syscall.EINVAL))
	if !errors.Is(err, ErrNotSupported) || !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("%v does not match both ErrNotSupported and EINVAL", err)
	}
	if got, want := err.Error(), "open: SEND_ZC: not supported (needs Linux 6.0 or newer): invalid argument"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	var nse *NotSupportedError
	if !errors.As(err, &nse) || nse.Need != "Linux 6.0 or newer" {
		t.Fatalf("errors.As: %v", nse)
	}
	if NotSupported("x", "", nil).Error() != "x: not supported" || !errors.Is(NotSupported("x", "", nil), ErrNotSupported) {
		t.Fatal("nil cause")
	}
}

// TestClosedFamily: one "closed" error, matched by both of Go's closed sentinels.
func TestClosedFamily(t *testing.T) {
	wrapped := fmt.Errorf("memreg: region closed: %w", ErrClosed)
	for _, target := range []error{net.ErrClosed, os.ErrClosed, ErrClosed} {
		if !errors.Is(wrapped, target) {
			t.Errorf("a wrapped ErrClosed does not match %v", target)
		}
	}
	if errors.Is(errors.New("other"), ErrClosed) || errors.Is(ErrNotSupported, net.ErrClosed) {
		t.Error("unrelated errors match the closed family")
	}
}
