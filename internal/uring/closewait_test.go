package uring

import (
	"errors"
	"os"
	"runtime"
	"testing"
	"time"
)

// TestCloseWait: the ring's teardown is seen (the sentinel file's hang-up), and a second
// close is os.ErrClosed.
func TestCloseWait(t *testing.T) {
	runtime.LockOSThread() // RegisterRingFd: the registration belongs to this thread
	defer runtime.UnlockOSThread()
	r, err := New(8, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.RegisterRingFd(); err != nil {
		t.Logf("RegisterRingFd: %v", err)
	}
	ok, err := r.CloseWait(time.Minute)
	if err != nil || !ok {
		t.Fatalf("CloseWait = %v, %v; want true, nil", ok, err)
	}
	if _, err := r.CloseWait(time.Minute); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("second CloseWait: %v, want os.ErrClosed", err)
	}
}
