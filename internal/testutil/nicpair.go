package testutil

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/netns"
)

// The addresses NewNICPair gives the two NICs.
var (
	NICPairRoot = netip.MustParsePrefix("10.77.0.1/24")
	NICPairPeer = netip.MustParsePrefix("10.77.0.2/24")
)

// NICPairWanted reports whether this machine must have the virtio-net NIC pair: vmtest's
// guests with NET=pair in their pin export ZCVM_NET=pair (kmod/vm/vmtest.sh qemu_net).
func NICPairWanted() bool { return os.Getenv("ZCVM_NET") == "pair" }

// NIC is one network device of a NICPair.
type NIC struct {
	Name  string
	Index int // in the namespace it is in now
	MAC   net.HardwareAddr
	Addr  netip.Addr
}

// NICPair is the two virtio-net NICs of a vmtest guest, joined on the host by a bridge: Root
// stays in the process's (the root) network namespace with NICPairRoot, Peer is moved into a
// fresh namespace of its own with NICPairPeer. TCP between a socket of the root namespace
// and one of the peer namespace leaves through one NIC's TX queue and arrives on the other's
// RX queue: the kernel does not deliver it locally, so it does not copy zero-copy sends.
// Sockets for the peer side are created with In.
type NICPair struct {
	Root, Peer NIC
	ns         *os.File // the peer namespace (/proc/thread-self/ns/net of its creating thread)
	rootNS     *os.File // the root namespace, where Peer goes back at cleanup
}

var openNICPairs atomic.Int64

// OpenNICPairs counts the NIC pairs (and so the namespaces) not yet torn down: a test
// binary's TestMain checks it is 0 at the end.
func OpenNICPairs() int64 { return openNICPairs.Load() }

// NewNICPair sets the pair up for one test and tears it down at the test's cleanup (Peer goes
// back to the root namespace, both NICs down and without addresses, the namespace closed).
// Outside a guest with the pair (ZCVM_NET is not "pair") it skips; inside one, a missing
// pair or a failed step fails the test.
func NewNICPair(tb testing.TB) *NICPair {
	tb.Helper()
	if !NICPairWanted() {
		tb.Skip("needs the virtio-net NIC pair of vmtest's guests (ZCVM_NET=pair): make vmtest runs this")
	}
	p, err := setupNICPair("/sys/class/net")
	if err != nil {
		tb.Fatalf("NIC pair: %v", err)
	}
	tb.Cleanup(func() {
		if err := p.close(); err != nil {
			tb.Errorf("NIC pair teardown: %v", err)
		}
	})
	return p
}

// In runs fn on a thread inside the peer namespace (netns.Do: sockets fn creates stay there).
func (p *NICPair) In(fn func() error) error { return netns.Do(int(p.ns.Fd()), fn) }

// PeerNS is the peer namespace's descriptor (for netns.Do and netlink.Config.NetNS).
func (p *NICPair) PeerNS() int { return int(p.ns.Fd()) }

// RootAddrPort and PeerAddrPort are the NICs' addresses with a port.
func (p *NICPair) RootAddrPort(port uint16) netip.AddrPort {
	return netip.AddrPortFrom(p.Root.Addr, port)
}

func (p *NICPair) PeerAddrPort(port uint16) netip.AddrPort {
	return netip.AddrPortFrom(p.Peer.Addr, port)
}

// virtioNIC is a device of /sys/class/net driven by virtio_net.
type virtioNIC struct {
	name string
	mac  net.HardwareAddr
}

// findVirtioNICs lists the devices under sysfs (/sys/class/net) whose driver is virtio_net
// (device/driver links to .../virtio_net), sorted by MAC address.
func findVirtioNICs(sysfs string) ([]virtioNIC, error) {
	ents, err := os.ReadDir(sysfs)
	if err != nil {
		return nil, err
	}
	var nics []virtioNIC
	for _, e := range ents {
		drv, err := os.Readlink(filepath.Join(sysfs, e.Name(), "device", "driver"))
		if err != nil || filepath.Base(drv) != "virtio_net" {
			continue
		}
		a, err := os.ReadFile(filepath.Join(sysfs, e.Name(), "address"))
		if err != nil {
			return nil, err
		}
		mac, err := net.ParseMAC(strings.TrimSpace(string(a)))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name(), err)
		}
		nics = append(nics, virtioNIC{name: e.Name(), mac: mac})
	}
	slices.SortFunc(nics, func(a, b virtioNIC) int { return bytes.Compare(a.mac, b.mac) })
	return nics, nil
}

