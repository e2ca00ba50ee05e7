package zc

import (
	"github.com/zcnet/zcnet/tcpglue"
)

// Per-flow knobs of the kernel's TCP stack (seed 003's stack interfaces) are tcpglue.Socket's
// setters, run through Conn.Socket: congestion control (SetCongestion), pacing
// (SetMaxPacingRate), TCP_USER_TIMEOUT (SetUserTimeout), DSCP/ECN (SetTOS). Socket holds a
// reference on the socket for the call and fails with an error matching ErrClosed once the
// connection closed; bad values are *tcpglue.ValueError (ErrInvalid-like), what the kernel
// lacks matches ErrNotSupported. TCPInfo, the read most wanted, has a method of its own.

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
