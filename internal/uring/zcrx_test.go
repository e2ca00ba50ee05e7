package uring

import (
	"errors"
	"net"
	"runtime"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestZcrxLayout(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"io_uring_zcrx_offsets", unsafe.Sizeof(zcrxOffsets{}), 32},
		{"io_uring_zcrx_area_reg", unsafe.Sizeof(zcrxAreaReg{}), 48},
		{"io_uring_zcrx_ifq_reg", unsafe.Sizeof(zcrxIfqReg{}), 96},
		{"io_uring_region_desc", unsafe.Sizeof(regionDesc{}), 64},
		{"io_uring_zcrx_rqe", unsafe.Sizeof(ZcrxRqe{}), 16},
		{"ifq_reg.offsets", unsafe.Offsetof(zcrxIfqReg{}.Offsets), 32},
		{"ifq_reg.zcrx_id", unsafe.Offsetof(zcrxIfqReg{}.ZcrxID), 64},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d", c.name, c.got, c.want)
		}
	}
}

// TestZcrxCleanFailure: this machine has no NIC that can do zero-copy receive. Registration
// must fail cleanly, with the reason, and leak nothing: EOPNOTSUPP (ErrNotSupported) on
// loopback, ENODEV for a bogus interface, EINVAL for a ring without CQE32.
func TestZcrxCleanFailure(t *testing.T) {
	if !DetectCapabilities().Probe.Supports(OpRecvZC) {
		t.Skip("no IORING_OP_RECV_ZC (Linux 6.15+)")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r := newRing(t, 8, &Options{Flags: SetupSingleIssuer | SetupDeferTaskrun | SetupCQE32})
	area := mmapBuf(t, 1<<20)
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.RegisterZcrx(uint32(lo.Index), 0, area, 64)
	var ze *ZcrxError
	if !errors.As(err, &ze) || !errors.Is(err, unix.EOPNOTSUPP) || !errors.Is(err, ErrNotSupported) {
		t.Fatalf("zcrx on lo = %v, want *ZcrxError with EOPNOTSUPP / ErrNotSupported", err)
	}
	t.Logf("lo: %v", err)
	if _, err := r.RegisterZcrx(1<<30, 0, area, 64); !errors.Is(err, unix.ENODEV) {
		t.Fatalf("zcrx on a bogus ifindex = %v, want ENODEV", err)
	}
	plain := newRing(t, 8, nil)
	if _, err := plain.RegisterZcrx(uint32(lo.Index), 0, area, 64); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("zcrx on a ring without CQE32 = %v, want EINVAL", err)
	}
	if _, err := r.RegisterZcrx(uint32(lo.Index), 0, area[1:4097], 64); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("unaligned area = %v", err)
	}
	if _, err := r.RegisterZcrx(uint32(lo.Index), 0, area, 3); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("refill ring of 3 = %v", err)
	}
	if n := openZcrx.Load(); n != 0 {
		t.Fatalf("%d zcrx objects left", n)
	}
}
