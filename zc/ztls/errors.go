package ztls

import (
	"errors"
	"fmt"
	"net"
	"reflect"

	"github.com/zcnet/zcnet/internal/errs"
)

// ErrNotSupported is zcnet's one "this kernel or machine cannot" sentinel (it is
// zc.ErrNotSupported and tcpglue.ErrNotSupported): a *NoKernelError matches it.
var ErrNotSupported = errs.ErrNotSupported

// ErrRenegotiation: the peer asked for a TLS 1.2 renegotiation (HelloRequest), which ztls
// refuses: it answers with a no_renegotiation warning alert and the read fails with this.
var ErrRenegotiation = errors.New("ztls: the peer asked for renegotiation, which is refused")

// ErrNilConfig: Server, Client, Listen or Dial was given a nil *tls.Config.
var ErrNilConfig = errors.New("ztls: nil *tls.Config")

// NoKernelError says why kernel TLS cannot serve a connection whose Options forbid the
// user-space fallback (NoFallback). It matches ErrNotSupported (and its cause, if any).
// The connection is closed.
type NoKernelError struct {
	Reason string // what is missing: "kernel TLS: not supported (needs ... CONFIG_TLS ...)", a cipher suite, ...
	Err    error  // the cause, may be nil
}

func (e *NoKernelError) Error() string {
	return "ztls: kernel TLS refused for this connection (Options.NoFallback forbids user space): " + e.Reason
}

// Unwrap returns ErrNotSupported and the cause.
func (e *NoKernelError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrNotSupported}
	}
	return []error{ErrNotSupported, e.Err}
}

// AlertError is a TLS alert (RFC 8446 §6) that ended the connection: one the peer sent
// (Received) or one ztls sent because of what the peer sent (a record that failed
// authentication: bad_record_mac, 20). A close_notify is not an error: reads return
// io.EOF. The same type comes from both paths, kernel and user space.
type AlertError struct {
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

func (e *AlertError) Error() string {
	name := alertNames[e.Alert]
	if name == "" {
		name = "alert"
	}
	who := "sent"
	if e.Received {
		who = "received"
	}
	return fmt.Sprintf("ztls: %s TLS alert %s (%d)", who, name, e.Alert)
}

// userErr maps crypto/tls's errors to ztls's: an alert received ("remote error") or sent
// ("local error"; crypto/tls keeps the alert in an unexported uint8 type) becomes a
// *AlertError, and the no_renegotiation crypto/tls answers a HelloRequest with becomes
// ErrRenegotiation, as on the kernel path. The rest pass unchanged.
func userErr(err error) error {
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Err == nil || (oe.Op != "remote error" && oe.Op != "local error") {
		return err
	}
	v := reflect.ValueOf(oe.Err)
	if v.Kind() != reflect.Uint8 {
		return err
	}
	a := &AlertError{Alert: uint8(v.Uint()), Received: oe.Op == "remote error"}
	if !a.Received && a.Alert == 100 {
		return ErrRenegotiation
	}
	return a
}
