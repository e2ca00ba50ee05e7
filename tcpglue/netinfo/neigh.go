package netinfo

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// NeighState is a neighbour cache state (NUD_* bits, include/uapi/linux/neighbour.h).
type NeighState uint16

// Neighbour states (NUD_*, include/uapi/linux/neighbour.h via golang.org/x/sys/unix).
const (
	NUDIncomplete NeighState = unix.NUD_INCOMPLETE
	NUDReachable  NeighState = unix.NUD_REACHABLE
	NUDStale      NeighState = unix.NUD_STALE
	NUDDelay      NeighState = unix.NUD_DELAY
	NUDProbe      NeighState = unix.NUD_PROBE
	NUDFailed     NeighState = unix.NUD_FAILED
	NUDNoARP      NeighState = unix.NUD_NOARP
	NUDPermanent  NeighState = unix.NUD_PERMANENT
	nudNone       NeighState = unix.NUD_NONE
)

// Resolved reports whether the state carries a usable link-layer address: the kernel
// sends with it (STALE, DELAY and PROBE re-verify it in the background).
func (s NeighState) Resolved() bool {
	return s&(NUDReachable|NUDStale|NUDDelay|NUDProbe|NUDPermanent|NUDNoARP) != 0
}

func (s NeighState) String() string {
	var n []string
	for _, x := range []struct {
		b    NeighState
		name string
	}{{NUDIncomplete, "INCOMPLETE"}, {NUDReachable, "REACHABLE"}, {NUDStale, "STALE"}, {NUDDelay, "DELAY"},
		{NUDProbe, "PROBE"}, {NUDFailed, "FAILED"}, {NUDNoARP, "NOARP"}, {NUDPermanent, "PERMANENT"}} {
		if s&x.b != 0 {
			n = append(n, x.name)
		}
	}
	if len(n) == 0 {
		return "NONE"
	}
	return strings.Join(n, "|")
}

// Neighbor is a neighbour cache entry: an on-link address and its link-layer address.
type Neighbor struct {
	Addr    netip.Addr
	Ifindex int
	MAC     net.HardwareAddr
	State   NeighState
}

// NeighborError reports a neighbour the kernel could not resolve (state FAILED: no answer
// to ARP or neighbour solicitation). It matches unix.EHOSTUNREACH.
type NeighborError struct {
	Addr    netip.Addr
	Ifindex int
	State   NeighState
}

func (e *NeighborError) Error() string {
	return fmt.Sprintf("neighbor %s on ifindex %d unresolved (state %s)", e.Addr, e.Ifindex, e.State)
}

// Unwrap returns unix.EHOSTUNREACH, what a send to the address fails with.
func (e *NeighborError) Unwrap() error { return unix.EHOSTUNREACH }

// sizeofNdMsg is sizeof(struct ndmsg); pollInterval bounds how long a missed notification
// can delay ResolveNeighbor.
const (
	sizeofNdMsg  = unix.SizeofNdMsg
	pollInterval = 250 * time.Millisecond
)

// NextHop returns the route to dst and its next hop's link-layer address, resolving it if
// needed (see ResolveNeighbor). For a destination on this host (RTN_LOCAL) there is no next
// hop: the MAC is nil.
func (s *Stack) NextHop(ctx context.Context, dst netip.Addr) (Route, Neighbor, error) {
	r, err := s.RouteTo(dst)
	if err != nil {
		return r, Neighbor{}, err
	}
	if r.Local() {
		return r, Neighbor{Addr: dst, Ifindex: r.Ifindex, State: NUDNoARP}, nil
	}
	n, err := s.ResolveNeighbor(ctx, r.Ifindex, r.NextHop)
	return r, n, err
}

// Neighbors lists the neighbour cache entries of ifindex (0: every device).
func (s *Stack) Neighbors(ifindex int) ([]Neighbor, error) {
	var out []Neighbor
	err := s.use("neighbors", "", func() (err error) {
		out, err = s.neighbors(ifindex)
		return err
	})
	return out, err
}

func (s *Stack) neighbors(ifindex int) ([]Neighbor, error) {
	msgs, err := s.rt.Neigh.List()
	if err != nil {
		return nil, err
	}
	var out []Neighbor
	for _, m := range msgs {
		if ifindex != 0 && int(m.Index) != ifindex {
			continue
		}
		if n, ok := neighborOf(&m); ok {
			out = append(out, n)
		}
	}
	return out, nil
}

func neighborOf(m *rtnetlink.NeighMessage) (Neighbor, bool) {
	if m.Attributes == nil || m.Attributes.Address == nil {
		return Neighbor{}, false
	}
	n := Neighbor{Addr: addrOf(m.Attributes.Address), Ifindex: int(m.Index), State: NeighState(m.State)}
	if len(m.Attributes.LLAddress) > 0 {
		n.MAC = append(net.HardwareAddr(nil), m.Attributes.LLAddress...)
	}
	return n, true
}

