package tcpglue

import (
	"errors"
	"math"
	"os"
	"runtime"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/eintr"
)

// getsockopt is the one wrapper for getsockopt(2) with a raw buffer: it keeps
// the buffer alive across the call and retries EINTR.
func getsockopt(fd, level, opt int, p unsafe.Pointer, l *uint32) error {
	e := eintr.Errno(func() unix.Errno {
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
			uintptr(p), uintptr(unsafe.Pointer(l)), 0)
		return e
	})
	runtime.KeepAlive(p)
	runtime.KeepAlive(l)
	if e != 0 {
		return e
	}
	return nil
}

func (s *Socket) setInt(op string, level, opt, v int) error {
	fd, err := s.incref(op)
	if err != nil {
		return err
	}
	defer s.decref()
	if err := unix.SetsockoptInt(fd, level, opt, v); err != nil {
		return opErr(op, fd, nil, sysErr("setsockopt", err))
	}
	return nil
}

func (s *Socket) getInt(op string, level, opt int) (int, error) {
	fd, err := s.incref(op)
	if err != nil {
		return 0, err
	}
	defer s.decref()
	v, err := unix.GetsockoptInt(fd, level, opt)
	if err != nil {
		return 0, opErr(op, fd, nil, sysErr("getsockopt", err))
	}
	return v, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func invalid(op, name string, v any, reason string) error {
	return opErr(op, -1, nil, &ValueError{Name: name, Value: v, Reason: reason})
}

// SetReuseAddr sets SO_REUSEADDR (before Bind).
func (s *Socket) SetReuseAddr(on bool) error {
	return s.setInt("setsockopt SO_REUSEADDR", unix.SOL_SOCKET, unix.SO_REUSEADDR, boolInt(on))
}

// SetReusePort sets SO_REUSEPORT (before Bind): sockets of one user bound to
// the same address and port form a reuseport group.
func (s *Socket) SetReusePort(on bool) error {
	return s.setInt("setsockopt SO_REUSEPORT", unix.SOL_SOCKET, unix.SO_REUSEPORT, boolInt(on))
}

// SetNoDelay sets TCP_NODELAY (disables Nagle's algorithm when on).
func (s *Socket) SetNoDelay(on bool) error {
	return s.setInt("setsockopt TCP_NODELAY", unix.IPPROTO_TCP, unix.TCP_NODELAY, boolInt(on))
}

// NoDelay reads TCP_NODELAY.
func (s *Socket) NoDelay() (bool, error) {
	v, err := s.getInt("getsockopt TCP_NODELAY", unix.IPPROTO_TCP, unix.TCP_NODELAY)
	return v != 0, err
}

// SetZeroCopy sets SO_ZEROCOPY, which send(2) with MSG_ZEROCOPY needs (Linux
// 4.14). io_uring SEND_ZC does not need it.
func (s *Socket) SetZeroCopy(on bool) error {
	err := s.setInt("setsockopt SO_ZEROCOPY", unix.SOL_SOCKET, unix.SO_ZEROCOPY, boolInt(on))
	if errors.Is(err, unix.ENOPROTOOPT) {
		return errors.Join(err, ErrNotSupported)
	}
	return err
}

// ZeroCopy reads SO_ZEROCOPY.
func (s *Socket) ZeroCopy() (bool, error) {
	v, err := s.getInt("getsockopt SO_ZEROCOPY", unix.SOL_SOCKET, unix.SO_ZEROCOPY)
	return v != 0, err
}

// SetSendBuffer sets SO_SNDBUF to n bytes and returns the effective size the
// kernel reports back (it doubles the request for bookkeeping overhead and
// clamps it to net.core.wmem_max; setting it also disables send buffer
// autotuning for this socket). n must be > 0.
func (s *Socket) SetSendBuffer(n int) (int, error) {
	const op = "setsockopt SO_SNDBUF"
	if n <= 0 || n > math.MaxInt32/2 {
		return 0, invalid(op, "SO_SNDBUF", n, "want 1..1073741823 bytes")
	}
	if err := s.setInt(op, unix.SOL_SOCKET, unix.SO_SNDBUF, n); err != nil {
		return 0, err
	}
	return s.SendBuffer()
}

// SendBuffer reads SO_SNDBUF (the effective size in bytes).
func (s *Socket) SendBuffer() (int, error) {
	return s.getInt("getsockopt SO_SNDBUF", unix.SOL_SOCKET, unix.SO_SNDBUF)
}

// SetRecvBuffer sets SO_RCVBUF to n bytes and returns the effective size (see
// SetSendBuffer; the cap is net.core.rmem_max). Set it before Listen/Connect
// for it to affect the window scale. n must be > 0.
func (s *Socket) SetRecvBuffer(n int) (int, error) {
	const op = "setsockopt SO_RCVBUF"
	if n <= 0 || n > math.MaxInt32/2 {
		return 0, invalid(op, "SO_RCVBUF", n, "want 1..1073741823 bytes")
	}
	if err := s.setInt(op, unix.SOL_SOCKET, unix.SO_RCVBUF, n); err != nil {
		return 0, err
	}
	return s.RecvBuffer()
}

// RecvBuffer reads SO_RCVBUF (the effective size in bytes).
func (s *Socket) RecvBuffer() (int, error) {
	return s.getInt("getsockopt SO_RCVBUF", unix.SOL_SOCKET, unix.SO_RCVBUF)
}

const congestionProc = "/proc/sys/net/ipv4/tcp_available_congestion_control"

// AvailableCongestion lists the congestion control algorithms the kernel has
// loaded (net.ipv4.tcp_available_congestion_control).
func AvailableCongestion() ([]string, error) {
	b, err := os.ReadFile(congestionProc)
	if err != nil {
		return nil, opErr("available congestion", -1, nil, err)
	}
	return strings.Fields(string(b)), nil
}

// tcpCANameMax is TCP_CA_NAME_MAX: names are at most 15 bytes.
const tcpCANameMax = 16

// SetCongestion sets TCP_CONGESTION (for example "cubic", "bbr", "reno"). An
// unknown or disallowed name gives an *OpError wrapping a *CongestionError
// that lists the available algorithms.
func (s *Socket) SetCongestion(name string) error {
	const op = "setsockopt TCP_CONGESTION"
	if name == "" || len(name) >= tcpCANameMax || strings.IndexByte(name, 0) >= 0 {
		return invalid(op, "TCP_CONGESTION", name, "want a name of 1..15 bytes, e.g. cubic")
	}
	fd, err := s.incref(op)
	if err != nil {
		return err
	}
	defer s.decref()
	if err := unix.SetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION, name); err != nil {
		avail, _ := AvailableCongestion()
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EPERM) {
			return opErr(op, fd, nil, &CongestionError{Name: name, Available: avail, Err: sysErr("setsockopt", err)})
		}
		return opErr(op, fd, nil, sysErr("setsockopt", err))
	}
	return nil
}

