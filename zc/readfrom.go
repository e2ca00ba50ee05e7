package zc

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/rawfd"
	"github.com/zcnet/zcnet/tcpglue"
)

// Conn.ReadFrom: io.ReaderFrom for the off-loop API and the net.Conn face, so io.Copy moves
// bytes the way it does on a *net.TCPConn: sendfile(2) from a regular file, splice(2) from a
// socket, and otherwise reads straight into registered send buffers (one copy, not two). A
// sendfile or splice that finds the socket full waits in Go's poller on a ReadSelf
// connection (readself.go), as net's does, so a thousand stalled senders are not a thousand
// threads; on other connections it waits in poll(2).

const spliceChunk = 1 << 20

// ReadFrom reads r until io.EOF (or an error) and queues what it read for sending, the way
// io.Copy moves bytes on a *net.TCPConn: sendfile(2) from a regular file (from the file's
// offset on, which it moves), splice(2) from a socket (an *os.File, a *net.TCPConn or
// anything with SyscallConn), and otherwise reads straight into send buffers (one copy).
// A sendfile or splice starts once what is queued before it has left, so the stream stays
// in order. It waits for room like Write, bounded by the write deadline (SetWriteDeadline);
// on a ReadSelf connection in Go's poller, otherwise in poll(2) on the calling thread. No
// byte taken from r is lost to the deadline: what it returns is what it took and queued
// (bytes a splice held in its pipe when the deadline passed are queued too). It
// blocks: on a queue goroutine it fails with ErrInvalid (use Send, SendFile or SendData
// there). Bytes moved by sendfile or splice count in Stats.Send.BytesSpliced.
func (c *Conn) ReadFrom(r io.Reader) (int64, error) {
	if c.onLoop() {
		return 0, c.opErr("write", fmt.Errorf("ReadFrom waits, and a queue goroutine must not: %w", ErrInvalid))
	}
	if r == nil {
		return 0, c.opErr("write", fmt.Errorf("nil reader: %w", ErrInvalid))
	}
	if err := c.writeCheck(); err != nil {
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
			total, err, handled = c.sendFile(f, limit)
		}
	} else if sc, ok := r.(syscall.Conn); ok {
		total, err, handled = c.spliceFrom(sc, limit)
	}
	if !handled {
		if lr != nil {
			r = &io.LimitedReader{R: r, N: limit}
		}
		var k int64
		k, err = c.readIntoBuffers(r)
		total += k
	}
	if lr != nil {
		lr.N -= total
	}
	return total, err
}

// writeCheck checks the connection before (and during) a bulk write: not closed, the write
// deadline not passed.
func (c *Conn) writeCheck() error {
	if c.closeRequested() {
		return c.opErr("write", ErrClosed)
	}
	if d := c.writeDeadline(); !d.IsZero() && !time.Now().Before(d) {
		return c.opErr("write", os.ErrDeadlineExceeded)
	}
	return nil
}

// closeRequested reports whether Close ran.
func (c *Conn) closeRequested() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closeReq
}

