package zc

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/internal/rawfd"
)

// SendFile queues n bytes of f, from offset off, for sending after what is already queued
// (Send, SendData, Write) and before what is queued later. The bytes go from the page cache
// to the socket with sendfile(2) on the connection's queue goroutine, never through user
// memory, whenever the socket has room (on every backend: the queue waits for writability
// with a poll through its ring, or its epoll). Stats.Send.BytesFile counts them.
//
// SendFile duplicates f's descriptor: f may be closed (or its offset moved) once SendFile
// returns, and the bytes still go out. The range is checked against the file's size now: a
// range beyond the end fails with an error matching both ErrInvalid and io.ErrUnexpectedEOF,
// and nothing is queued. A file that shrinks while it is being sent cannot deliver what was
// promised: the connection then fails (OnClose's error matches io.ErrUnexpectedEOF), since
// the peer's stream would be short. The bytes are the page cache's as they go out (as with
// sendfile(2) anywhere): a file written or truncated meanwhile may send its new content.
//
// Like Send, SendFile does not block: the n bytes count toward MaxQueuedBytes at once (a
// file larger than it queues all the same), and OnWritable follows once less than half of
// MaxQueuedBytes is queued, so a handler streams a large file in pieces from OnWritable
// (or sends it in one call and waits for OnWritable before queuing more). It may be called
// from any goroutine. It fails with ErrInvalid for a nil or closed file, a file that is not
// a regular file (a directory, a pipe) or is not open for reading (os.O_WRONLY), or a
// negative off or n; with ErrEmpty for n == 0; with ErrClosed after
// Close or CloseWrite.
func (c *Conn) SendFile(f *os.File, off, n int64) error {
	switch {
	case f == nil:
		return c.opErr("sendfile", fmt.Errorf("nil file: %w", ErrInvalid))
	case off < 0 || n < 0:
		return c.opErr("sendfile", fmt.Errorf("negative offset %d or length %d: %w", off, n, ErrInvalid))
	case n == 0:
		return c.opErr("sendfile", ErrEmpty)
	}
	c.mu.Lock()
	werr := c.werr
	c.mu.Unlock()
	if werr != nil {
		if werr == errWriteClosed {
			werr = ErrClosed
		}
		return c.opErr("sendfile", werr)
	}
	fd, size, err := dupFile(f)
	if err != nil {
		return c.opErr("sendfile", err)
	}
	if off > size || n > size-off {
		rawfd.Close(fd)
		return c.opErr("sendfile", fmt.Errorf("bytes %d..%d beyond the file's %d (%w): %w", off, off+n, size, io.ErrUnexpectedEOF, ErrInvalid))
	}
	ref := &fileRef{fd: fd}
	// One segment per GiB (a segment's length is an int32).
	const maxSeg = 1 << 30
	var segs []seg
	for left, o := n, off; left > 0; {
		k := min(left, maxSeg)
		segs = append(segs, fileRangeSeg(&fileSeg{c: c, ref: ref, base: o}, int32(k)))
		left -= k
		o += k
	}
	ref.refs.Store(int32(len(segs)))
	for i, s := range segs {
		if err := c.enqueue(s); err != nil {
			for _, r := range segs[i+1:] {
				r.own.(*fileSeg).release(r.n)
			}
			return err
		}
	}
	return nil
}

// dupFile duplicates f's descriptor and returns it with the file's size.
func dupFile(f *os.File) (int, int64, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return -1, 0, fmt.Errorf("%w: %w", ErrInvalid, err) // a nil or closed file
	}
	closedErr := func(err error) error {
		return fmt.Errorf("closed file (%w, %w): %w", err, os.ErrClosed, ErrInvalid)
	}
	fd := -1
	var size int64
	cerr := rc.Control(func(s uintptr) {
		var mode uint32
		var fl int
		if mode, size, fl, err = rawfd.FileInfo(int(s)); err != nil {
			return
		}
		if mode != unix.S_IFREG {
			err = fmt.Errorf("%s is not a regular file: %w", f.Name(), ErrInvalid)
			return
		}
		// sendfile(2) reads the file: one opened write-only (or O_PATH) would fail only
		// later, on the queue, with EBADF, after the call said it was queued.
		if fl&unix.O_ACCMODE == unix.O_WRONLY || fl&unix.O_PATH != 0 {
			err = fmt.Errorf("%s is not open for reading: %w", f.Name(), ErrInvalid)
			return
		}
		fd, err = rawfd.Dup(int(s))
	})
	if cerr != nil {
		return -1, 0, closedErr(cerr)
	}
	if err != nil {
		return -1, 0, err
	}
	return fd, size, nil
}

// fileRef is a SendFile's duplicated descriptor, shared by its segments.
type fileRef struct {
	fd   int
	refs atomic.Int32
}

func (r *fileRef) put() {
	if r.refs.Add(-1) == 0 {
		rawfd.Close(r.fd)
	}
}

// fileSeg is the descriptor part of a seg: bytes base+seg.off .. base+seg.n of a file, or
// (pipe set) the seg.n bytes a splice relay's pipe holds for this connection. The core keeps
// such a segment alone at the head of the connection's pending sends (takeWork), so a
// backend's send never sees one; sendHead moves it.
type fileSeg struct {
	c        *Conn
	ref      *fileRef // a file (nil for a pipe)
	pipe     *pipeSeg // a relay's pipe (nil for a file)
	base     int64
	w        sockWait // waiting for room in the socket
	released bool
}

