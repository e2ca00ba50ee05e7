package bpf

import (
	"fmt"
	"math"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Fault is a test-only packet dropper attached to one interface with a tcx
// link: it drops (Set) or corrupts (Corrupt) a configurable fraction of the
// packets that match a protocol/port filter (this kernel has no sch_netem).
// Methods are safe for concurrent use; after Close they return an error
// matching ErrClosed.
type Fault struct {
	mu     sync.Mutex
	closed bool
	objs   faultObjects
	l      link.Link
}

// NewFault loads the fault injector and attaches it to the interface's
// egress (ingress=false) or ingress path, initially dropping nothing. The
// interface index is resolved in the calling thread's network namespace.
//
// To emulate loss on the wire for a TCP sender, drop at the receiver's
// ingress: a drop at the sender's own egress is reported back to its TCP
// as a local transmit failure (NET_XMIT_DROP), which simply sends the
// segment again later without treating it as a loss.
func NewFault(ifindex int, ingress bool) (*Fault, error) {
	op := fmt.Sprintf("attach fault injector to ifindex %d", ifindex)
	if _, err := ifName(ifindex); err != nil {
		return nil, opErr(op, err)
	}
	f := &Fault{}
	if err := loadFaultObjects(&f.objs, nil); err != nil {
		return nil, opErr("load fault injector", err)
	}
	at := ebpf.AttachTCXEgress
	if ingress {
		at = ebpf.AttachTCXIngress
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: f.objs.ZcFault, Attach: at})
	if err != nil {
		f.objs.Close()
		return nil, opErr(op, err)
	}
	f.l = l
	return f, nil
}

// Set drops fraction (0..1) of the packets with IP protocol proto (0 = any)
// and, if port is not 0, with that TCP/UDP source or destination port.
// Fraction 0 turns dropping off.
func (f *Fault) Set(fraction float64, proto uint8, port uint16) error {
	return f.set("set fault", fraction, proto, port, faultActDrop)
}

// Corrupt flips bits of the last payload byte of fraction (0..1) of the TCP
// segments that carry payload and, if port is not 0, have that source or
// destination port; it replaces Set's dropping (fraction 0 turns it off). It
// acts after TCP made its checksum: on loopback and veth, where the checksum
// is left to hardware that is not there, the receiver's TCP accepts the
// segment and hands the wrong byte up — for tests of an integrity check above
// TCP, such as TLS's. On a path that checks the checksum the segment is
// dropped instead, as a loss. Corrupted counts what it changed.
func (f *Fault) Corrupt(fraction float64, port uint16) error {
	return f.set("corrupt fault", fraction, unix.IPPROTO_TCP, port, faultActCorrupt)
}

// The fault program's actions (enum fault_action in c/zcnet.h) and counters
// (enum fault_counter).
const (
	faultActDrop    = 0
	faultActCorrupt = 1

	faultSeen      = 0
	faultDropped   = 1
	faultCorrupted = 2
	faultCounters  = 3
)

func (f *Fault) set(op string, fraction float64, proto uint8, port uint16, action uint8) error {
	if f == nil {
		return &OpError{Op: op, Err: ErrClosed}
	}
	if math.IsNaN(fraction) || fraction < 0 || fraction > 1 {
		return invalid(op, "fraction %v outside 0..1", fraction)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return &OpError{Op: op, Err: ErrClosed}
	}
	th := uint64(math.Round(fraction * (1 << 32)))
	if th > math.MaxUint32 {
		th = math.MaxUint32
	}
	cfg := faultFaultConfig{Threshold: uint32(th), Port: port, Proto: proto, Action: action}
	return opErr(op, f.objs.FaultSettings.Update(uint32(0), &cfg, ebpf.UpdateAny))
}

// Stats returns how many packets matched the filter and how many of them
// were dropped.
func (f *Fault) Stats() (seen, dropped uint64, err error) {
	c, err := f.counters("fault stats")
	return c[faultSeen], c[faultDropped], err
}

// Corrupted returns how many TCP segments Corrupt changed.
func (f *Fault) Corrupted() (uint64, error) {
	c, err := f.counters("fault corrupted")
	return c[faultCorrupted], err
}

func (f *Fault) counters(op string) ([faultCounters]uint64, error) {
	var c [faultCounters]uint64
	if f == nil {
		return c, &OpError{Op: op, Err: ErrClosed}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return c, &OpError{Op: op, Err: ErrClosed}
	}
	for i := range c {
		var per []uint64
		if err := f.objs.FaultStats.Lookup(uint32(i), &per); err != nil {
			return c, opErr(op, err)
		}
		for _, v := range per {
			c[i] += v
		}
	}
	return c, nil
}

// Close detaches and unloads the injector. Later calls return an error
// matching ErrClosed.
func (f *Fault) Close() error {
	if f == nil {
		return &OpError{Op: "close fault", Err: ErrClosed}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return &OpError{Op: "close fault", Err: ErrClosed}
	}
	f.closed = true
	err1 := f.l.Close()
	err2 := f.objs.Close()
	if err1 != nil {
		return opErr("close fault", err1)
	}
	return opErr("close fault", err2)
}
