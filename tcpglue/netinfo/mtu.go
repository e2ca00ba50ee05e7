package netinfo

import (
	"errors"
	"sync"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// LinkMTU returns a device's MTU (RTM_GETLINK). The MTU towards a destination, which a
// route's mtu metric or a learned path MTU can lower, is RouteTo(dst).MTU.
func (s *Stack) LinkMTU(ifname string) (uint32, error) {
	var mtu uint32
	err := s.use("link mtu", ifname, func() error {
		links, err := s.rt.Link.List()
		if err != nil {
			return err
		}
		for _, l := range links {
			if l.Attributes != nil && l.Attributes.Name == ifname {
				mtu = l.Attributes.MTU
				return nil
			}
		}
		return unix.ENODEV
	})
	return mtu, err
}

// MTUChange is a device MTU change. Old is 0 for a device that appeared after the watch
// started; New is 0 for a device that went away.
type MTUChange struct {
	Ifindex  int
	Ifname   string
	Old, New uint32
}

// MTUWatch reports device MTU changes as the kernel announces them (RTNLGRP_LINK). Close
// stops it: its goroutine has exited when Close returns, and C is closed.
type MTUWatch struct {
	// C delivers the changes in the order they happened. The watch blocks (and the
	// kernel's queue for it fills up) while nobody reads; after an overrun it re-reads
	// every device and reports the differences, so no change of value is lost, though
	// intermediate values can be.
	C <-chan MTUChange

	conn *netlink.Conn
	dump func() (map[int]link, error)
	done chan struct{}
	wg   sync.WaitGroup
	once sync.Once
	err  error
}

type link struct {
	name string
	mtu  uint32
}

// WatchMTU starts reporting MTU changes of every device of the Stack's namespace. Changes
// made after WatchMTU returns are reported.
func (s *Stack) WatchMTU() (*MTUWatch, error) {
	const op = "watch mtu"
	conn, err := s.dial(unix.RTMGRP_LINK)
	if err != nil {
		return nil, opErr(op, "", err)
	}
	// The snapshot is taken after subscribing, so nothing falls between the two.
	dumpConn, err := rtnetlink.Dial(s.netlinkConfig(0))
	if err != nil {
		conn.Close()
		return nil, opErr(op, "", err)
	}
	dump := func() (map[int]link, error) {
		ls, err := dumpConn.Link.List()
		if err != nil {
			return nil, err
		}
		m := make(map[int]link, len(ls))
		for _, l := range ls {
			if l.Attributes != nil {
				m[int(l.Index)] = link{l.Attributes.Name, l.Attributes.MTU}
			}
		}
		return m, nil
	}
	known, err := dump()
	if err != nil {
		conn.Close()
		dumpConn.Close()
		return nil, opErr(op, "", err)
	}
	c := make(chan MTUChange, 16)
	w := &MTUWatch{C: c, conn: conn, dump: dump, done: make(chan struct{})}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer close(c)
		defer dumpConn.Close()
		w.run(c, known)
	}()
	return w, nil
}

func (w *MTUWatch) send(c chan<- MTUChange, ch MTUChange) bool {
	select {
	case c <- ch:
		return true
	case <-w.done:
		return false
	}
}

func (w *MTUWatch) run(c chan<- MTUChange, known map[int]link) {
	for {
		msgs, err := w.conn.Receive()
		select {
		case <-w.done:
			return
		default:
		}
		if errors.Is(err, unix.ENOBUFS) {
			// Overrun: notifications were dropped. Compare a fresh snapshot.
			now, derr := w.dump()
			if derr != nil {
				w.err = derr
				return
			}
			for idx, l := range now {
				if old, ok := known[idx]; !ok || old.mtu != l.mtu {
					if !w.send(c, MTUChange{Ifindex: idx, Ifname: l.name, Old: old.mtu, New: l.mtu}) {
						return
					}
				}
			}
			for idx, l := range known {
				if _, ok := now[idx]; !ok && !w.send(c, MTUChange{Ifindex: idx, Ifname: l.name, Old: l.mtu}) {
					return
				}
			}
			known = now
			continue
		}
		if err != nil {
			w.err = err
			return
		}
		for _, nm := range msgs {
			var m rtnetlink.LinkMessage
			if nm.Header.Type != unix.RTM_NEWLINK && nm.Header.Type != unix.RTM_DELLINK {
				continue
			}
			if m.UnmarshalBinary(nm.Data) != nil || m.Attributes == nil {
				continue
			}
			idx := int(m.Index)
			old, had := known[idx]
			if nm.Header.Type == unix.RTM_DELLINK {
				if had {
					delete(known, idx)
					if !w.send(c, MTUChange{Ifindex: idx, Ifname: old.name, Old: old.mtu}) {
						return
					}
				}
				continue
			}
			cur := link{m.Attributes.Name, m.Attributes.MTU}
			known[idx] = cur
			if !had || old.mtu != cur.mtu {
				if !w.send(c, MTUChange{Ifindex: idx, Ifname: cur.name, Old: old.mtu, New: cur.mtu}) {
					return
				}
			}
		}
	}
}

// Close stops the watch and waits for its goroutine. It returns the error that ended the
// watch early, if any. It is idempotent and nil-safe.
func (w *MTUWatch) Close() error {
	if w == nil {
		return nil
	}
	w.once.Do(func() {
		close(w.done)
		w.conn.Close() // wakes the blocked Receive
		w.wg.Wait()
	})
	return w.err
}
