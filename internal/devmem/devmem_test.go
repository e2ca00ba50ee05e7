package devmem

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/leakcheck"
	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/memreg"
)

func TestMain(m *testing.M) {
	os.Exit(leakcheck.Main(m, time.Second,
		leakcheck.Check{Name: "devmem bindings", Open: OpenBindings},
		leakcheck.Check{Name: "regions", Open: memreg.OpenRegions},
	))
}

func countFDs() int {
	e, _ := os.ReadDir("/proc/self/fd")
	return len(e)
}

// dmabuf returns a dmabuf fd from a memreg region where /dev/udmabuf exists (the test VM),
// else a memfd: the device checks come before the kernel looks at the fd.
func dmabuf(t *testing.T) (int, bool) {
	r, err := memreg.New(memreg.Options{BufSize: 4096, Count: 64, Dmabuf: true})
	if err == nil {
		t.Cleanup(func() { r.Close() })
		return r.DmabufFd(), true
	}
	if !errors.Is(err, memreg.ErrNotSupported) || strings.Contains(","+os.Getenv("ZCNET_EXPECT")+",", ",udmabuf,") {
		t.Fatal(err)
	}
	fd, err := unix.MemfdCreate("devmem-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd, false
}

// TestRefusal: lo cannot do devmem TCP: bind-rx and bind-tx are refused with
// ErrNotSupported naming what is needed, and nothing (socket, binding) is left behind. In
// the test VM the dmabuf is a real one (udmabuf).
func TestRefusal(t *testing.T) {
	testutil.RequireRoot(t)
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	fd, real := dmabuf(t)
	fds := countFDs()
	for _, c := range []struct {
		op   string
		bind func() (*Binding, error)
	}{
		{"bind-rx", func() (*Binding, error) { return BindRX(lo.Index, []int{0}, fd) }},
		{"bind-tx", func() (*Binding, error) { return BindTX(lo.Index, fd) }},
	} {
		b, err := c.bind()
		if err == nil {
			b.Close()
			t.Fatalf("%s on lo succeeded", c.op)
		}
		var de *Error
		if !errors.As(err, &de) || de.Op != c.op {
			t.Fatalf("%s: %v is not a *devmem.Error", c.op, err)
		}
		if errors.Is(err, unix.EOPNOTSUPP) && !strings.Contains(err.Error(), "needs a NIC driver with devmem TCP support") {
			t.Fatalf("%s: the refusal does not say what it needs: %v", c.op, err)
		}
		// Kernels without the command (bind-tx before 6.15) refuse the same way.
		testutilRefusal(t, c.op, err)
		t.Logf("%s (real dmabuf %v): %v", c.op, real, err)
	}
	if countFDs() != fds || OpenBindings() != 0 {
		t.Fatalf("leak: fds %d -> %d, bindings %d", fds, countFDs(), OpenBindings())
	}
}

func testutilRefusal(t *testing.T, op string, err error) {
	t.Helper()
	if !errors.Is(err, ErrNotSupported) {
		t.Fatalf("%s on lo: %v, want ErrNotSupported", op, err)
	}
}

// TestBadInput: what can never work fails with its errno and opens nothing.
func TestBadInput(t *testing.T) {
	testutil.RequireRoot(t)
	fds := countFDs()
	for _, c := range []struct {
		name string
		err  error
		want error
	}{
		{"no queues", second(BindRX(1, nil, 3)), unix.EINVAL},
		{"negative queue", second(BindRX(1, []int{-1}, 3)), unix.EINVAL},
		{"negative fd", second(BindTX(1, -1)), unix.EINVAL},
		{"no ifindex", second(BindTX(0, 3)), unix.EINVAL},
		{"bogus ifindex", second(BindRX(1<<30, []int{0}, 3)), unix.ENODEV},
	} {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
	if countFDs() != fds || OpenBindings() != 0 {
		t.Fatalf("leak: fds %d -> %d, bindings %d", fds, countFDs(), OpenBindings())
	}
	var b *Binding
	if err := b.Close(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("nil Close: %v", err)
	}
}

func second(_ *Binding, err error) error { return err }

// TestUAPI compares the netdev constants with Linux 7.3's <linux/netdev.h> (make uapi73).
func TestUAPI(t *testing.T) {
	inc := os.Getenv("ZCNET_UAPI73")
	if inc == "" {
		inc = filepath.Join("..", "..", "build", "uapi73", "usr", "include")
	}
	if _, err := os.Stat(filepath.Join(inc, "linux", "netdev.h")); err != nil {
		t.Skipf("no Linux 7.3 uapi headers at %s (run make uapi73)", inc)
	}
	testutil.CompareWithC(t, []string{"linux/netdev.h"}, []string{"-I", inc}, map[string]uint64{
		"NETDEV_CMD_BIND_RX": cmdBindRX, "NETDEV_CMD_BIND_TX": cmdBindTX,
		"NETDEV_A_DEV_IFINDEX": attrDevIfindex, "NETDEV_A_DMABUF_IFINDEX": attrDevIfindex,
		"NETDEV_A_DMABUF_QUEUES": attrDmabufQueues, "NETDEV_A_DMABUF_FD": attrDmabufFd,
		"NETDEV_A_DMABUF_ID": attrDmabufID, "NETDEV_A_QUEUE_ID": attrQueueID,
		"NETDEV_A_QUEUE_TYPE": attrQueueType, "NETDEV_QUEUE_TYPE_RX": queueTypeRX,
	})
}