// newNetNS creates a network namespace on a locked thread that never unlocks (it dies with
// its goroutine) and returns it open; its loopback is left down.
func newNetNS() (*os.File, error) {
	type res struct {
		f   *os.File
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread leaves the namespace by dying
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- res{err: os.NewSyscallError("unshare(CLONE_NEWNET)", err)}
			return
		}
		f, err := openNS()
		ch <- res{f, err}
	}()
	r := <-ch
	return r.f, r.err
}

// openNS opens the calling thread's network namespace.
func openNS() (*os.File, error) {
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: "/proc/thread-self/ns/net", Err: err}
	}
	return os.NewFile(uintptr(fd), "netns"), nil
}

func setupNICPair(sysfs string) (p *NICPair, err error) {
	nics, err := findVirtioNICs(sysfs)
	if err != nil {
		return nil, err
	}
	if len(nics) < 2 {
		names := make([]string, len(nics))
		for i, n := range nics {
			names[i] = n.name
		}
		return nil, fmt.Errorf("want 2 virtio_net devices in %s, found %d %v (is virtio_net loaded? see the guest's \"ZCVM: interfaces\" line)", sysfs, len(nics), names)
	}
	p = &NICPair{
		Root: NIC{Name: nics[0].name, MAC: nics[0].mac, Addr: NICPairRoot.Addr()},
		Peer: NIC{Name: nics[1].name, MAC: nics[1].mac, Addr: NICPairPeer.Addr()},
	}
	// Only the test goroutine's thread is here: it is in the root namespace (netns.Do's
	// threads die with their goroutines).
	runtime.LockOSThread()
	p.rootNS, err = openNS()
	runtime.UnlockOSThread()
	if err != nil {
		return nil, err
	}
	openNICPairs.Add(1)
	defer func() {
		if err != nil {
			err = errors.Join(err, p.close())
		}
	}()
	if p.ns, err = newNetNS(); err != nil {
		return p, err
	}
	root, err := rtnetlink.Dial(nil)
	if err != nil {
		return p, fmt.Errorf("rtnetlink: %w", err)
	}
	defer root.Close()
	peer, err := rtnetlink.Dial(&netlink.Config{NetNS: p.PeerNS()})
	if err != nil {
		return p, fmt.Errorf("rtnetlink in the peer namespace: %w", err)
	}
	defer peer.Close()

	if p.Root.Index, err = linkIndex(root, p.Root.MAC); err != nil {
		return p, err
	}
	idx, err := linkIndex(root, p.Peer.MAC)
	if err != nil {
		return p, err
	}
	if err := root.Link.Set(&rtnetlink.LinkMessage{
		Family:     unix.AF_UNSPEC,
		Index:      uint32(idx),
		Attributes: &rtnetlink.LinkAttributes{NetNS: rtnetlink.NetNSForFD(uint32(p.PeerNS()))},
	}); err != nil {
		return p, fmt.Errorf("move %s into the peer namespace: %w", p.Peer.Name, err)
	}
	if p.Peer.Index, err = linkIndex(peer, p.Peer.MAC); err != nil {
		return p, fmt.Errorf("after the move: %w", err)
	}
	if err := linkUp(peer, 1); err != nil { // the new namespace's loopback
		return p, fmt.Errorf("lo up in the peer namespace: %w", err)
	}
	for _, s := range []struct {
		c   *rtnetlink.Conn
		nic NIC
		pfx netip.Prefix
	}{{root, p.Root, NICPairRoot}, {peer, p.Peer, NICPairPeer}} {
		if err := addAddr(s.c, s.nic.Index, s.pfx); err != nil {
			return p, fmt.Errorf("address %s on %s: %w", s.pfx, s.nic.Name, err)
		}
		if err := linkUp(s.c, s.nic.Index); err != nil {
			return p, fmt.Errorf("%s up: %w", s.nic.Name, err)
		}
	}
	return p, nil
}