// pipeSeg is a splice relay's pipe handed to its destination connection when the relay
// stopped with bytes in it (splice_relay.go: handOver): the connection sends them with
// splice(2) like a SendFile range, so a graceful close lets them out, and an abort (or
// CloseTimeout) drops them: RelayStats.Lost counts those.
type pipeSeg struct {
	p       pipePair
	home    *queue // the relay's queue, whose counters hold the pipe
	total   *atomic.Uint64
	spliced *atomic.Uint64
	st      *RelayStats
}

// sendFileChunk bounds one sendfile(2) call, and sendFileTurn the bytes one turn of the
// loop sends before it serves other connections.
const (
	sendFileChunk = 1 << 20
	sendFileTurn  = 4 << 20
)

// sendHead sends the file segment at the head of c.tx.pend (loop only).
func (fs *fileSeg) sendHead(c *Conn) {
	s := &c.tx.pend[0]
	if fs.w.armed() {
		return // the socket's writability brings us back
	}
	moved := 0
	for s.off < s.n {
		if c.st.SockClosed() {
			return
		}
		if moved >= sendFileTurn {
			c.q.Post(c.pump)
			return
		}
		if c.tls != nil && !c.tlsRekey() {
			return // a KeyUpdate waits for room (its wait for writability pumps), or failed
		}
		chunk := int(min(s.n-s.off, sendFileChunk))
		if m := c.tlsSendCap(); m >= 0 {
			chunk = min(chunk, m)
		}
		off := fs.base + int64(s.off)
		var k int
		var err error
		if fs.pipe != nil {
			k, err = c.sock.SpliceFrom(fs.pipe.p.r, chunk)
		} else {
			k, err = c.sock.SendFile(fs.ref.fd, &off, chunk)
		}
		switch {
		case errors.Is(err, unix.EAGAIN):
			if err := fs.wait(); err != nil {
				c.fail(c.opErr("sendfile", err))
			}
			return
		case err != nil:
			c.fail(c.opErr("sendfile", err))
			return
		case k == 0 && fs.pipe != nil:
			// The pipe holds seg.n bytes and its write end is open: not reached.
			c.fail(c.opErr("relay", fmt.Errorf("the relay's pipe ended %d bytes early: %w", s.n-s.off, io.ErrUnexpectedEOF)))
			return
		case k == 0:
			c.fail(c.opErr("sendfile", fmt.Errorf("the file ended at byte %d, %d bytes before the range sent: %w",
				off, s.n-s.off, io.ErrUnexpectedEOF)))
			return
		}
		s.off += int32(k)
		moved += k
		if ps := fs.pipe; ps != nil {
			ps.total.Add(uint64(k))
			ps.spliced.Add(uint64(k))
			c.q.ctr.relaySpliced.Add(uint64(k))
			c.q.ctr.relaySpliceCalls.Add(1)
		} else {
			c.q.ctr.fileSent.Add(uint64(k))
			c.q.ctr.fileSendOps.Add(1)
		}
		c.sentBytes(k)
	}
	c.finishSeg(c.popPend())
	// OnWritable and the next segments from the loop, not from inside SendFile's caller.
	c.q.MarkDirty((*fileDone)(c))
}

type fileDone Conn

func (f *fileDone) Flush(*loop.Queue) {
	c := (*Conn)(f)
	if !c.ended() {
		c.sendProgress()
	}
}

// wait arms a one-shot wait for room in the socket (loop only): an epoll registration of a
// duplicate of the connection's descriptor in the queue's watch epoll (the plain and shim
// backends' own; on io_uring the private one whose readiness the ring reports, shared with
// the queue's splice relays, so that many waiting sends cost one ring operation per batch),
// or, where that epoll could not be made, a POLL_ADD through the ring per wait (sockWait).
func (fs *fileSeg) wait() error { return fs.w.arm(fs.c, fs, tagFileOut) }

// OnEvent: the socket has room (or the wait was cancelled).
func (fs *fileSeg) OnEvent(_ *loop.Queue, ev loop.Event) {
	c := fs.c
	if fs.w.fired(c, ev) && !fs.released && !c.ended() && !c.st.SockClosed() {
		c.tx.pend[0].own.(*fileSeg).sendHead(c) // the head segment, as the core's pump does
	}
	if c.inClose() {
		c.advanceClose()
	}
}

// segBytes, segDone and countsDrops make a file segment a fileMover (sendHead sends it).
func (fs *fileSeg) segBytes() []byte { return nil }

func (fs *fileSeg) segDone(_ *Conn, s seg, _ bool) { fs.release(s.n - s.off) }

// countsDrops: a relay's pipe counts what a drop loses (pipeSeg.release, RelayStats.Lost).
func (fs *fileSeg) countsDrops() bool { return fs.pipe != nil }

// release ends the segment (sent, or dropped by a close with left bytes unsent): the wait
// is cancelled, the duplicates closed (loop only, or before the loop saw the segment). A
// relay's pipe is closed, and bytes it still held count as lost.
func (fs *fileSeg) release(left int32) {
	if fs.released {
		return
	}
	fs.released = true
	fs.w.release(fs.c)
	if ps := fs.pipe; ps != nil {
		if left > 0 {
			ps.st.lose(uint64(left), fs.c.opErr("relay", fmt.Errorf("its connection closed before they were sent: %w", ErrClosed)))
		}
		closePipe(ps.home, ps.p)
		return
	}
	fs.ref.put()
}
