package bpf

import (
	"fmt"
	"math"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// Fault is a test-only packet dropper attached to one interface with a tcx
// link: it drops a configurable fraction of the packets that match a
// protocol/port filter (this kernel has no sch_netem). Methods are safe for
// concurrent use; after Close they return an error matching ErrClosed.
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
	const op = "set fault"
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
	cfg := faultFaultConfig{Threshold: uint32(th), Port: port, Proto: proto}
	return opErr(op, f.objs.FaultSettings.Update(uint32(0), &cfg, ebpf.UpdateAny))
}

// Stats returns how many packets matched the filter and how many of them
// were dropped.
func (f *Fault) Stats() (seen, dropped uint64, err error) {
	const op = "fault stats"
	if f == nil {
		return 0, 0, &OpError{Op: op, Err: ErrClosed}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return 0, 0, &OpError{Op: op, Err: ErrClosed}
	}
	var c [2]uint64
	for i := range c {
		var per []uint64
		if err := f.objs.FaultStats.Lookup(uint32(i), &per); err != nil {
			return 0, 0, opErr(op, err)
		}
		for _, v := range per {
			c[i] += v
		}
	}
	return c[0], c[1], nil
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
