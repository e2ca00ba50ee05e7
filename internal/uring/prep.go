package uring

import "unsafe"

// SQE preparation, one method per operation, named after liburing's io_uring_prep_* helpers.
// Addresses are passed as uintptr: the memory must stay valid and unmoved until the kernel is
// done with it (see the package documentation).

func (s *SQE) prepRW(op uint8, fd int32, addr uintptr, n uint32, off uint64) {
	s.Opcode = op
	s.Fd = fd
	s.Addr = uint64(addr)
	s.Len = n
	s.Off = off
}

// PrepNop prepares a no-op.
func (s *SQE) PrepNop() { s.Opcode = OpNop }

// PrepSend prepares a copying send(2) of n bytes at addr.
func (s *SQE) PrepSend(fd int32, addr uintptr, n uint32, msgFlags uint32) {
	s.prepRW(OpSend, fd, addr, n, 0)
	s.OpFlags = msgFlags
}

// PrepSendZC prepares a zero-copy send. zcFlags are SendZCReportUsage / RecvsendFixedBuf /
// RecvsendPollFirst. It completes twice: the send result (with CQEFMore when a notification
// follows) and the notification (CQEFNotif) when the kernel released the pages.
func (s *SQE) PrepSendZC(fd int32, addr uintptr, n uint32, msgFlags uint32, zcFlags uint16) {
	s.prepRW(OpSendZC, fd, addr, n, 0)
	s.OpFlags = msgFlags
	s.IoPrio = zcFlags
}

// PrepSendZCFixed is PrepSendZC from registered buffer bufIndex (addr lies inside it).
func (s *SQE) PrepSendZCFixed(fd int32, addr uintptr, n uint32, msgFlags uint32, zcFlags uint16, bufIndex uint16) {
	s.PrepSendZC(fd, addr, n, msgFlags, zcFlags|RecvsendFixedBuf)
	s.BufIndex = bufIndex
}

// PrepRecv prepares a recv(2) into n bytes at addr.
func (s *SQE) PrepRecv(fd int32, addr uintptr, n uint32, msgFlags uint32) {
	s.prepRW(OpRecv, fd, addr, n, 0)
	s.OpFlags = msgFlags
}

// PrepRecvMultishot prepares a multishot recv that picks buffers from provided-buffer group
// bgid. With bundle, one CQE may cover several consecutive buffers (FeatRecvsendBundle). It
// keeps posting CQEs with CQEFMore until it ends (error, EOF, or buffers exhausted).
func (s *SQE) PrepRecvMultishot(fd int32, bgid uint16, msgFlags uint32, bundle bool) {
	s.prepRW(OpRecv, fd, 0, 0, 0)
	s.OpFlags = msgFlags
	s.IoPrio = RecvMultishot
	if bundle {
		s.IoPrio |= RecvsendBundle
	}
	s.Flags |= SQEBufferSelect
	s.BufIndex = bgid
}

// PrepRecvMultishotLimit is PrepRecvMultishot that ends (without CQEFMore) once limit bytes
// were delivered in all (the SQE's optlen; Capabilities.RecvMultishotLimit says whether the
// kernel takes it). limit 0 is no limit.
func (s *SQE) PrepRecvMultishotLimit(fd int32, bgid uint16, bundle bool, limit uint32) {
	s.PrepRecvMultishot(fd, bgid, 0, bundle)
	s.FileIndex = int32(limit)
}

// PrepAccept prepares accept4(2). addr/addrLen may be 0; otherwise they point to a sockaddr
// buffer and a socklen_t the kernel writes at completion.
func (s *SQE) PrepAccept(fd int32, addr, addrLen uintptr, flags uint32) {
	s.prepRW(OpAccept, fd, addr, 0, uint64(addrLen))
	s.OpFlags = flags
}

// PrepMultishotAccept prepares an accept that posts one CQE per accepted connection.
func (s *SQE) PrepMultishotAccept(fd int32, flags uint32) {
	s.PrepAccept(fd, 0, 0, flags)
	s.IoPrio |= AcceptMultishot
}

// PrepConnect prepares connect(2). The sockaddr is read during submission; keep it reachable
// with Ring.Keep when it lives on the Go heap.
func (s *SQE) PrepConnect(fd int32, addr uintptr, addrLen uint32) {
	s.prepRW(OpConnect, fd, addr, 0, uint64(addrLen))
}

