package ktls

import (
	"crypto/tls"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/zcnet/zcnet/tcpglue"
)

// Record content types.
const (
	TypeChangeCipherSpec = typeChangeCipherSpec
	TypeAlert            = typeAlert
	TypeHandshake        = typeHandshake
	TypeApplicationData  = typeApplicationData
)

// Handshake message types after the handshake.
const (
	msgHelloRequest     = 0
	msgNewSessionTicket = 4
	msgKeyUpdate        = 24
)

// KeyUpdateMsg is a TLS 1.3 KeyUpdate handshake message, update_not_requested.
var KeyUpdateMsg = []byte{msgKeyUpdate, 0, 0, 1, 0}

// MaxRecord is the largest plaintext one record carries.
const MaxRecord = 16384

// Ops are what handling a control record may need of the connection. Alert and Warn are
// best effort and never wait for room in the socket: a reader must never wait for a
// writer that waits for the peer.
type Ops interface {
	// Alert sends a fatal alert and shuts the socket down both ways (after a record fails
	// authentication the kernel refuses every later send: the peer must still see the end).
	Alert(desc uint8)
	// Warn sends a warning alert.
	Warn(desc uint8)
	// SetRX gives the kernel the next RX keys (a KeyUpdate).
	SetRX(c *tcpglue.TLSCrypto) error
	// KeyUpdateOwed: the peer asked for a KeyUpdate of ours (RFC 8446 §4.6.3: before our
	// next data record).
	KeyUpdateOwed()
}

// Control is the receive side of a kernel-TLS connection's non-data records: alerts,
// post-handshake handshake messages (KeyUpdate, NewSessionTicket, HelloRequest), which
// the kernel hands over with their record type (tcpglue.RecvTLS), sometimes in pieces.
// One reader at a time; the counters may be read from any goroutine.
type Control struct {
	Version uint16
	Suite   Suite
	RX      []byte // the TLS 1.3 RX traffic secret (the next KeyUpdate derives from it)

	ctl     []byte // a partial control record
	ctlType uint8

	KeyUpdates atomic.Uint64 // KeyUpdates received and applied
	Tickets    atomic.Uint64 // TLS 1.3 session tickets received and dropped
}

// Held is how many bytes of a partial control record are held (bounded by 64 KiB).
func (c *Control) Held() int { return len(c.ctl) }

// Pending reports whether part of a control record is held (an EOF now is unexpected).
func (c *Control) Pending() bool { return len(c.ctl) > 0 }

// Feed handles (part of) a non-data record of type typ. A nil result means "read on";
// io.EOF is the peer's close_notify; a *AlertError is an alert received or sent;
// ErrRenegotiation a refused TLS 1.2 renegotiation; other errors a KeyUpdate the kernel
// could not follow.
func (c *Control) Feed(typ uint8, b []byte, ops Ops) error {
	if len(c.ctl) > 0 && typ != c.ctlType {
		ops.Alert(10)
		return &AlertError{Alert: 10}
	}
	c.ctlType = typ
	c.ctl = append(c.ctl, b...)
	if len(c.ctl) > 1<<16 {
		ops.Alert(10)
		return &AlertError{Alert: 10}
	}
	switch typ {
	case typeAlert:
		for len(c.ctl) >= 2 {
			level, desc := c.ctl[0], c.ctl[1]
			c.ctl = c.ctl[2:]
			switch {
			case desc == 0:
				return io.EOF
			case desc == 90 && level == 1:
				continue // user_canceled, a warning: a close_notify follows
			}
			return &AlertError{Alert: desc, Received: true}
		}
	case typeHandshake:
		for len(c.ctl) >= 4 {
			l := int(c.ctl[1])<<16 | int(c.ctl[2])<<8 | int(c.ctl[3])
			if len(c.ctl) < 4+l {
				break
			}
			msg := c.ctl[:4+l]
			c.ctl = c.ctl[4+l:]
			if err := c.handshakeMsg(msg, ops); err != nil {
				return err
			}
		}
	default:
		ops.Alert(10)
		return &AlertError{Alert: 10}
	}
	if len(c.ctl) == 0 {
		c.ctl = nil
	}
	return nil
}

// handshakeMsg handles a post-handshake message that arrived through the kernel.
func (c *Control) handshakeMsg(msg []byte, ops Ops) error {
	tls13 := c.Version == tls.VersionTLS13
	switch {
	case tls13 && msg[0] == msgNewSessionTicket:
		// crypto/tls cannot be handed a ticket from outside: no resumption for
		// connections whose records are in the kernel.
		c.Tickets.Add(1)
		return nil
	case tls13 && msg[0] == msgKeyUpdate:
		if len(msg) != 5 || msg[4] > 1 {
			ops.Alert(50)
			return &AlertError{Alert: 50}
		}
		// The next RX keys (RFC 8446 §4.6.3; the kernel refuses reads with EKEYEXPIRED
		// until it has them).
		next := NextSecret13(c.Suite, c.RX)
		if err := ops.SetRX(TrafficKeys13(c.Suite, next, 0)); err != nil {
			return fmt.Errorf("the peer updated its keys (KeyUpdate) and the kernel cannot follow: %w", err)
		}
		c.RX = next
		c.KeyUpdates.Add(1)
		if msg[4] == 1 {
			ops.KeyUpdateOwed()
		}
		return nil
	case !tls13 && msg[0] == msgHelloRequest:
		ops.Warn(100) // no_renegotiation
		return ErrRenegotiation
	}
	ops.Alert(10)
	return &AlertError{Alert: 10}
}

// Install attaches the "tls" ULP to fd (unless ulp says it is attached already) and gives
// the kernel both directions' keys. hard reports a failure after the kernel took the RX
// keys: neither side can carry the records any more, the connection must close.
func Install(fd int, ulp bool, tx, rx DirKeys) (hard bool, err error) {
	if !ulp {
		if err := tcpglue.EnableTLS(fd); err != nil {
			return false, err
		}
	}
	if err := tcpglue.SetTLSRx(fd, rx.Crypto); err != nil {
		return false, err
	}
	if err := tcpglue.SetTLSTx(fd, tx.Crypto); err != nil {
		return true, err
	}
	return false, nil
}
