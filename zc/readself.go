package zc

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/rawfd"
	"github.com/zcnet/zcnet/zc/internal/connstate"
)

// Reading the socket yourself (ListenOptions.ReadSelf, DialOptions.ReadSelf): Conn.Read
// calls read(2) on the caller's goroutine and waits for readability in Go's own poller, as
// a *net.TCPConn's Read does, instead of the queue receiving into its ring. Read names its
// destination, so the cheapest thing it can do is one copy, kernel to p, with no hand-off
// between the reading goroutine and the queue's locked thread. The net.Conn face reads
// this way by default.
//
// The poller needs a descriptor of its own (registering the queue's would hand its closing
// to an *os.File): the connection keeps a duplicate, one more descriptor per connection.
// The receive ring is never armed for such a connection (pause reason pauseSelfRead, set
// before the loop first sees it), so the two never race for the socket's bytes.

// selfReader is a ReadSelf connection's duplicate of its socket in Go's poller.
type selfReader struct {
	f      atomic.Pointer[os.File] // nil once closed
	rc     syscall.RawConn         // f's, fixed
	closed atomic.Bool             // Conn.Close ran: Read reports ErrClosed
	ended  atomic.Bool             // end is set
	// end: the engine finished the connection (nil: it has not). What the kernel had
	// received stays readable through the duplicate; after it, Read returns end (io.EOF
	// when the stream's end was read). Under mu.
	mu  sync.Mutex
	end error
	// timeout is Read's deadline error, made once: net/http ends a background Read with a
	// deadline on every request.
	timeout atomic.Pointer[OpError]

	// One Read at a time (the poller serializes them anyway) passes its slice and gets its
	// result through these, so that the callbacks the poller runs are made once, not per
	// Read (a closure handed to RawConn escapes: three allocations a Read).
	rmu  sync.Mutex
	rp   []byte
	rk   int
	rerr error
	c    *Conn
	rfn  func(fd uintptr) bool // readStep
	cfn  func(fd uintptr)      // readNow
}

// readStep is the poller's Read callback: read once; wait (false) on EAGAIN unless this is
// a queue goroutine, which must never wait (asked only then: reading what is there is safe
// anywhere).
func (s *selfReader) readStep(fd uintptr) bool {
	s.rk, s.rerr = readOnce(fd, s.rp)
	return s.rerr != unix.EAGAIN || s.c.onLoop()
}

// readNow reads once without waiting (after the engine closed the connection).
func (s *selfReader) readNow(fd uintptr) { s.rk, s.rerr = readOnce(fd, s.rp) }

// errClosedByEngine is what Read returns once the engine closed a connection the
// application had not closed (after what had arrived): it matches net.ErrClosed.
var errClosedByEngine = fmt.Errorf("the engine closed the connection: %w", net.ErrClosed)

// errNotReadSelf: Read or SetReadDeadline on a connection that zc receives for.
var errNotReadSelf = fmt.Errorf("the connection was not opened with ReadSelf (its bytes arrive as Data): %w", ErrInvalid)

// dupFD duplicates a descriptor (a variable: tests make it fail as EMFILE would).
var dupFD = rawfd.Dup

// readSelfSupported says why a ReadSelf connection cannot be made on e (nil: it can).
func init() {
	features.readSelfCheck = (*Engine).readSelfSupported
	features.readSelfOpen = (*Conn).openSelf
}

// readSelf is c's ReadSelf duplicate (nil: c was opened without ReadSelf).
func (c *Conn) readSelf() *selfReader {
	s, _ := c.self.(*selfReader)
	return s
}

func (e *Engine) readSelfSupported() error {
	if len(e.queues) == 0 || !e.queues[0].be.directOK() {
		return &NotSupportedError{What: "ReadSelf on the " + e.backend.String() + " backend",
			Need: "the io_uring or plain backend (the zcshim module owns its sockets' receive queues)"}
	}
	if e.cfg.RecvPath == RecvZcrx {
		return &NotSupportedError{What: "ReadSelf with RecvZcrx",
			Need: "RecvRing or RecvMapped (zcrx bytes are not readable with read(2))"}
	}
	return nil
}

