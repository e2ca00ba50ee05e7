package tcpglue

import (
	"errors"
	"fmt"
)

// ErrTLSRenegotiation: the peer asked for a TLS 1.2 renegotiation (HelloRequest), which is
// refused: the answer is a no_renegotiation warning alert, and reading fails with this.
var ErrTLSRenegotiation = errors.New("tls: the peer asked for renegotiation, which is refused")

// TLSAlertError is a TLS alert (RFC 8446 §6) that ended the connection: one the peer sent
// (Received) or one sent because of what the peer sent (a record that failed
// authentication: bad_record_mac, 20). A close_notify is not an error: reads return
// io.EOF. zc (TLSAlertError) and zc/ztls (AlertError) report this type, from both paths, kernel
// and user space.
type TLSAlertError struct {
	Alert    uint8 // the alert description
	Received bool  // the peer sent it
}

var alertNames = map[uint8]string{
	0: "close_notify", 10: "unexpected_message", 20: "bad_record_mac", 22: "record_overflow",
	40: "handshake_failure", 42: "bad_certificate", 46: "certificate_unknown", 47: "illegal_parameter",
	48: "unknown_ca", 50: "decode_error", 51: "decrypt_error", 70: "protocol_version",
	80: "internal_error", 90: "user_canceled", 100: "no_renegotiation", 109: "missing_extension",
	110: "unsupported_extension", 112: "unrecognized_name", 116: "certificate_required",
	120: "no_application_protocol",
}

func (e *TLSAlertError) Error() string {
	name := alertNames[e.Alert]
	if name == "" {
		name = "alert"
	}
	who := "sent"
	if e.Received {
		who = "received"
	}
	return fmt.Sprintf("tls: %s TLS alert %s (%d)", who, name, e.Alert)
}