// Congestion reads TCP_CONGESTION.
func (s *Socket) Congestion() (string, error) {
	const op = "getsockopt TCP_CONGESTION"
	fd, err := s.incref(op)
	if err != nil {
		return "", err
	}
	defer s.decref()
	var buf [tcpCANameMax]byte
	l := uint32(len(buf))
	if err := getsockopt(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION, unsafe.Pointer(&buf[0]), &l); err != nil {
		return "", opErr(op, fd, nil, sysErr("getsockopt", err))
	}
	b := buf[:min(int(l), len(buf))]
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		b = b[:i]
	}
	return string(b), nil
}

// UnlimitedPacing is the SO_MAX_PACING_RATE value meaning "no cap".
const UnlimitedPacing = ^uint64(0)

// SetMaxPacingRate sets SO_MAX_PACING_RATE in bytes per second
// (UnlimitedPacing removes the cap). The kernel paces TCP itself (since Linux
// 4.13) so no fq qdisc is needed.
func (s *Socket) SetMaxPacingRate(bytesPerSec uint64) error {
	const op = "setsockopt SO_MAX_PACING_RATE"
	fd, err := s.incref(op)
	if err != nil {
		return err
	}
	defer s.decref()
	if err := unix.SetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE, bytesPerSec); err != nil {
		return opErr(op, fd, nil, sysErr("setsockopt", err))
	}
	return nil
}

// MaxPacingRate reads SO_MAX_PACING_RATE in bytes per second.
func (s *Socket) MaxPacingRate() (uint64, error) {
	const op = "getsockopt SO_MAX_PACING_RATE"
	fd, err := s.incref(op)
	if err != nil {
		return 0, err
	}
	defer s.decref()
	var v uint64
	l := uint32(8)
	if err := getsockopt(fd, unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE, unsafe.Pointer(&v), &l); err != nil {
		return 0, opErr(op, fd, nil, sysErr("getsockopt", err))
	}
	if l == 4 { // old kernels answer with 32 bits
		v = uint64(*(*uint32)(unsafe.Pointer(&v)))
		if v == math.MaxUint32 {
			v = UnlimitedPacing
		}
	}
	return v, nil
}

