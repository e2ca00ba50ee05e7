package main

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/testutil"
)

// TestRawsend runs the example in a namespace of a veth pair and checks, at an AF_PACKET
// socket in the other namespace, that every frame arrived as documented.
func TestRawsend(t *testing.T) {
	v := testutil.NewVethPair(t, testutil.VethConfig{Prefix: "zcrawsend", Queues: 2,
		Server: netip.MustParsePrefix("10.219.9.1/24"), Client: netip.MustParsePrefix("10.219.9.2/24")})
	var fd int
	var dst net.HardwareAddr
	v.In(t, v.Srv, func() error {
		ifi, err := net.InterfaceByName(v.SrvIf)
		if err != nil {
			return err
		}
		dst = ifi.HardwareAddr
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, int(htons(0x88b5)))
		if err != nil {
			return err
		}
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(0x88b5), Ifindex: ifi.Index})
	})
	defer unix.Close(fd)
	const count, size = 500, 300
	var out strings.Builder
	if err := run(config{Iface: v.CliIf, NetNS: v.Cli.Name, Queue: 1, Dst: dst, EtherType: 0x88b5, Size: size, Count: count}, &out); err != nil {
		t.Fatal(err)
	}
	t.Log(strings.TrimSpace(out.String()))
	seen := make([]bool, count)
	buf := make([]byte, 4096)
	got := 0
	for deadline := time.Now().Add(10 * time.Second); got < count && time.Now().Before(deadline); {
		n, _, err := unix.Recvfrom(fd, buf, 0|unix.MSG_DONTWAIT)
		if err != nil {
			time.Sleep(time.Millisecond)
			continue
		}
		f := buf[:n]
		if n != size || !bytes.Equal(f[0:6], dst) {
			t.Fatalf("frame of %d bytes to %x", n, f[0:6])
		}
		seq := binary.BigEndian.Uint32(f[14:])
		want := make([]byte, size)
		build(want, dst, net.HardwareAddr(f[6:12]), 0x88b5, seq)
		if seq >= count || seen[seq] || !bytes.Equal(f, want) {
			t.Fatalf("frame %d wrong, repeated or altered", seq)
		}
		seen[seq] = true
		got++
	}
	if got != count {
		t.Fatalf("%d of %d frames arrived", got, count)
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
