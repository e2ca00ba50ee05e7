package tcpglue

import (
	"errors"
	"io"
	"net"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/eintr"
)

// zcReceive is struct tcp_zerocopy_receive from <linux/tcp.h> (64 bytes; the
// kernel accepts shorter prefixes from older callers and the fields after
// copybuf need Linux 5.11+, msg_control 5.14+). Layout is checked by a test.
type zcReceive struct {
	Address       uint64 // in: start of the mapping
	Length        uint32 // in: bytes to map; out: bytes mapped
	RecvSkipHint  uint32 // out: bytes at the head that could not be mapped
	Inq           uint32 // out: bytes left in the receive queue
	Err           int32  // out: pending socket error
	CopybufAddr   uint64 // in: buffer for small or unmappable data
	CopybufLen    int32  // in: its size; out: bytes copied, or -errno
	Flags         uint32 // in: TCP_RECEIVE_ZEROCOPY_FLAG_TLB_CLEAN_HINT
	MsgControl    uint64
	MsgControllen uint64
	MsgFlags      uint32
	Reserved      uint32
}

// tcpReceiveZerocopyFlagTLBCleanHint tells the kernel the window holds no
// stale pages, so it need not zap the range before inserting.
const tcpReceiveZerocopyFlagTLBCleanHint = 0x1

// RecvStats counts what a RecvWindow delivered.
type RecvStats struct {
	MappedBytes uint64 // bytes delivered by mapping socket pages (no copy)
	CopiedBytes uint64 // bytes delivered by copying (copybuf or recv(2))
	Calls       uint64 // TCP_ZEROCOPY_RECEIVE getsockopt calls
}

// RecvResult is what one RecvWindow.Recv delivered. In stream order the
// bytes are Mapped followed by copyBuf[:Copied].
type RecvResult struct {
	// Mapped aliases the window: the next Recv, Release or Close unmaps it.
	// It is read-only memory; writing to it faults.
	Mapped []byte
	// Copied is the number of bytes written to the start of copyBuf.
	Copied int
	// InQueue is how many bytes the kernel still had queued afterwards.
	InQueue int
}

// Len returns the total bytes delivered.
func (r RecvResult) Len() int { return len(r.Mapped) + r.Copied }

// RecvWindow is a per-connection receive window for TCP_ZEROCOPY_RECEIVE
// (Linux 4.18): a read-only mmap of the socket into which the kernel maps the
// pages of received segments instead of copying them.
//
// Pages are mapped only when the received data sits in whole, page-aligned,
// order-0 pages: each segment's payload must be a multiple of the page size
// (on loopback set TCP_MAXSEG to 4108 on both ends: 4096 bytes of payload plus
// 12 bytes of timestamp option) and the sender's fragments must be single
// pages (a MSG_ZEROCOPY or io_uring SEND_ZC sender; on loopback the kernel
// re-copies zero-copy payloads into fresh order-0 pages, which then map). A
// plain copying sender on loopback produces large compound-page fragments,
// and almost everything is copied. Whatever cannot be mapped is copied into
// the caller's buffer, so data is always delivered correctly and in order.
//
// A RecvWindow is not safe for concurrent use. It borrows its Socket: the
// mapping keeps the socket's file alive, so Close the window when done (a
// closed Socket's window still has to be closed). To wake a Recv blocked on a
// blocking socket, close the Socket.
type RecvWindow struct {
	s      *Socket
	mem    []byte
	mapped int // mem[:mapped] holds pages from the last call
	closed bool
	page   int
	stats  RecvStats
}

// NewRecvWindow maps a receive window of size bytes (rounded up to whole
// pages) on a socket; Recv needs it connected. Kernels without TCP mmap
// support (before 4.18) give an error matching ErrNotSupported.
func NewRecvWindow(s *Socket, size int) (*RecvWindow, error) {
	const op = "recv window"
	page := unix.Getpagesize()
	if size <= 0 || size > 1<<30 {
		return nil, opErr(op, -1, nil, &ValueError{Name: "window size", Value: size, Reason: "want 1 byte .. 1 GiB (rounded up to pages)"})
	}
	size = (size + page - 1) &^ (page - 1)
	fd, err := s.incref(op)
	if err != nil {
		return nil, err
	}
	defer s.decref()
	// The kernel refuses writable or executable TCP mappings.
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		if errors.Is(err, unix.ENODEV) {
			return nil, opErr(op, fd, nil, errors.Join(sysErr("mmap", err), ErrNotSupported))
		}
		return nil, opErr(op, fd, nil, sysErr("mmap", err))
	}
	return &RecvWindow{s: s, mem: mem, page: page}, nil
}