// SetUserTimeout sets TCP_USER_TIMEOUT: how long transmitted data may stay
// unacknowledged before the connection is dropped with ETIMEDOUT. 0 restores
// the system default. It is rounded down to milliseconds.
func (s *Socket) SetUserTimeout(d time.Duration) error {
	const op = "setsockopt TCP_USER_TIMEOUT"
	ms := d / time.Millisecond
	if d < 0 || ms > math.MaxInt32 {
		return invalid(op, "TCP_USER_TIMEOUT", d, "want 0..2147483647ms")
	}
	return s.setInt(op, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(ms))
}

// UserTimeout reads TCP_USER_TIMEOUT.
func (s *Socket) UserTimeout() (time.Duration, error) {
	v, err := s.getInt("getsockopt TCP_USER_TIMEOUT", unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
	return time.Duration(v) * time.Millisecond, err
}

// SetTOS sets the traffic class byte of outgoing packets (DSCP << 2 | ECN):
// IP_TOS on an AF_INET socket, IPV6_TCLASS on an AF_INET6 socket — and IP_TOS
// as well there, because an AF_INET6 socket carrying IPv4 traffic (v4-mapped
// peers of a dual-stack listener) uses IP_TOS for it. tos must be 0..255.
func (s *Socket) SetTOS(tos int) error {
	if s.Family() == unix.AF_INET6 {
		const op = "setsockopt IPV6_TCLASS"
		if tos < 0 || tos > 255 {
			return invalid(op, "IPV6_TCLASS", tos, "want 0..255 (DSCP<<2 | ECN)")
		}
		if err := s.setInt(op, unix.IPPROTO_IPV6, unix.IPV6_TCLASS, tos); err != nil {
			return err
		}
		return s.setInt("setsockopt IP_TOS", unix.IPPROTO_IP, unix.IP_TOS, tos)
	}
	const op = "setsockopt IP_TOS"
	if tos < 0 || tos > 255 {
		return invalid(op, "IP_TOS", tos, "want 0..255 (DSCP<<2 | ECN)")
	}
	return s.setInt(op, unix.IPPROTO_IP, unix.IP_TOS, tos)
}

// TOS reads IP_TOS or IPV6_TCLASS (by family).
func (s *Socket) TOS() (int, error) {
	if s.Family() == unix.AF_INET6 {
		return s.getInt("getsockopt IPV6_TCLASS", unix.IPPROTO_IPV6, unix.IPV6_TCLASS)
	}
	return s.getInt("getsockopt IP_TOS", unix.IPPROTO_IP, unix.IP_TOS)
}

// SetNotSentLowat sets TCP_NOTSENT_LOWAT: the socket reports writable only
// while fewer than n bytes are queued but not yet sent. n must be > 0.
func (s *Socket) SetNotSentLowat(n int) error {
	const op = "setsockopt TCP_NOTSENT_LOWAT"
	if n <= 0 || n > math.MaxInt32 {
		return invalid(op, "TCP_NOTSENT_LOWAT", n, "want 1..2147483647 bytes")
	}
	return s.setInt(op, unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, n)
}

// NotSentLowat reads TCP_NOTSENT_LOWAT.
func (s *Socket) NotSentLowat() (int, error) {
	return s.getInt("getsockopt TCP_NOTSENT_LOWAT", unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT)
}

// SetLinger sets SO_LINGER. sec < 0 turns lingering off (the default);
// sec == 0 makes Close reset the connection (RST) and drop unsent data;
// sec > 0 makes a blocking close wait up to sec seconds for unsent data.
func (s *Socket) SetLinger(sec int) error {
	const op = "setsockopt SO_LINGER"
	if sec > math.MaxInt32 {
		return invalid(op, "SO_LINGER", sec, "too large")
	}
	l := unix.Linger{}
	if sec >= 0 {
		l.Onoff, l.Linger = 1, int32(sec)
	}
	fd, err := s.incref(op)
	if err != nil {
		return err
	}
	defer s.decref()
	if err := unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &l); err != nil {
		return opErr(op, fd, nil, sysErr("setsockopt", err))
	}
	return nil
}

