package zc

import (
	"net/netip"
	"time"

	"github.com/zcnet/zcnet/tcpglue"
)

// ListenOptions are per-listener settings (Engine.ListenWith).
type ListenOptions struct {
	// KeepAlive overrides Config.KeepAlive for the accepted connections (0: the engine's;
	// negative: off).
	KeepAlive time.Duration
	// Shared joins an SO_REUSEPORT group that already listens on the address (another
	// listener of this process or another process with the same user). Without it, Listen on
	// an address something already listens on fails with EADDRINUSE, as Go's net does.
	Shared bool
	// Backlog for listen(2) (default 4096; the kernel caps it at net.core.somaxconn).
	Backlog int
}

// DialOptions are per-dial settings (Engine.DialWith, Engine.DialAsync).
type DialOptions struct {
	// KeepAlive overrides Config.KeepAlive (0: the engine's; negative: off).
	KeepAlive time.Duration
	// LocalAddr, if valid, is bound before connecting.
	LocalAddr netip.AddrPort
}

// keepAlive applies keep-alive d (> 0: idle time and interval, 9 probes, as Go's net; < 0:
// off) to s.
func keepAlive(s *tcpglue.Socket, d time.Duration) error {
	if d < 0 {
		return s.SetKeepAlive(false)
	}
	if err := s.SetKeepAlive(true); err != nil {
		return err
	}
	d = max(d, time.Second)
	return s.SetKeepAliveParams(d, d, 9)
}

func (e *Engine) keepAliveFor(d time.Duration) time.Duration {
	if d == 0 {
		return e.cfg.KeepAlive
	}
	return d
}