// ProbeZeroCopyReceive reports whether this kernel supports
// TCP_ZEROCOPY_RECEIVE: nil if it does, an error matching ErrNotSupported if
// it does not (mmap of TCP sockets needs Linux 4.18), or another error if the
// probe itself failed. It maps one page of an unconnected socket.
func ProbeZeroCopyReceive() error {
	const op = "probe zerocopy receive"
	s, err := NewSocket(unix.AF_INET, true)
	if err != nil {
		return err
	}
	defer s.Close()
	w, err := NewRecvWindow(s, 1)
	if err != nil {
		return err
	}
	defer w.Close()
	zc := zcReceive{Address: uint64(uintptr(unsafe.Pointer(&w.mem[0]))), Length: uint32(len(w.mem))}
	l := uint32(unsafe.Sizeof(zc))
	err = s.Control(func(fd int) error {
		return getsockopt(fd, unix.IPPROTO_TCP, unix.TCP_ZEROCOPY_RECEIVE, unsafe.Pointer(&zc), &l)
	})
	switch {
	case err == nil, errors.Is(err, unix.EIO), errors.Is(err, unix.ENOTCONN):
		return nil
	case errors.Is(err, unix.ENOPROTOOPT), errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.EINVAL):
		return opErr(op, -1, nil, errors.Join(sysErr("getsockopt TCP_ZEROCOPY_RECEIVE", err), ErrNotSupported))
	}
	return opErr(op, -1, nil, sysErr("getsockopt TCP_ZEROCOPY_RECEIVE", err))
}

// Size returns the window size in bytes.
func (w *RecvWindow) Size() int { return len(w.mem) }

// Stats returns the bytes delivered so far, by path.
func (w *RecvWindow) Stats() RecvStats { return w.stats }

// Recv delivers the next bytes of the stream: as many whole pages as the
// kernel can map into the window (returned as Mapped), then up to
// len(copyBuf) bytes copied into copyBuf (Copied). copyBuf must not be empty,
// since data that cannot be mapped is always possible. Mapped pages from the
// previous call are released first.
//
// On a blocking socket Recv waits for data; on a non-blocking one it returns
// an error matching unix.EAGAIN when nothing is queued. At end of stream (the
// kernel answers EIO once the last byte is consumed and the peer has sent
// FIN) it returns io.EOF. A pending socket error (ECONNRESET...) is returned
// wrapped in an *OpError, possibly together with data delivered by the same
// call.
func (w *RecvWindow) Recv(copyBuf []byte) (RecvResult, error) {
	const op = "zerocopy receive"
	if w == nil || w.closed {
		return RecvResult{}, opErr(op, -1, nil, net.ErrClosed)
	}
	if len(copyBuf) == 0 {
		return RecvResult{}, opErr(op, -1, nil, &ValueError{Name: "copy buffer", Value: 0, Reason: "must not be empty"})
	}
	fd, err := w.s.incref(op)
	if err != nil {
		return RecvResult{}, err
	}
	defer w.s.decref()
	for {
		res, err := w.once(fd, copyBuf)
		if err != nil || res.Len() > 0 {
			return res, err
		}
		// Nothing was queued. Peek (consuming nothing, so the stream stays
		// page-aligned) to tell end of stream from "not yet".
		var one [1]byte
		n, perr := recvFlags(fd, one[:], unix.MSG_DONTWAIT|unix.MSG_PEEK)
		switch {
		case perr == nil && n > 0:
			continue // data arrived in between
		case perr == nil:
			if w.s.isClosing() {
				return res, opErr(op, fd, nil, net.ErrClosed)
			}
			return res, io.EOF
		case !errors.Is(perr, unix.EAGAIN):
			return res, opErr(op, fd, nil, w.s.closedOr(sysErr("recvfrom", perr)))
		}
		if w.s.Nonblocking() {
			return res, opErr(op, fd, nil, sysErr("recv", unix.EAGAIN))
		}
		if err := waitFd(fd, unix.POLLIN|unix.POLLRDHUP); err != nil {
			return res, opErr(op, fd, nil, err)
		}
		if w.s.isClosing() {
			return res, opErr(op, fd, nil, net.ErrClosed)
		}
	}
}