// ResolveNeighbor returns addr's link-layer address on device ifindex. When the cache has
// no usable entry it asks the kernel to resolve it (RTM_NEWNEIGH with NTF_USE, the ip neigh
// ... use equivalent: the kernel sends ARP requests or neighbour solicitations, no data
// packet) and waits for the answer on a RTNLGRP_NEIGH subscription until ctx is done. An
// address that does not answer gives a *NeighborError (state FAILED, matching
// unix.EHOSTUNREACH) once the kernel gives up (net.ipv4.neigh.DEV.mcast_solicit probes,
// retrans_time_ms apart); ctx ending first gives an error matching ctx.Err().
func (s *Stack) ResolveNeighbor(ctx context.Context, ifindex int, addr netip.Addr) (Neighbor, error) {
	const op = "neighbor"
	target := fmt.Sprintf("%s ifindex %d", addr, ifindex)
	addr = addr.Unmap()
	if !addr.IsValid() || ifindex <= 0 {
		return Neighbor{}, opErr(op, target, errors.New("want a valid address and interface index"))
	}
	find := func() (Neighbor, bool, error) {
		var ns []Neighbor
		err := s.use(op, target, func() (err error) {
			ns, err = s.neighbors(ifindex)
			return err
		})
		if err != nil {
			return Neighbor{}, false, err
		}
		for _, n := range ns {
			if n.Addr == addr.WithZone("") {
				return n, true, nil
			}
		}
		return Neighbor{}, false, nil
	}
	if n, ok, err := find(); err != nil || (ok && n.State.Resolved() && n.MAC != nil) {
		return n, err
	}
	// Subscribe before triggering, so the answer cannot slip between the two.
	sub, err := s.dial(unix.RTMGRP_NEIGH)
	if err != nil {
		return Neighbor{}, opErr(op, target, err)
	}
	defer sub.Close()
	stop := context.AfterFunc(ctx, func() { sub.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := s.triggerNeighbor(ifindex, addr); err != nil {
		return Neighbor{}, opErr(op, target, err)
	}
	triggered := time.Now()
	for {
		if err := ctx.Err(); err != nil {
			return Neighbor{}, opErr(op, target, err)
		}
		deadline := time.Now().Add(pollInterval)
		if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
		sub.SetReadDeadline(deadline)
		msgs, err := sub.Receive()
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, unix.ENOBUFS) {
			if ctx.Err() != nil {
				return Neighbor{}, opErr(op, target, ctx.Err())
			}
			return Neighbor{}, opErr(op, target, err)
		}
		for _, nm := range msgs {
			if nm.Header.Type != unix.RTM_NEWNEIGH {
				continue
			}
			var m rtnetlink.NeighMessage
			if m.UnmarshalBinary(nm.Data) != nil || int(m.Index) != ifindex {
				continue
			}
			n, ok := neighborOf(&m)
			if !ok || n.Addr != addr.WithZone("") {
				continue
			}
			if n.State.Resolved() && n.MAC != nil {
				return n, nil
			}
			if n.State&NUDFailed != 0 {
				return n, opErr(op, target, &NeighborError{Addr: addr, Ifindex: ifindex, State: n.State})
			}
		}
		// A missed notification (receive buffer overrun) must not hang us: look at the
		// cache itself between reads.
		n, ok, err := find()
		if err != nil {
			return Neighbor{}, err
		}
		if ok && n.State.Resolved() && n.MAC != nil {
			return n, nil
		}
		if ok && n.State&NUDFailed != 0 && time.Since(triggered) > pollInterval {
			return n, opErr(op, target, &NeighborError{Addr: addr, Ifindex: ifindex, State: n.State})
		}
	}
}

// triggerNeighbor sends RTM_NEWNEIGH {ifindex, addr, NTF_USE} with NLM_F_CREATE|REPLACE:
// the kernel creates the entry if needed and starts resolving it (neigh_event_send).
func (s *Stack) triggerNeighbor(ifindex int, addr netip.Addr) error {
	b := make([]byte, sizeofNdMsg)
	if addr.Is4() {
		b[0] = unix.AF_INET
	} else {
		b[0] = unix.AF_INET6
	}
	binary.NativeEndian.PutUint32(b[4:8], uint32(ifindex))
	binary.NativeEndian.PutUint16(b[8:10], uint16(nudNone))
	b[10] = unix.NTF_USE
	ae := netlink.NewAttributeEncoder()
	ae.Bytes(unix.NDA_DST, addr.AsSlice())
	attrs, err := ae.Encode()
	if err != nil {
		return err
	}
	c, err := s.dial(0)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Execute(netlink.Message{
		Header: netlink.Header{Type: unix.RTM_NEWNEIGH, Flags: netlink.Request | netlink.Acknowledge | netlink.Create | netlink.Replace},
		Data:   append(b, attrs...),
	})
	return err
}
