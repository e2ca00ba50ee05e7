package zc

import (
	"errors"
	"io"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/tcpglue"
)

// io.ReaderFrom and io.WriterTo for the net.Conn face, so io.Copy moves bytes the way it does
// on a *net.TCPConn: sendfile(2) from a regular file, splice(2) from a socket, and otherwise
// reads straight into registered send buffers (one copy, not two). A sendfile or splice that
// finds the socket full waits in Go's poller on a direct connection (netconn_direct.go), as
// net's does, so a thousand stalled senders are not a thousand threads; on a ring connection
// it waits in poll(2). WriteTo hands the borrowed receive buffers to the writer without an
// intermediate buffer (ring), or reads into one buffer and writes it (direct).

const spliceChunk = 1 << 20

// ReadFrom implements io.ReaderFrom.
func (n *netConn) ReadFrom(r io.Reader) (int64, error) {
	n.wmu.Lock()
	defer n.wmu.Unlock()
	if err := n.writable(); err != nil {
		return 0, err
	}
	limit := int64(-1)
	lr, _ := r.(*io.LimitedReader)
	if lr != nil {
		r, limit = lr.R, lr.N
		if limit <= 0 {
			return 0, nil
		}
	}
	var (
		total   int64
		err     error
		handled bool
	)
	// io.Copy reaches us with *os.File or *net.TCPConn wrapped (their WriteTo hides itself
	// and calls io.Copy): look at what they can do, not at their type.
	if f, ok := r.(fileLike); ok {
		if fi, serr := f.Stat(); serr == nil && fi.Mode().IsRegular() {
			total, err, handled = n.sendFile(f, limit)
		}
	} else if sc, ok := r.(syscall.Conn); ok {
		total, err, handled = n.spliceFrom(sc, limit)
	}
	if !handled {
		if lr != nil {
			r = &io.LimitedReader{R: r, N: limit}
		}
		var k int64
		k, err = n.readIntoBuffers(r)
		total += k
	}
	if lr != nil {
		lr.N -= total
	}
	return total, err
}

// writable checks the connection before a bulk write.
func (n *netConn) writable() error {
	if n.isClosed() {
		return n.opErr("write", ErrClosed)
	}
	if d := deadlineOf(&n.wdl); !d.IsZero() && !time.Now().Before(d) {
		return n.opErr("write", os.ErrDeadlineExceeded)
	}
	return nil
}

// readIntoBuffers reads r into send buffers and sends them (one copy).
func (n *netConn) readIntoBuffers(r io.Reader) (int64, error) {
	var total int64
	for {
		if err := n.writable(); err != nil {
			return total, err
		}
		if err := n.waitQueue(n.c.e.cfg.MaxQueuedBytes); err != nil {
			return total, n.opErr("write", err)
		}
		b, err := n.c.q.getSendBuf()
		if err != nil {
			if b, err = n.c.q.waitSendBuf(n.c.doneChan(), nil, func() time.Time { return deadlineOf(&n.wdl) }); err != nil {
				return total, n.opErr("write", err)
			}
		}
		k, rerr := io.ReadFull(r, b.Bytes())
		if k > 0 {
			if err := n.c.Send(b, k); err != nil {
				return total, n.opErr("write", err)
			}
			total += int64(k)
		} else {
			b.Release()
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			return total, nil
		}
		if rerr != nil {
			return total, rerr
		}
	}
}

// waitQueue waits until at most max bytes are queued on the connection (the write deadline
// applies).
func (n *netConn) waitQueue(max int) error {
	for {
		n.c.mu.Lock()
		queued, werr := n.c.queued, n.c.werr
		ch := n.c.spaceLocked()
		n.c.mu.Unlock()
		if werr != nil {
			return werr
		}
		if queued <= max {
			return nil
		}
		if err := n.c.waitSpace(ch, nil, func() time.Time { return deadlineOf(&n.wdl) }); err != nil {
			return err
		}
	}
}

// rawFD runs fn with the connection's socket descriptor held (it cannot be closed meanwhile).
func (n *netConn) rawFD(fn func(fd int) error) error {
	err := n.c.sock.Control(fn)
	var oe *tcpglue.OpError
	if errors.As(err, &oe) && oe.Op == "control" {
		return ErrClosed
	}
	return err
}

// sendOut runs op (a sendfile or splice into the socket) until it does not find the socket
// full, and returns what it returned. A direct connection waits for room in Go's poller, on
// its duplicate of the socket (no thread blocked, the poller's write deadline); otherwise
// the thread waits in poll(2) (pollOut).
func (n *netConn) sendOut(fd int, op func(fd int) (int, error)) (int, error) {
	if n.drc != nil {
		var k int
		var err error
		werr := n.drc.Write(func(sfd uintptr) bool {
			for {
				k, err = op(int(sfd))
				if err != unix.EINTR {
					break
				}
			}
			return err != unix.EAGAIN
		})
		if werr != nil {
			if errors.Is(werr, os.ErrDeadlineExceeded) {
				return 0, werr
			}
			return 0, ErrClosed // the duplicate closed: Close, or the engine closed the connection
		}
		if err != nil {
			k = 0
		}
		return k, err
	}
	for {
		k, err := op(fd)
		switch err {
		case nil:
			return k, nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			if perr := n.pollOut(fd); perr != nil {
				return 0, perr
			}
			continue
		}
		return 0, err
	}
}

