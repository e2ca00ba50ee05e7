package hwq

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/internal/netns"
	"github.com/zcnet/zcnet/memreg"
)

// rawChildEnv names the namespace and interface a child process opens a raw queue on
// (TestRawKilledProcess); TestMain runs rawChild instead of the tests when it is set.
const rawChildEnv = "ZCNET_HWQ_RAW_CHILD"

// rawChild opens a raw queue with a rule, says "ready" and waits to be killed.
func rawChild(spec string) int {
	nsName, ifname, _ := strings.Cut(spec, ":")
	f, err := os.Open("/run/netns/" + nsName)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	r, err := memreg.New(memreg.Options{BufSize: 2048, Count: 256})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	q, err := OpenRawQueue(ifname, 0, r, &RawQueueOptions{NetNS: int(f.Fd()), RingSize: 128})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	if _, err := q.Steering().AddRule(bpf.RawRule{DstPort: 6000}); err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println("ready")
	time.Sleep(time.Hour)
	return 0
}

// xdpProgOn returns the ID of the XDP program attached to ifname in ns (0: none).
func xdpProgOn(t *testing.T, ns *netns.NS, ifname string) uint32 {
	t.Helper()
	var id uint32
	if err := netns.Do(ns.Fd(), func() error {
		ifi, err := netInterfaceByName(ifname)
		if err != nil {
			return err
		}
		b, err := syscall.NetlinkRIB(syscall.RTM_GETLINK, syscall.AF_UNSPEC)
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(b)
		if err != nil {
			return err
		}
		for i := range msgs {
			m := &msgs[i]
			if m.Header.Type != syscall.RTM_NEWLINK || len(m.Data) < syscall.SizeofIfInfomsg {
				continue
			}
			if int((*syscall.IfInfomsg)(unsafe.Pointer(&m.Data[0])).Index) != ifi {
				continue
			}
			attrs, err := syscall.ParseNetlinkRouteAttr(m)
			if err != nil {
				return err
			}
			for _, a := range attrs {
				if a.Attr.Type&^unix.NLA_F_NESTED != unix.IFLA_XDP {
					continue
				}
				// Nested: IFLA_XDP_ATTACHED (2), IFLA_XDP_PROG_ID (4), ...
				v := a.Value
				for len(v) >= 8 {
					l := int(*(*uint16)(unsafe.Pointer(&v[0])))
					typ := *(*uint16)(unsafe.Pointer(&v[2]))
					if l < 4 || l > len(v) {
						break
					}
					if typ == unix.IFLA_XDP_PROG_ID && l >= 8 {
						id = *(*uint32)(unsafe.Pointer(&v[4]))
					}
					v = v[(l+3)&^3:]
				}
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return id
}

func netInterfaceByName(name string) (int, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return 0, err
	}
	return ifi.Index, nil
}

// TestRawKilledProcess: a process killed while it holds a raw queue leaves nothing that
// stands in the way of the next open: its XDP program is gone from the interface with its
// link, and the queue can be bound again (after the kernel's deferred release, which
// OpenRawQueue waits out).
func TestRawKilledProcess(t *testing.T) {
	e := newRawEnv(t, 1)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), rawChildEnv+"="+e.Srv.Name+":"+e.SrvIf)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		t.Fatalf("child: %q %v", line, err)
	}
	if xdpProgOn(t, e.Srv, e.SrvIf) == 0 {
		t.Fatal("the child's XDP program is not attached")
	}
	cmd.Process.Signal(unix.SIGKILL)
	cmd.Wait()
	killed = true
	if id := xdpProgOn(t, e.Srv, e.SrvIf); id != 0 {
		t.Fatalf("XDP program %d still attached after the child was killed", id)
	}
	q := e.openRaw(t, 0, newRegion(t, 64), nil)
	if _, err := q.Steering().AddRule(bpf.RawRule{DstPort: 6000}); err != nil {
		t.Fatal(err)
	}
}