// PrepClose prepares close(2).
func (s *SQE) PrepClose(fd int32) { s.prepRW(OpClose, fd, 0, 0, 0) }

// PrepCloseFixed closes registered file slot idx.
func (s *SQE) PrepCloseFixed(idx uint32) {
	s.prepRW(OpClose, 0, 0, 0, 0)
	s.FileIndex = int32(idx + 1)
}

// PrepShutdown prepares shutdown(2) with how = unix.SHUT_RD/WR/RDWR.
func (s *SQE) PrepShutdown(fd int32, how int) { s.prepRW(OpShutdown, fd, 0, uint32(how), 0) }

// PrepMsgRing posts a CQE with res and userData on the ring whose fd is ringFd (another
// queue's ring): a cheap cross-ring wake-up.
func (s *SQE) PrepMsgRing(ringFd int32, res uint32, userData uint64, flags uint32) {
	s.prepRW(OpMsgRing, ringFd, MsgData, res, userData)
	s.OpFlags = flags
}

// PrepCancel cancels the request submitted with userData (or by CancelFd/CancelAny/CancelAll
// in flags, see PrepCancelFd).
func (s *SQE) PrepCancel(userData uint64, flags uint32) {
	s.prepRW(OpAsyncCancel, -1, uintptr(userData), 0, 0)
	s.OpFlags = flags
}

// PrepCancelFd cancels requests on fd (all of them with CancelAll in flags).
func (s *SQE) PrepCancelFd(fd int32, flags uint32) {
	s.prepRW(OpAsyncCancel, fd, 0, 0, 0)
	s.OpFlags = flags | CancelFd
}

// PrepTimeout prepares a timeout that completes after ts or after count other completions.
// ts is read during submission; the Ring keeps it reachable until then.
func (s *SQE) PrepTimeout(r *Ring, ts *Timespec, count uint32, flags uint32) {
	s.prepRW(OpTimeout, -1, uintptr(unsafe.Pointer(ts)), 1, uint64(count))
	s.OpFlags = flags
	r.Keep(ts)
}

// PrepReadFixed reads n bytes at file offset off into registered buffer bufIndex at addr.
func (s *SQE) PrepReadFixed(fd int32, addr uintptr, n uint32, off uint64, bufIndex uint16) {
	s.prepRW(OpReadFixed, fd, addr, n, off)
	s.BufIndex = bufIndex
}

// PrepWriteFixed writes n bytes from registered buffer bufIndex at addr to file offset off.
func (s *SQE) PrepWriteFixed(fd int32, addr uintptr, n uint32, off uint64, bufIndex uint16) {
	s.prepRW(OpWriteFixed, fd, addr, n, off)
	s.BufIndex = bufIndex
}

// SetFixedFile makes Fd an index into the registered file table.
func (s *SQE) SetFixedFile() { s.Flags |= SQEFixedFile }

// PrepRead prepares read(2) of n bytes into addr at the file position.
func (s *SQE) PrepRead(fd int32, addr uintptr, n uint32) {
	s.prepRW(OpRead, fd, addr, n, ^uint64(0))
}

// PrepPollAdd prepares a poll for events (POLLIN, ...); multishot keeps it armed.
func (s *SQE) PrepPollAdd(fd int32, events uint32, multishot bool) {
	s.prepRW(OpPollAdd, fd, 0, 0, 0)
	s.OpFlags = events
	if multishot {
		s.Len = pollAddMulti
	}
}

const pollAddMulti = 1 << 0

// PrepSendmsg prepares a copying sendmsg(2) of msg (a struct msghdr). Keep the msghdr, its
// iovec array and the buffers valid and unmoved until the operation completes.
func (s *SQE) PrepSendmsg(fd int32, msg unsafe.Pointer, msgFlags uint32) {
	s.prepRW(OpSendmsg, fd, uintptr(msg), 1, 0)
	s.OpFlags = msgFlags
}

// PrepRecvSelect prepares a single recv into one buffer picked from provided-buffer group
// bgid (no multishot, no bundle): it takes at most one buffer.
func (s *SQE) PrepRecvSelect(fd int32, bgid uint16, msgFlags uint32) {
	s.prepRW(OpRecv, fd, 0, 0, 0)
	s.OpFlags = msgFlags
	s.Flags |= SQEBufferSelect
	s.BufIndex = bgid
}