// pollOut waits until fd is writable or the write deadline passes.
func (n *netConn) pollOut(fd int) error {
	timeout := -1
	if d := deadlineOf(&n.wdl); !d.IsZero() {
		left := time.Until(d)
		if left <= 0 {
			return os.ErrDeadlineExceeded
		}
		timeout = int(left/time.Millisecond) + 1
	}
	// Wake at least every 100 ms to notice a new deadline or a close.
	if timeout < 0 || timeout > 100 {
		timeout = 100
	}
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
	_, err := unix.Poll(pfd, timeout)
	if err != nil && err != unix.EINTR {
		return err
	}
	if pfd[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 {
		return unix.EPIPE
	}
	return nil
}

// fileLike is an *os.File, or a wrapper of one.
type fileLike interface {
	syscall.Conn
	Stat() (os.FileInfo, error)
}

// sendFile sends a regular file with sendfile(2) straight from the page cache, after what is
// queued has left (the byte stream stays in order). It reads from the file's offset on and
// moves it, like read(2).
func (n *netConn) sendFile(f fileLike, limit int64) (int64, error, bool) {
	if err := n.waitQueue(0); err != nil {
		return 0, n.opErr("write", err), true
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, nil, false
	}
	var total int64
	var serr error
	ctlErr := rc.Read(func(ffd uintptr) bool {
		serr = n.rawFD(func(fd int) error {
			for limit < 0 || total < limit {
				if err := n.writable(); err != nil {
					return err
				}
				chunk := spliceChunk
				if limit >= 0 {
					chunk = int(min(int64(chunk), limit-total))
				}
				k, err := n.sendOut(fd, func(sfd int) (int, error) { return unix.Sendfile(sfd, int(ffd), nil, chunk) })
				if k > 0 {
					total += int64(k)
					n.c.q.ctr.sentSpliced.Add(uint64(k))
				}
				switch {
				case err != nil:
					return err
				case k == 0:
					return nil // end of file
				}
			}
			return nil
		})
		return true
	})
	if ctlErr != nil {
		return total, ctlErr, true
	}
	if serr != nil {
		return total, n.opErr("write", n.closedOr(wrapNetErr(serr))), true
	}
	return total, nil, true
}

// closedOr is err, or ErrClosed when Close ran meanwhile (the socket failing under a
// sendfile or splice after Close is the close, not a broken pipe).
func (n *netConn) closedOr(err error) error {
	if n.isClosed() {
		return ErrClosed
	}
	return err
}

// spliceFrom moves bytes from another socket through a pipe with splice(2), never through
// user memory.
func (n *netConn) spliceFrom(sc syscall.Conn, limit int64) (int64, error, bool) {
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, nil, false
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return 0, nil, false
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, spliceChunk)
	if err := n.waitQueue(0); err != nil {
		return 0, n.opErr("write", err), true
	}
	var total int64
	inPipe := 0
	var rerr, werr error
	eof := false
	for !eof || inPipe > 0 {
		// Fill the pipe from the source (the source's poller waits for it to be readable).
		if !eof && inPipe == 0 {
			chunk := spliceChunk
			if limit >= 0 {
				if total >= limit {
					break
				}
				chunk = int(min(int64(chunk), limit-total))
			}
			cerr := rc.Read(func(sfd uintptr) bool {
				k, err := unix.Splice(int(sfd), nil, p[1], nil, chunk, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
				switch {
				case err == unix.EAGAIN:
					return false // wait for the source
				case err != nil:
					rerr = err
				case k == 0:
					eof = true
				default:
					inPipe += int(k)
				}
				return true
			})
			if cerr != nil {
				rerr = cerr
			}
			if rerr != nil {
				if errors.Is(rerr, unix.EINVAL) && total == 0 && inPipe == 0 {
					return 0, nil, false // not spliceable: copy
				}
				return total, rerr, true
			}
		}
		// Drain the pipe into our socket.
		werr = n.rawFD(func(fd int) error {
			for inPipe > 0 {
				if err := n.writable(); err != nil {
					return err
				}
				k, err := n.sendOut(fd, func(sfd int) (int, error) {
					k, err := unix.Splice(p[0], nil, sfd, nil, inPipe, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
					return int(k), err
				})
				if k > 0 {
					inPipe -= k
					total += int64(k)
					n.c.q.ctr.sentSpliced.Add(uint64(k))
				}
				if err != nil {
					return err
				}
			}
			return nil
		})
		if werr != nil {
			return total, n.opErr("write", n.closedOr(wrapNetErr(werr))), true
		}
	}
	return total, nil, true
}

func wrapNetErr(err error) error {
	if errno, ok := err.(unix.Errno); ok {
		return os.NewSyscallError("sendfile", errno)
	}
	return err
}

// WriteTo implements io.WriterTo: the received buffers go to w as they are, until EOF.
func (n *netConn) WriteTo(w io.Writer) (int64, error) {
	if n.direct {
		return n.writeToDirect(w)
	}
	var total int64
	for {
		n.mu.Lock()
		if n.closed {
			n.mu.Unlock()
			return total, n.opErr("read", ErrClosed)
		}
		if len(n.rq) > 0 {
			d := n.rq[0]
			off := n.roff
			n.rq[0] = Data{}
			n.rq = n.rq[1:]
			n.roff = 0
			n.mu.Unlock()
			b := d.Bytes()
			var err error
			if b != nil && off < len(b) {
				var k int
				k, err = w.Write(b[off:])
				total += int64(k)
			}
			d.Release()
			if err != nil {
				return total, err
			}
			continue
		}
		rerr := n.rerr
		n.mu.Unlock()
		if rerr == io.EOF {
			return total, nil
		}
		if rerr != nil {
			return total, n.opErr("read", rerr)
		}
		if n.c.onLoop() {
			return total, n.opErr("read", ErrWouldBlock)
		}
		if err := n.wait(n.readyCh, &n.rdl); err != nil {
			return total, n.opErr("read", err)
		}
	}
}
