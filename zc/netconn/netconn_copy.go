package netconn

import (
	"github.com/zcnet/zcnet/zc"

	"errors"
	"io"
	"net"
)

// ReadFrom implements io.ReaderFrom (zc.Conn.ReadFrom: sendfile from a regular file, splice
// from a socket, otherwise reads into send buffers), so io.Copy to the face moves bytes as it
// does to a *net.TCPConn.
func (n *netConn) ReadFrom(r io.Reader) (int64, error) {
	n.wmu.Lock()
	defer n.wmu.Unlock()
	if n.isClosed() {
		return 0, n.opErr("write", net.ErrClosed)
	}
	k, err := n.c.ReadFrom(r)
	if err != nil {
		var oe *zc.OpError
		if errors.As(err, &oe) {
			return k, n.writeErr(err)
		}
		return k, err // the source's error
	}
	return k, nil
}

// WriteTo implements io.WriterTo: the received buffers go to w as they are, until EOF.
func (n *netConn) WriteTo(w io.Writer) (int64, error) {
	if n.direct {
		return n.writeToDirect(w)
	}
	var total int64
	for {
		n.mu.Lock()
		if n.closed.Load() {
			n.mu.Unlock()
			return total, n.opErr("read", zc.ErrClosed)
		}
		if len(n.rq) > 0 {
			d := n.rq[0]
			off := n.roff
			n.rq[0] = zc.Data{}
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
		if n.c.OnQueue() {
			return total, n.opErr("read", zc.ErrWouldBlock)
		}
		if err := n.wait(n.readyCh, &n.rdl); err != nil {
			return total, n.opErr("read", err)
		}
	}
}