// openSelf makes c a ReadSelf connection: the receive ring is never armed, and the
// socket's duplicate goes into Go's poller. Before the loop first sees c.
func (c *Conn) openSelf() error {
	dfd, err := dupFD(c.fd)
	if err != nil {
		return os.NewSyscallError("fcntl(F_DUPFD_CLOEXEC)", err)
	}
	f := os.NewFile(uintptr(dfd), "zc-readself")
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
	s := &selfReader{rc: rc, c: c}
	s.rfn, s.cfn = s.readStep, s.readNow
	s.f.Store(f)
	c.self = s
	c.rd.Take(connstate.ReadSelf) // a new connection: nobody else reads it yet
	c.paused |= pauseSelfRead
	c.pausedAt.Store(c.paused)
	return nil
}

// closeFile closes the duplicate once; a Read waiting in the poller wakes.
func (s *selfReader) closeFile() {
	if f := s.f.Swap(nil); f != nil {
		f.Close()
	}
}

// appClosed runs at Conn.Close: Read reports ErrClosed from now on.
func (s *selfReader) appClosed() {
	s.closed.Store(true)
	s.closeFile()
}

// finished runs on the loop when the connection finished: the queue closed its descriptor,
// the duplicate keeps the socket. Bytes the kernel had received stay readable, as they would
// in the ring's buffers; the peer sees our side close now (SHUT_WR). A socket with nothing to
// read is released at once; one with bytes is released by the Read that finds its end, or
// by Close.
func (s *selfReader) finished(err error) {
	if err == nil {
		err = errClosedByEngine
	}
	s.mu.Lock()
	if s.end == nil {
		s.end = err
	}
	s.mu.Unlock()
	s.ended.Store(true)
	f, rc := s.f.Load(), s.rc
	if f == nil {
		return
	}
	pending := 0
	rc.Control(func(fd uintptr) {
		pending, _ = rawfd.InQueue(int(fd))
		if pending > 0 {
			rawfd.ShutdownWrite(int(fd))
		}
	})
	if pending <= 0 {
		s.closeFile()
	}
}

func readOnce(fd uintptr, p []byte) (int, error) { return rawfd.Read(int(fd), p) }

// Read reads what has arrived into p, on the calling goroutine, for a connection opened
// with ReadSelf (ListenOptions, DialOptions); on any other it fails with ErrInvalid. It
// waits in Go's poller until bytes arrive, the read deadline (SetReadDeadline) passes
// (os.ErrDeadlineExceeded) or the connection closes, and returns io.EOF at the peer's end.
// On a queue goroutine it never waits: with nothing to read it returns ErrWouldBlock, and
// no event follows (a ReadSelf connection gets no OnData): read it from a goroutine of your
// own. After Close it returns ErrClosed. When the engine closes the connection (Engine.Close,
// a reset, CloseTimeout) what the kernel had received is still returned, then the close's
// error (matching net.ErrClosed), or io.EOF when the peer's end was among it. The bytes
// count in ConnStats.BytesRecv and Stats.Recv.BytesDirect.
func (c *Conn) Read(p []byte) (int, error) {
	s := c.readSelf()
	if s == nil {
		return 0, c.opErr("read", errNotReadSelf)
	}
	rc := s.rc
	for {
		if s.closed.Load() {
			return 0, c.opErr("read", ErrClosed)
		}
		var end error
		if s.ended.Load() {
			s.mu.Lock()
			end = s.end
			s.mu.Unlock()
		}
		if s.f.Load() == nil {
			if end == io.EOF {
				return 0, io.EOF
			}
			return 0, c.opErr("read", end)
		}
		if len(p) == 0 {
			return 0, nil
		}
		var perr error
		if !s.rmu.TryLock() {
			// Another goroutine reads (waiting in the poller, perhaps for long): a queue
			// goroutine must not wait behind it.
			if c.onLoop() {
				return 0, c.opErr("read", ErrWouldBlock)
			}
			s.rmu.Lock()
		}
		s.rp, s.rk, s.rerr = p, 0, nil
		if end != nil {
			// The engine closed the connection: what is left to read is all there is.
			perr = rc.Control(s.cfn)
		} else {
			perr = rc.Read(s.rfn) // waits in the poller while there is nothing to read
		}
		k, err := s.rk, s.rerr
		s.rp = nil
		s.rmu.Unlock()
		if perr != nil {
			if errors.Is(perr, os.ErrDeadlineExceeded) {
				return 0, s.timeoutErr(c)
			}
			if s.closed.Load() || s.ended.Load() || s.f.Load() == nil {
				continue // closed under us: report why
			}
			return 0, c.opErr("read", perr)
		}
		switch {
		case k > 0:
			c.ctr.recv.Add(uint64(k))
			c.q.ctr.recvDirect.Add(uint64(k))
			return k, nil
		case end != nil:
			// The rest of the stream after the engine's close: its end is the end of the
			// connection. The peer's end (EOF) reads as io.EOF; bytes that had not arrived
			// (EAGAIN) are lost with the close, which Read says (ErrClosed), not io.EOF.
			if err == nil && end == errClosedByEngine {
				s.mu.Lock()
				s.end = io.EOF
				s.mu.Unlock()
			}
			s.closeFile()
			continue
		case err == unix.EAGAIN:
			return 0, c.opErr("read", ErrWouldBlock)
		case err != nil:
			return 0, c.opErr("read", os.NewSyscallError("read", err))
		default:
			return 0, io.EOF
		}
	}
}

