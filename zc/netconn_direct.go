package zc

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Direct reads: the net.Conn face's Read calls read(2) on the reading goroutine and waits
// for readability in Go's own poller, instead of taking bytes from the queue's receive ring.
//
// Read(p) names its destination, so the cheapest thing it can do is what Go's net does: one
// copy, kernel to p. Through the ring it was two (kernel to a receive buffer, buffer to p),
// and every wait was a hand-off between the reading goroutine and the queue's locked thread:
// the queue woke, readied the reader and yielded its P (a thread switch); the reader parked
// and the runtime handed the P back (another). Side by side (doc/notes/issue-10-perf.md,
// session 5) the file send's receiver gained most; for HTTP the gain was within the 2-CPU
// VM's noise, next to two per-request costs removed with it. Writes were already
// direct while nothing is queued (Conn.write), so a request/response connection now never
// involves the queue at all; queued sends, sendfile/splice (ReadFrom) and closing still do.
//
// The poller needs a descriptor of its own (registering the queue's would hand its closing
// to the os.File): the connection keeps a duplicate, one more descriptor per connection.
// The receive ring is never armed for such a connection (pause reason pauseSelfRead, set
// before the loop first sees it), so the two never race for the socket's bytes.

// directReads reports whether net.Conn faces of e read directly: RecvRing engines on a
// backend whose sockets a goroutine may read itself, unless Config.NetConnRing.
func (e *Engine) directReads() bool {
	return !e.cfg.NetConnRing && e.cfg.RecvPath == RecvRing && len(e.queues) > 0 && e.queues[0].be.directOK()
}

// dupFD duplicates a descriptor (a variable: tests make it fail as EMFILE would).
var dupFD = func(fd int) (int, error) { return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0) }

// openDirect duplicates the socket's descriptor into an *os.File registered with Go's poller.
// A connection that finished meanwhile gets none (its reads return the close's error).
func (n *netConn) openDirect() error {
	dfd := -1
	err := n.rawFD(func(fd int) error {
		var err error
		dfd, err = dupFD(fd)
		return err
	})
	if err != nil {
		return os.NewSyscallError("fcntl(F_DUPFD_CLOEXEC)", err)
	}
	f := os.NewFile(uintptr(dfd), "zc-netconn")
	rc, err := f.SyscallConn()
	if err == nil {
		// Only a pollable file takes a deadline: one that is not would block a thread in read.
		if err = f.SetReadDeadline(time.Time{}); err != nil {
			err = fmt.Errorf("zc: the socket's duplicate is not pollable: %w", err)
		}
	}
	if err != nil {
		f.Close()
		return err
	}
	n.mu.Lock()
	if n.closed || n.rerr != nil {
		n.mu.Unlock()
		f.Close()
		return nil
	}
	n.df, n.drc = f, rc
	n.mu.Unlock()
	return nil
}

// closeDirect releases the duplicate (once); a Read waiting in the poller wakes.
func (n *netConn) closeDirect() {
	n.mu.Lock()
	f := n.df
	shut := n.dfShut
	n.dfShut = true
	n.mu.Unlock()
	if f != nil && !shut {
		f.Close()
	}
}

// directClosedByEngine runs on the loop when the engine finished the connection (OnClose)
// while the application had not closed it: the queue closed its descriptor, ours keeps the
// socket. Bytes the kernel had received stay readable, as they did in the ring's buffers;
// the peer sees our side close now (SHUT_WR). A socket with nothing to read is released at
// once; one with bytes is released by the Read that finds its end, or by Close.
func (n *netConn) directClosedByEngine() {
	n.mu.Lock()
	f, rc, shut := n.df, n.drc, n.dfShut
	n.mu.Unlock()
	if f == nil || shut {
		return
	}
	pending := 0
	rc.Control(func(fd uintptr) {
		pending, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ)
		if pending > 0 {
			unix.Shutdown(int(fd), unix.SHUT_WR)
		}
	})
	if pending <= 0 {
		n.closeDirect()
	}
}

func readOnce(fd uintptr, p []byte) (int, error) {
	for {
		k, err := unix.Read(int(fd), p)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			k = 0
		}
		return k, err
	}
}

// readDirect is Read on a direct connection.
func (n *netConn) readDirect(p []byte) (int, error) {
	for {
		n.mu.Lock()
		closed, rerr, f, shut := n.closed, n.rerr, n.df, n.dfShut
		n.mu.Unlock()
		if closed {
			return 0, n.opErr("read", net.ErrClosed)
		}
		if f == nil || shut {
			if rerr == nil {
				rerr = io.EOF
			}
			return 0, n.opErr("read", rerr)
		}
		if len(p) == 0 {
			return 0, nil
		}
		var k int
		var err error
		var perr error
		if rerr != nil {
			// The engine closed the connection: what is left to read is all there is.
			perr = n.drc.Control(func(fd uintptr) { k, err = readOnce(fd, p) })
		} else {
			perr = n.drc.Read(func(fd uintptr) bool {
				k, err = readOnce(fd, p)
				// Nothing to read: wait in the poller, unless this is a queue goroutine,
				// which must never wait (asked only now: reading what is there is safe
				// anywhere).
				return err != unix.EAGAIN || n.c.onLoop()
			})
		}
		if perr != nil {
			if errors.Is(perr, os.ErrDeadlineExceeded) {
				return 0, n.opErr("read", os.ErrDeadlineExceeded)
			}
			n.mu.Lock()
			gone := n.closed || n.rerr != nil || n.dfShut
			n.mu.Unlock()
			if gone {
				continue // closed under us: report why
			}
			return 0, n.opErr("read", perr)
		}
		switch {
		case k > 0:
			n.c.ctr.recv.Add(uint64(k))
			n.c.q.ctr.recvDirect.Add(uint64(k))
			return k, nil
		case rerr != nil:
			// The rest of the stream after the engine's close: its end is the end of the
			// connection. The peer's end (EOF) reads as io.EOF; bytes that had not arrived
			// (EAGAIN) are lost with the close, which Read says (ErrClosed), not io.EOF.
			if err == nil && rerr == errClosedByEngine {
				n.mu.Lock()
				n.rerr = io.EOF
				n.mu.Unlock()
			}
			n.closeDirect()
			continue
		case err == unix.EAGAIN:
			return 0, n.opErr("read", ErrWouldBlock)
		case err != nil:
			return 0, n.opErr("read", os.NewSyscallError("read", err))
		default:
			return 0, io.EOF
		}
	}
}

// pollerFile returns the duplicate in Go's poller (nil: none was made). Deadlines set on a
// closed one are ignored: the operation reports the close, not the deadline.
func (n *netConn) pollerFile() *os.File {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.df
}

// writeToDirect is WriteTo on a direct connection: Read into one buffer, write it to w.
func (n *netConn) writeToDirect(w io.Writer) (int64, error) {
	buf := make([]byte, 64<<10)
	var total int64
	for {
		k, err := n.Read(buf)
		if k > 0 {
			wk, werr := w.Write(buf[:k])
			total += int64(wk)
			if werr != nil {
				return total, werr
			}
			if wk < k {
				return total, io.ErrShortWrite
			}
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}
