package ztls

import (
	"errors"

	"github.com/zcnet/zcnet/internal/errs"
	"github.com/zcnet/zcnet/tcpglue"
)

// ErrNotSupported is zcnet's one "this kernel or machine cannot" sentinel (it is
// zc.ErrNotSupported and tcpglue.ErrNotSupported): a *NoKernelError matches it.
var ErrNotSupported = errs.ErrNotSupported

// ErrRenegotiation: the peer asked for a TLS 1.2 renegotiation (HelloRequest), which ztls
// refuses: it answers with a no_renegotiation warning alert and the read fails with this.
var ErrRenegotiation = tcpglue.ErrTLSRenegotiation

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
// io.EOF. The same type comes from both paths, kernel and user space, and from zc's
// event-loop TLS (zc's TLS connections end with the same type).
type AlertError = tcpglue.TLSAlertError