// SetReadDeadline sets the deadline of Read's waits (the zero time: none), for a connection
// opened with ReadSelf; on any other it fails with ErrInvalid (the event-loop API's receive
// deadlines are timers: AfterFunc). A Read waiting meanwhile takes the new deadline. After
// Close it fails with ErrClosed.
func (c *Conn) SetReadDeadline(t time.Time) error {
	s := c.readSelf()
	if s == nil {
		return c.opErr("set", errNotReadSelf)
	}
	if s.closed.Load() {
		return c.opErr("set", ErrClosed)
	}
	if f := s.f.Load(); f != nil {
		f.SetReadDeadline(t) // the poller wakes its waiting readers itself
	}
	return nil
}

// timeoutErr is Read's error when its deadline passed, made on first use.
func (s *selfReader) timeoutErr(c *Conn) error {
	if e := s.timeout.Load(); e != nil {
		return e
	}
	err := c.opErr("read", os.ErrDeadlineExceeded)
	if e, ok := err.(*OpError); ok {
		s.timeout.Store(e)
	}
	return err
}

// SetWriteDeadline sets the deadline of the waits of Write, WriteContext and ReadFrom (the
// zero time: none): once it passes they return what they queued with an error matching
// os.ErrDeadlineExceeded, and a Write that starts after it fails at once, as a net.Conn's
// does. A writer waiting meanwhile takes the new deadline. Bytes reported written are
// queued and will be sent. After Close (or once the connection closed) it fails with
// ErrClosed.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if c.closedAt.Load() || c.closeRequested() {
		return c.opErr("set", ErrClosed)
	}
	if cur := c.wdl.Load(); (cur == nil && t.IsZero()) || (cur != nil && cur.Equal(t)) {
		return nil // unchanged (net/http clears it on every request)
	}
	dl := t // a copy made here, not &t: t would go to the heap on every call, unchanged ones too
	c.wdl.Store(&dl)
	c.wakeWriters()
	if s := c.readSelf(); s != nil {
		if f := s.f.Load(); f != nil {
			f.SetWriteDeadline(t)
		}
	}
	return nil
}

// wakeWriters wakes writers blocked in Write (a deadline changed).
func (c *Conn) wakeWriters() {
	c.mu.Lock()
	ch := c.spaceCh
	c.mu.Unlock()
	if ch != nil {
		c.Wake(ch)
	}
}

// OnQueue reports whether the calling goroutine is one of the engine's queue goroutines
// (where handlers, Post'ed functions and timers run), on which nothing may block: code
// that may run there as well as elsewhere asks it before waiting.
func (c *Conn) OnQueue() bool { return c.onLoop() }

// Wake sends on ch without blocking (a wake-up channel: a capacity of 1 is enough) and, on a
// queue goroutine, makes that queue let the woken goroutine run before it next waits in the
// kernel. A handler that hands work to a goroutine of its own wakes it this way: after a
// bare channel send the goroutine may wait for Go's scheduler to notice it (up to ~10 ms)
// while the queue goroutine keeps its thread.
func (c *Conn) Wake(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
	if c.q.MayBeOnLoop() {
		// Running, so perhaps on it: ask for the yield without the system call that would
		// tell (a yield asked from elsewhere costs that turn one Gosched, nothing more).
		c.q.YieldSoon()
	}
}