// once makes one TCP_ZEROCOPY_RECEIVE call and, if the kernel left
// unmappable bytes at the head, one non-blocking recv(2) into copyBuf. A zero
// result with a nil error means nothing was queued.
func (w *RecvWindow) once(fd int, copyBuf []byte) (RecvResult, error) {
	const op = "zerocopy receive"
	prev := w.mapped
	w.mapped = 0
	// The kernel takes the copy path for everything when the queue fits in
	// copybuf, so offer it less than a page: small tails are copied there and
	// bulk data is mapped.
	cb := min(len(copyBuf), w.page-1)
	zc := zcReceive{
		Address:     uint64(uintptr(unsafe.Pointer(&w.mem[0]))),
		Length:      uint32(len(w.mem)),
		CopybufAddr: uint64(uintptr(unsafe.Pointer(&copyBuf[0]))),
		CopybufLen:  int32(cb),
	}
	if prev == 0 {
		// Nothing is mapped: the kernel can skip zapping the range.
		zc.Flags = tcpReceiveZerocopyFlagTLBCleanHint
	}
	l := uint32(unsafe.Sizeof(zc))
	err := getsockopt(fd, unix.IPPROTO_TCP, unix.TCP_ZEROCOPY_RECEIVE, unsafe.Pointer(&zc), &l)
	runtime.KeepAlive(copyBuf)
	w.stats.Calls++
	if err != nil {
		// Whatever was mapped before is still there: release it.
		w.unmapStale(0, prev)
		switch {
		case errors.Is(err, unix.EIO):
			// EIO means "nothing left and SOCK_DONE": a FIN, or a reset,
			// which only SO_ERROR tells apart.
			if soerr, gerr := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); gerr == nil && soerr != 0 {
				return RecvResult{}, opErr(op, fd, nil, sysErr("recv", unix.Errno(soerr)))
			}
			return RecvResult{}, io.EOF
		case errors.Is(err, unix.ENOPROTOOPT), errors.Is(err, unix.EOPNOTSUPP):
			return RecvResult{}, opErr(op, fd, nil, errors.Join(sysErr("getsockopt TCP_ZEROCOPY_RECEIVE", err), ErrNotSupported))
		}
		return RecvResult{}, opErr(op, fd, nil, sysErr("getsockopt TCP_ZEROCOPY_RECEIVE", err))
	}
	// Older kernels know a shorter struct and say so in l: fields beyond
	// it were not written back and still hold our inputs.
	if l < uint32(unsafe.Offsetof(zc.CopybufLen)+4) {
		zc.CopybufLen = 0 // no copybuf before Linux 5.11
	}
	if l < uint32(unsafe.Offsetof(zc.Err)+4) {
		zc.Err = 0
	}
	if l < uint32(unsafe.Offsetof(zc.Inq)+4) {
		zc.Inq = 0
	}
	mapped := int(zc.Length)
	if mapped > len(w.mem) || mapped%w.page != 0 {
		// Never trust a length we did not ask for.
		mapped = 0
	}
	// The kernel replaced pages in the range it mapped; pages beyond it
	// from the previous call are still mapped and pinned.
	w.unmapStale(mapped, prev)
	w.mapped = mapped
	res := RecvResult{Mapped: w.mem[:mapped:mapped], InQueue: int(zc.Inq)}
	if zc.CopybufLen > 0 && int(zc.CopybufLen) <= cb {
		res.Copied = int(zc.CopybufLen)
	}
	var rerr error
	if zc.CopybufLen < 0 {
		rerr = opErr(op, fd, nil, sysErr("zerocopy copybuf", unix.Errno(-zc.CopybufLen)))
	}
	if zc.Err != 0 && rerr == nil {
		e := zc.Err
		if e < 0 {
			e = -e
		}
		rerr = opErr(op, fd, nil, sysErr("recv", unix.Errno(e)))
	}
	if skip := int(zc.RecvSkipHint); rerr == nil && skip > 0 && res.Copied < len(copyBuf) {
		// Bytes the kernel could not map. Copy exactly those (or what fits)
		// with recv(2): reading further would start the next call in the
		// middle of a page and nothing could be mapped any more.
		n, err := recvFlags(fd, copyBuf[res.Copied:res.Copied+min(skip, len(copyBuf)-res.Copied)], unix.MSG_DONTWAIT)
		switch {
		case err == nil:
			res.Copied += n
		case errors.Is(err, unix.EAGAIN):
		default:
			rerr = opErr(op, fd, nil, sysErr("recvfrom", err))
		}
	}
	w.stats.MappedBytes += uint64(mapped)
	w.stats.CopiedBytes += uint64(res.Copied)
	return res, rerr
}

// recvFlags is the one recv(2) wrapper: it retries EINTR.
func recvFlags(fd int, p []byte, flags int) (int, error) {
	return eintr.Retry1(func() (int, error) {
		n, _, err := unix.Recvfrom(fd, p, flags)
		return n, err
	})
}

// unmapStale releases window pages [from, to) with MADV_DONTNEED.
func (w *RecvWindow) unmapStale(from, to int) {
	if to > from {
		unix.Madvise(w.mem[from:to], unix.MADV_DONTNEED)
	}
}

// Release unmaps the pages delivered by the last Recv (the memory of the
// socket buffer they pin goes back to the kernel). The next Recv does it
// implicitly; call Release when the data has been consumed and the
// connection may sit idle.
func (w *RecvWindow) Release() error {
	if w == nil || w.closed {
		return opErr("zerocopy release", -1, nil, net.ErrClosed)
	}
	if w.mapped > 0 {
		if err := unix.Madvise(w.mem[:w.mapped], unix.MADV_DONTNEED); err != nil {
			return opErr("zerocopy release", -1, nil, sysErr("madvise", err))
		}
		w.mapped = 0
	}
	return nil
}

// Close unmaps the window. It is idempotent; later calls return an *OpError
// wrapping net.ErrClosed. It does not close the Socket.
func (w *RecvWindow) Close() error {
	if w == nil {
		return nil
	}
	if w.closed {
		return opErr("zerocopy close", -1, nil, net.ErrClosed)
	}
	w.closed = true
	w.mapped = 0
	mem := w.mem
	w.mem = nil
	if err := unix.Munmap(mem); err != nil {
		return opErr("zerocopy close", -1, nil, sysErr("munmap", err))
	}
	return nil
}
