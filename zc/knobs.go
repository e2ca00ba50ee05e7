package zc

import (
	"time"

	"github.com/zcnet/zcnet/tcpglue"
)

// Per-flow knobs of the kernel's TCP stack (seed 003's stack interfaces). Each holds a
// reference on the socket for the call (see Socket) and fails with an error matching
// ErrClosed once the connection closed; bad values are *tcpglue.ValueError (ErrInvalid-like),
// what the kernel lacks matches ErrNotSupported.

// TCPInfo returns the kernel's TCP_INFO for the connection: RTT, congestion window,
// retransmits, delivery rate, pacing rate and the rest.
func (c *Conn) TCPInfo() (tcpglue.TCPInfo, error) {
	var info tcpglue.TCPInfo
	err := c.Socket(func(s *tcpglue.Socket) error {
		var err error
		info, err = s.TCPInfo()
		return err
	})
	return info, err
}

// SetCongestion selects the connection's congestion-control algorithm (TCP_CONGESTION:
// "cubic", "bbr", ... one of tcpglue.AvailableCongestion).
func (c *Conn) SetCongestion(name string) error {
	return c.Socket(func(s *tcpglue.Socket) error { return s.SetCongestion(name) })
}

// SetPacingRate caps the connection's sending rate in bytes per second (SO_MAX_PACING_RATE;
// 0 removes the cap).
func (c *Conn) SetPacingRate(bytesPerSec uint64) error {
	return c.Socket(func(s *tcpglue.Socket) error { return s.SetMaxPacingRate(bytesPerSec) })
}

// SetUserTimeout bounds how long sent data may stay unacknowledged before the kernel drops
// the connection (TCP_USER_TIMEOUT; 0 restores the default).
func (c *Conn) SetUserTimeout(d time.Duration) error {
	return c.Socket(func(s *tcpglue.Socket) error { return s.SetUserTimeout(d) })
}

// SetTOS sets the DSCP/ECN byte of the connection's packets (IP_TOS / IPV6_TCLASS).
func (c *Conn) SetTOS(tos int) error {
	return c.Socket(func(s *tcpglue.Socket) error { return s.SetTOS(tos) })
}