// linkIndex finds the device with the MAC address mac.
func linkIndex(c *rtnetlink.Conn, mac net.HardwareAddr) (int, error) {
	links, err := c.Link.List()
	if err != nil {
		return 0, fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		if l.Attributes != nil && bytes.Equal(l.Attributes.Address, mac) {
			return int(l.Index), nil
		}
	}
	return 0, fmt.Errorf("no device with MAC %s", mac)
}

func linkUp(c *rtnetlink.Conn, index int) error {
	return c.Link.Set(&rtnetlink.LinkMessage{
		Family: unix.AF_UNSPEC,
		Index:  uint32(index),
		Flags:  unix.IFF_UP,
		Change: unix.IFF_UP,
	})
}

func linkDown(c *rtnetlink.Conn, index int) error {
	return c.Link.Set(&rtnetlink.LinkMessage{
		Family: unix.AF_UNSPEC,
		Index:  uint32(index),
		Change: unix.IFF_UP,
	})
}

func addrMessage(index int, pfx netip.Prefix) *rtnetlink.AddressMessage {
	ip := net.IP(pfx.Addr().AsSlice())
	bits := pfx.Bits()
	mask := net.CIDRMask(bits, 32)
	brd := make(net.IP, 4)
	for i := range brd {
		brd[i] = ip[i] | ^mask[i]
	}
	return &rtnetlink.AddressMessage{
		Family:       unix.AF_INET,
		PrefixLength: uint8(bits),
		Scope:        unix.RT_SCOPE_UNIVERSE,
		Index:        uint32(index),
		Attributes:   &rtnetlink.AddressAttributes{Address: ip, Local: ip, Broadcast: brd},
	}
}

func addAddr(c *rtnetlink.Conn, index int, pfx netip.Prefix) error {
	return c.Address.New(addrMessage(index, pfx))
}

// close undoes setupNICPair as far as it got: the peer NIC back into the root namespace
// (a move takes its addresses and sets it down), the root NIC down without its address,
// then the namespaces' descriptors closed. It is idempotent.
func (p *NICPair) close() error {
	if p.rootNS == nil {
		return nil
	}
	var errs []error
	if p.ns != nil {
		if peer, err := rtnetlink.Dial(&netlink.Config{NetNS: p.PeerNS()}); err != nil {
			errs = append(errs, err)
		} else {
			if idx, err := linkIndex(peer, p.Peer.MAC); err == nil {
				if err := peer.Link.Set(&rtnetlink.LinkMessage{
					Family:     unix.AF_UNSPEC,
					Index:      uint32(idx),
					Attributes: &rtnetlink.LinkAttributes{NetNS: rtnetlink.NetNSForFD(uint32(p.rootNS.Fd()))},
				}); err != nil {
					errs = append(errs, fmt.Errorf("move %s back: %w", p.Peer.Name, err))
				}
			}
			peer.Close()
		}
		p.ns.Close()
		p.ns = nil
	}
	if p.Root.Index != 0 {
		if root, err := rtnetlink.Dial(nil); err != nil {
			errs = append(errs, err)
		} else {
			if err := root.Address.Delete(addrMessage(p.Root.Index, NICPairRoot)); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
				errs = append(errs, fmt.Errorf("remove %s from %s: %w", NICPairRoot, p.Root.Name, err))
			}
			if err := linkDown(root, p.Root.Index); err != nil {
				errs = append(errs, fmt.Errorf("%s down: %w", p.Root.Name, err))
			}
			root.Close()
		}
	}
	p.rootNS.Close()
	p.rootNS = nil
	openNICPairs.Add(-1)
	return errors.Join(errs...)
}