// SetMaxSeg sets TCP_MAXSEG, the largest segment payload plus TCP options the
// socket sends and advertises. Set it before Listen/Connect. With timestamps
// (12 option bytes) a value of 4096+12 = 4108 makes every full segment carry
// exactly one page, which TCP_ZEROCOPY_RECEIVE needs to map pages. The kernel
// accepts 88..32767 (TCP_MIN_MSS..MAX_TCP_WINDOW).
func (s *Socket) SetMaxSeg(mss int) error {
	const op = "setsockopt TCP_MAXSEG"
	if mss < 88 || mss > 32767 {
		return invalid(op, "TCP_MAXSEG", mss, "want 88..32767")
	}
	return s.setInt(op, unix.IPPROTO_TCP, unix.TCP_MAXSEG, mss)
}

// MaxSeg reads TCP_MAXSEG (the current MSS once connected).
func (s *Socket) MaxSeg() (int, error) {
	return s.getInt("getsockopt TCP_MAXSEG", unix.IPPROTO_TCP, unix.TCP_MAXSEG)
}

// IncomingCPU reads SO_INCOMING_CPU: the CPU that processed the socket's
// most recent incoming packet, or -1 when unknown.
func (s *Socket) IncomingCPU() (int, error) {
	return s.getInt("getsockopt SO_INCOMING_CPU", unix.SOL_SOCKET, unix.SO_INCOMING_CPU)
}

// IncomingNAPIID reads SO_INCOMING_NAPI_ID: the NAPI instance (receive
// queue) the last packet came from. 0 means unknown (loopback and devices
// without NAPI report 0).
func (s *Socket) IncomingNAPIID() (uint32, error) {
	v, err := s.getInt("getsockopt SO_INCOMING_NAPI_ID", unix.SOL_SOCKET, unix.SO_INCOMING_NAPI_ID)
	return uint32(v), err
}

// OutQueue returns the bytes in the send queue that the peer has not acknowledged yet
// (SIOCOUTQ): what a reset would discard.
func (s *Socket) OutQueue() (int, error) {
	const op = "ioctl SIOCOUTQ"
	fd, err := s.incref(op)
	if err != nil {
		return 0, err
	}
	defer s.decref()
	v, err := unix.IoctlGetInt(fd, unix.SIOCOUTQ)
	if err != nil {
		return 0, opErr(op, fd, nil, sysErr("ioctl", err))
	}
	return v, nil
}

// SetV6Only sets IPV6_V6ONLY on an AF_INET6 socket, before Bind: true takes IPv6 only,
// false IPv4 (as IPv4-mapped addresses) too.
func (s *Socket) SetV6Only(on bool) error {
	return s.setInt("setsockopt IPV6_V6ONLY", unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, boolInt(on))
}

// InQueue returns the bytes waiting in the receive queue (SIOCINQ).
func (s *Socket) InQueue() (int, error) {
	const op = "ioctl SIOCINQ"
	fd, err := s.incref(op)
	if err != nil {
		return 0, err
	}
	defer s.decref()
	v, err := unix.IoctlGetInt(fd, unix.SIOCINQ)
	if err != nil {
		return 0, opErr(op, fd, nil, sysErr("ioctl", err))
	}
	return v, nil
}

// SetKeepAlive sets SO_KEEPALIVE.
func (s *Socket) SetKeepAlive(on bool) error {
	return s.setInt("setsockopt SO_KEEPALIVE", unix.SOL_SOCKET, unix.SO_KEEPALIVE, boolInt(on))
}

// SetKeepAliveParams sets TCP_KEEPIDLE (idle time before the first probe),
// TCP_KEEPINTVL (time between probes), both in whole seconds 1..32767, and
// TCP_KEEPCNT (unanswered probes before the connection is dropped, 1..127).
// It does not turn keepalive on; see SetKeepAlive.
func (s *Socket) SetKeepAliveParams(idle, interval time.Duration, count int) error {
	const maxKeep = 32767 * time.Second
	if idle < time.Second || idle > maxKeep {
		return invalid("setsockopt TCP_KEEPIDLE", "TCP_KEEPIDLE", idle, "want 1s..32767s")
	}
	if interval < time.Second || interval > maxKeep {
		return invalid("setsockopt TCP_KEEPINTVL", "TCP_KEEPINTVL", interval, "want 1s..32767s")
	}
	if count < 1 || count > 127 {
		return invalid("setsockopt TCP_KEEPCNT", "TCP_KEEPCNT", count, "want 1..127")
	}
	if err := s.setInt("setsockopt TCP_KEEPIDLE", unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, int(idle/time.Second)); err != nil {
		return err
	}
	if err := s.setInt("setsockopt TCP_KEEPINTVL", unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, int(interval/time.Second)); err != nil {
		return err
	}
	return s.setInt("setsockopt TCP_KEEPCNT", unix.IPPROTO_TCP, unix.TCP_KEEPCNT, count)
}
