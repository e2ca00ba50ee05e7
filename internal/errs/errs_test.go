package errs

import (
	"errors"
	"fmt"
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
