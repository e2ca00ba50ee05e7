package tcpglue

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/eintr"
)

// ZeroCopyTXReport is what the kernel said about a connection's MSG_ZEROCOPY sends: how many
// of its notifications (one per send(2) call that took bytes) it flagged
// SO_EE_CODE_ZEROCOPY_COPIED, because it had to copy the payload after all (on loopback and
// veth it always does: the receiver's socket would hold the sender's pages). A notification
// without the flag means the pages left through a device that read them where they were.
type ZeroCopyTXReport struct {
	Local, Remote netip.AddrPort
	// Interface is the device that holds Local's address ("" when none does: an address
	// of another namespace, or a route through another device).
	Interface string
	Bytes     int // bytes sent
	Sends     int // send(2) calls that took bytes, each owing a notification
	Notified  int // of those, covered by a notification
	Copied    int // of those, flagged SO_EE_CODE_ZEROCOPY_COPIED
}

// Real reports whether at least one notification said the kernel did not copy.
func (r ZeroCopyTXReport) Real() bool { return r.Notified > r.Copied }

// String is a one-line report: "zero-copy TX 10.77.0.1:40000 (eth0) -> 10.77.0.2:9000:
// real (128 of 128 notifications not copied, 8388608 bytes)".
func (r ZeroCopyTXReport) String() string {
	verdict := "copied by the kernel"
	if r.Real() {
		verdict = "real"
	}
	dev := ""
	if r.Interface != "" {
		dev = " (" + r.Interface + ")"
	}
	return fmt.Sprintf("zero-copy TX %s%s -> %s: %s (%d of %d notifications not copied, %d bytes)",
		r.Local, dev, r.Remote, verdict, r.Notified-r.Copied, r.Notified, r.Bytes)
}

// SendZeroCopy sends all of p on the connected socket s with MSG_ZEROCOPY (it sets
// SO_ZEROCOPY first), in send(2) calls of at most 64 KiB (each owes one notification), and
// waits, at most timeout in all, until every notification arrived:
// the kernel no longer reads p. p must not be written until it returns. A kernel without
// MSG_ZEROCOPY (before 4.14) fails with an error matching ErrNotSupported.
func (s *Socket) SendZeroCopy(p []byte, timeout time.Duration) (ZeroCopyTXReport, error) {
	var r ZeroCopyTXReport
	r.Local, _ = s.LocalAddr()
	r.Remote, _ = s.RemoteAddr()
	r.Interface = interfaceOf(r.Local.Addr())
	if err := s.SetZeroCopy(true); err != nil {
		return r, err
	}
	deadline := time.Now().Add(timeout)
	for len(p) > 0 {
		n, err := s.Send(p[:min(len(p), zcSendChunk)], unix.MSG_ZEROCOPY)
		if errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.EAGAIN) {
			// Too many notifications outstanding (optmem) or a full send buffer on a
			// non-blocking socket: collect notifications and wait for room.
			if err := s.zcWait(&r, deadline, unix.POLLOUT); err != nil {
				return r, err
			}
			continue
		}
		if err != nil {
			return r, err
		}
		r.Sends++
		r.Bytes += n
		p = p[n:]
		if err := s.zcDrain(&r); err != nil {
			return r, err
		}
	}
	for r.Notified < r.Sends {
		if err := s.zcWait(&r, deadline, 0); err != nil {
			return r, err
		}
	}
	return r, nil
}

// zcSendChunk is the most SendZeroCopy hands to one send(2).
const zcSendChunk = 64 << 10

// zcWait waits (until deadline) for the error queue or for events, then drains the queue.
func (s *Socket) zcWait(r *ZeroCopyTXReport, deadline time.Time, events int16) error {
	left := time.Until(deadline)
	if left <= 0 {
		return fmt.Errorf("zero-copy send: %d of %d notifications arrived in time: %w", r.Notified, r.Sends, os.ErrDeadlineExceeded)
	}
	err := s.Control(func(fd int) error {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: events}} // POLLERR is always reported
		if _, err := eintr.Poll(pfd, min(left, 100*time.Millisecond)); err != nil {
			return os.NewSyscallError("poll", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return s.zcDrain(r)
}

// zcDrain reads every notification queued on the error queue, without waiting.
func (s *Socket) zcDrain(r *ZeroCopyTXReport) error {
	return s.Control(func(fd int) error {
		var oob [256]byte
		for {
			var oobn int
			err := eintr.Retry(func() (err error) {
				_, oobn, _, _, err = unix.Recvmsg(fd, nil, oob[:], unix.MSG_ERRQUEUE|unix.MSG_DONTWAIT)
				return err
			})
			if errors.Is(err, unix.EAGAIN) {
				return nil
			}
			if err != nil {
				return os.NewSyscallError("recvmsg MSG_ERRQUEUE", err)
			}
			msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
			if err != nil {
				return err
			}
			for _, m := range msgs {
				if len(m.Data) < int(unsafe.Sizeof(unix.SockExtendedErr{})) {
					continue
				}
				ee := (*unix.SockExtendedErr)(unsafe.Pointer(&m.Data[0]))
				if ee.Origin != unix.SO_EE_ORIGIN_ZEROCOPY {
					return fmt.Errorf("error queue: origin %d, errno %d: %w", ee.Origin, ee.Errno, unix.Errno(ee.Errno))
				}
				// ee_info..ee_data is the range of send calls this notification covers.
				n := int(ee.Data - ee.Info + 1)
				r.Notified += n
				if ee.Code&unix.SO_EE_CODE_ZEROCOPY_COPIED != 0 {
					r.Copied += n
				}
			}
		}
	})
}

// interfaceOf names the device of the caller's namespace that holds a.
func interfaceOf(a netip.Addr) string {
	ifs, err := net.Interfaces()
	if err != nil {
		return ""
	}
	for _, ifi := range ifs {
		addrs, err := ifi.Addrs()
		if err != nil {
			continue
		}
		for _, ad := range addrs {
			if n, ok := ad.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == a.Unmap() {
					return ifi.Name
				}
			}
		}
	}
	return ""
}

// ProbeZeroCopyTX tells whether zero-copy sends to addr are real: it connects (from local,
// when valid), sends n bytes (at least one page) with MSG_ZEROCOPY from page-aligned memory,
// and reports what the kernel's notifications said. The peer must read and discard what it
// is sent (zcprobe -zc-sink). It waits at most timeout in all.
func ProbeZeroCopyTX(local, addr netip.AddrPort, n int, timeout time.Duration) (ZeroCopyTXReport, error) {
	n = max(n, os.Getpagesize())
	s, err := DialAddrPort(addr, DialOptions{LocalAddr: local})
	if err != nil {
		return ZeroCopyTXReport{Remote: addr}, err
	}
	defer s.Close()
	mem, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return ZeroCopyTXReport{Remote: addr}, os.NewSyscallError("mmap", err)
	}
	// Unmapped only once every notification arrived (or the socket is closed: the
	// kernel keeps its own references to pages it still holds).
	defer unix.Munmap(mem)
	for i := range mem {
		mem[i] = byte(i)
	}
	r, err := s.SendZeroCopy(mem, timeout)
	if err != nil {
		return r, err
	}
	return r, s.Shutdown(unix.SHUT_WR)
}