// readIntoBuffers reads r into send buffers and sends them (one copy).
func (c *Conn) readIntoBuffers(r io.Reader) (int64, error) {
	var total int64
	for {
		if err := c.writeCheck(); err != nil {
			return total, err
		}
		if err := c.waitQueue(c.e.cfg.MaxQueuedBytes); err != nil {
			return total, c.opErr("write", err)
		}
		b, err := c.q.getSendBuf()
		if err != nil {
			if b, err = c.q.waitSendBuf(c.closingChan(), nil, c.writeDeadline); err != nil {
				return total, c.opErr("write", err)
			}
		}
		k, rerr := io.ReadFull(r, b.Bytes())
		if k > 0 {
			if err := c.Send(b, k); err != nil {
				return total, c.opErr("write", err)
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
func (c *Conn) waitQueue(max int) error {
	for {
		c.mu.Lock()
		queued, werr := c.queued, c.werr
		ch := c.spaceLocked()
		c.mu.Unlock()
		if werr != nil {
			return werr
		}
		if queued <= max {
			return nil
		}
		if err := c.waitSpace(ch, nil, c.writeDeadline); err != nil {
			return err
		}
	}
}

// sockErr is a tcpglue error as ReadFrom reports it: the system call's error (an
// *os.SyscallError, or ErrClosed for the connection's closed socket), without the socket
// layer's *tcpglue.OpError around it.
func sockErr(err error) error {
	var oe *tcpglue.OpError
	if errors.As(err, &oe) {
		if errors.Is(oe.Err, ErrClosed) {
			return ErrClosed
		}
		return oe.Err
	}
	return err
}

// sendOut runs op (a sendfile or splice into the connection's socket) until it does not find
// the socket full, and returns what it returned. A direct connection waits for room in Go's
// poller, on its duplicate of the socket (no thread blocked, the poller's write deadline);
// otherwise the thread waits in poll(2) (pollOut). op retries EINTR itself (tcpglue).
func (c *Conn) sendOut(op func() (int, error)) (int, error) {
	if s := c.readSelf(); s != nil {
		var k int
		var err error
		werr := s.rc.Write(func(uintptr) bool {
			k, err = op() // the duplicate is the same socket: its writability is ours
			return !errors.Is(err, unix.EAGAIN)
		})
		if werr != nil {
			if errors.Is(werr, os.ErrDeadlineExceeded) {
				return 0, werr
			}
			return 0, ErrClosed // the duplicate closed: Close, or the engine closed the connection
		}
		if err != nil {
			return 0, sockErr(err)
		}
		return k, nil
	}
	for {
		k, err := op()
		switch {
		case err == nil:
			return k, nil
		case errors.Is(err, unix.EAGAIN):
			if perr := c.pollOut(); perr != nil {
				return 0, perr
			}
			continue
		}
		return 0, sockErr(err)
	}
}

// pollOut waits until the socket is writable or the write deadline passes.
func (c *Conn) pollOut() error {
	timeout := time.Duration(-1)
	if d := c.writeDeadline(); !d.IsZero() {
		timeout = time.Until(d)
		if timeout <= 0 {
			return os.ErrDeadlineExceeded
		}
	}
	// Wake at least every 100 ms to notice a new deadline or a close.
	if timeout < 0 || timeout > 100*time.Millisecond {
		timeout = 100 * time.Millisecond
	}
	_, err := c.sock.WaitWritable(timeout)
	return sockErr(err)
}

// fileLike is an *os.File, or a wrapper of one.
type fileLike interface {
	syscall.Conn
	Stat() (os.FileInfo, error)
}

// sendFile sends a regular file with sendfile(2) straight from the page cache, after what is
// queued has left (the byte stream stays in order). It reads from the file's offset on and
// moves it, like read(2).
func (c *Conn) sendFile(f fileLike, limit int64) (int64, error, bool) {
	if err := c.waitQueue(0); err != nil {
		return 0, c.opErr("write", err), true
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, nil, false
	}
	var total int64
	var serr error
	ctlErr := rc.Read(func(ffd uintptr) bool {
		serr = func() error {
			for limit < 0 || total < limit {
				if err := c.writeCheck(); err != nil {
					return err
				}
				chunk := spliceChunk
				if limit >= 0 {
					chunk = int(min(int64(chunk), limit-total))
				}
				k, err := c.sendOut(func() (int, error) { return c.sock.SendFile(int(ffd), nil, chunk) })
				if k > 0 {
					total += int64(k)
					c.q.ctr.sentSpliced.Add(uint64(k))
				}
				switch {
				case err != nil:
					return err
				case k == 0:
					return nil // end of file
				}
			}
			return nil
		}()
		return true
	})
	if ctlErr != nil {
		return total, ctlErr, true
	}
	if serr != nil {
		return total, c.opErr("write", c.closedOr(wrapNetErr(serr))), true
	}
	return total, nil, true
}

// closedOr is err, or ErrClosed when Close ran meanwhile (the socket failing under a
// sendfile or splice after Close is the close, not a broken pipe).
func (c *Conn) closedOr(err error) error {
	if c.closeRequested() {
		return ErrClosed
	}
	return err
}

// spliceFrom moves bytes from another socket through a pipe with splice(2), never through
// user memory.
func (c *Conn) spliceFrom(sc syscall.Conn, limit int64) (int64, error, bool) {
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, nil, false
	}
	pr, pw, _, err := rawfd.Pipe(spliceChunk) // a pipe of the default size works too
	if err != nil {
		return 0, nil, false
	}
	defer rawfd.Close(pr)
	defer rawfd.Close(pw)
	if err := c.waitQueue(0); err != nil {
		return 0, c.opErr("write", err), true
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
				k, err := rawfd.Splice(int(sfd), pw, chunk)
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
		werr = func() error {
			for inPipe > 0 {
				if err := c.writeCheck(); err != nil {
					return err
				}
				k, err := c.sendOut(func() (int, error) { return c.sock.SpliceFrom(pr, inPipe) })
				if k > 0 {
					inPipe -= k
					total += int64(k)
					c.q.ctr.sentSpliced.Add(uint64(k))
				}
				if err != nil {
					return err
				}
			}
			return nil
		}()
		if werr != nil {
			if inPipe > 0 && errors.Is(werr, os.ErrDeadlineExceeded) {
				// The pipe's bytes were taken from the source: queue them (they are
				// written, as the deadline's contract says) rather than lose them.
				k, err := c.queuePipe(pr, inPipe)
				total += int64(k)
				if err != nil {
					werr = err
				}
			}
			return total, c.opErr("write", c.closedOr(wrapNetErr(werr))), true
		}
	}
	return total, nil, true
}

// queuePipe reads the n bytes left in the pipe pfd into send buffers and queues them (over
// MaxQueuedBytes if need be, as Send does), waiting for buffers without the passed write
// deadline (the connection's end ends the wait: after Close, at the latest when its
// CloseTimeout resets it); it returns how many it queued.
func (c *Conn) queuePipe(pfd, n int) (int, error) {
	queued := 0
	for queued < n {
		b, err := c.q.getSendBuf()
		if err != nil {
			if b, err = c.q.waitSendBuf(c.closingChan(), nil, nil); err != nil {
				return queued, err
			}
		}
		k, err := rawfd.Read(pfd, b.Bytes()[:min(len(b.Bytes()), n-queued)])
		if k <= 0 {
			b.Release()
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			return queued, err
		}
		if err := c.Send(b, k); err != nil {
			return queued, err
		}
		queued += k
	}
	return queued, nil
}

func wrapNetErr(err error) error {
	if errno, ok := err.(unix.Errno); ok {
		return os.NewSyscallError("sendfile", errno)
	}
	return err
}
