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

// TestRawsendSmallRegion: with a region smaller than the fill ring (64 buffers, fill ring
// 2,048 entries by default) the queue keeps its TxReserve out of the fill ring, so the
// example finds buffers and sends every frame. Before the reserve the fill ring took the
// whole region, Get returned ErrExhausted with nothing in flight, and the example's wait
// spun forever.
func TestRawsendSmallRegion(t *testing.T) {
	v := testutil.NewVethPair(t, testutil.VethConfig{Prefix: "zcrawsend", Queues: 1,
		Server: netip.MustParsePrefix("10.219.10.1/24"), Client: netip.MustParsePrefix("10.219.10.2/24")})
	var out strings.Builder
	done := make(chan error, 1)
	go func() {
		done <- run(config{Iface: v.CliIf, NetNS: v.Cli.Name, Dst: net.HardwareAddr{2, 0, 0, 0, 0, 9}, EtherType: 0x88b5, Size: 100, Count: 300, Buffers: 64}, &out)
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second): // a safety net against the old spin, not a timing
		t.Fatal("rawsend with a 64-buffer region still running after 60 s")
	}
	t.Log(strings.TrimSpace(out.String()))
}
