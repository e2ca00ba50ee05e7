package memreg

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/testutil"
)

// expectUdmabuf: the qemu guests of make vmtest (6.12, 7.3 kernels built with
// CONFIG_UDMABUF=y) set ZCNET_EXPECT=udmabuf; there a refusal is a failure, elsewhere a skip.
func expectUdmabuf() bool { return strings.Contains(","+os.Getenv("ZCNET_EXPECT")+",", ",udmabuf,") }

func fdCount() int {
	e, _ := os.ReadDir("/proc/self/fd")
	return len(e)
}

// TestDmabufRegion: a dmabuf-backed region is one memory seen two ways, through the memfd
// mapping (Memory) and through the dmabuf fd (its own mmap); Close releases both fds. Where
// /dev/udmabuf is missing (this CI host) New refuses with ErrNotSupported naming
// CONFIG_UDMABUF, and leaks nothing.
func TestDmabufRegion(t *testing.T) {
	before := fdCount()
	r, err := New(Options{BufSize: 4096, Count: 15, Dmabuf: true})
	if err != nil {
		if after := fdCount(); after != before {
			t.Errorf("refusal leaked fds: %d before, %d after", before, after)
		}
		if !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "CONFIG_UDMABUF") {
			t.Fatalf("dmabuf region: %v, want ErrNotSupported naming CONFIG_UDMABUF", err)
		}
		if expectUdmabuf() {
			t.Fatalf("this guest has CONFIG_UDMABUF=y: %v", err)
		}
		t.Skipf("no udmabuf here: %v", err)
	}
	info := r.Info()
	if !info.Dmabuf || info.Size != 16*4096 && info.Size != 15*4096 {
		t.Errorf("info %+v", info)
	}
	fd := r.DmabufFd()
	if fd < 0 {
		t.Fatal("no dmabuf fd")
	}
	link, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	t.Logf("dmabuf fd %d -> %s, region %+v", fd, link, info)
	mem := r.Memory()
	for i := range mem {
		mem[i] = byte(i * 7)
	}
	view, err := unix.Mmap(fd, 0, len(mem), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatalf("mmap of the dmabuf: %v", err)
	}
	if !bytes.Equal(view, mem) {
		t.Error("the dmabuf's mapping shows other bytes than the region")
	}
	unix.Munmap(view)
	b, err := r.Get()
	if err != nil {
		t.Fatal(err)
	}
	b.Bytes()[0] = 0xEE
	if mem[b.Index()*4096] != 0xEE {
		t.Error("buffers are not in the dmabuf memory")
	}
	b.Release()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if r.Memory() != nil || r.DmabufFd() != -1 {
		t.Error("closed region still shows memory or an fd")
	}
	if after := fdCount(); after != before {
		t.Errorf("fds: %d before, %d after Close", before, after)
	}
}

// TestDmabufRequireHugePages: RequireHugePages with no reserved huge pages is refused, with
// nothing left behind; HugePages alone falls back to normal pages and says so.
func TestDmabufRequireHugePages(t *testing.T) {
	if _, err := os.Stat(UdmabufDevice); err != nil {
		if expectUdmabuf() {
			t.Fatal(err)
		}
		t.Skip("no " + UdmabufDevice)
	}
	free, _ := os.ReadFile("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
	if n, _ := strconv.Atoi(strings.TrimSpace(string(free))); n > 0 {
		t.Skipf("%d huge pages reserved here", n)
	}
	before := fdCount()
	if _, err := New(Options{BufSize: 4096, Count: 4, Dmabuf: true, RequireHugePages: true}); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("RequireHugePages without reserved pages: %v", err)
	}
	if after := fdCount(); after != before {
		t.Errorf("fds: %d before, %d after", before, after)
	}
	r, err := New(Options{BufSize: 4096, Count: 4, Dmabuf: true, HugePages: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Info().HugeTLB || r.Info().Fallback == "" {
		t.Errorf("info %+v: want a visible fallback to normal pages", r.Info())
	}
}

// TestUdmabufABI compares the udmabuf ioctl ABI with <linux/udmabuf.h>.
func TestUdmabufABI(t *testing.T) {
	if _, err := os.Stat("/usr/include/linux/udmabuf.h"); err != nil {
		t.Skip("no /usr/include/linux/udmabuf.h (install linux-libc-dev)")
	}
	var a udmabufCreateArg
	testutil.CompareWithC(t, []string{"linux/udmabuf.h"}, nil, map[string]uint64{
		"sizeof(struct udmabuf_create)":           uint64(unsafe.Sizeof(a)),
		"offsetof(struct udmabuf_create, offset)": uint64(unsafe.Offsetof(a.Offset)),
		"offsetof(struct udmabuf_create, size)":   uint64(unsafe.Offsetof(a.Size)),
		"UDMABUF_CREATE":                          uint64(udmabufCreate),
		"UDMABUF_FLAGS_CLOEXEC":                   uint64(udmabufFlagsCloexec),
	})
}
