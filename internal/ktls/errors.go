package ktls

import (
	"errors"
	"net"
	"reflect"

	"github.com/zcnet/zcnet/tcpglue"
)

// ErrRenegotiation is tcpglue.ErrTLSRenegotiation.
var ErrRenegotiation = tcpglue.ErrTLSRenegotiation

// AlertError is tcpglue.TLSAlertError (a public package, so that zc and zc/ztls name one
// type).
type AlertError = tcpglue.TLSAlertError

// UserErr maps crypto/tls's errors to this package's: an alert received ("remote
// error") or sent ("local error"; crypto/tls keeps the alert in an unexported uint8 type)
// becomes a *AlertError, and the no_renegotiation crypto/tls answers a HelloRequest with
// becomes ErrRenegotiation, as on the kernel path. The rest pass unchanged.
func UserErr(err error) error {
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
