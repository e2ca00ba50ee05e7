package ktls

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"testing"

	"github.com/zcnet/zcnet/tcpglue"
)

// fakeOps records what Control asked of the connection.
type fakeOps struct {
	alerts, warns []uint8
	rx            []*tcpglue.TLSCrypto
	owed          int
	rxErr         error
}

func (f *fakeOps) Alert(d uint8) { f.alerts = append(f.alerts, d) }
func (f *fakeOps) Warn(d uint8)  { f.warns = append(f.warns, d) }
func (f *fakeOps) SetRX(c *tcpglue.TLSCrypto) error {
	if f.rxErr != nil {
		return f.rxErr
	}
	f.rx = append(f.rx, c)
	return nil
}
func (f *fakeOps) KeyUpdateOwed() { f.owed++ }

func newControl(v uint16) *Control {
	s := Suites[tls.TLS_AES_128_GCM_SHA256]
	return &Control{Version: v, Suite: s, RX: bytes.Repeat([]byte{7}, 32)}
}

// feedPieces feeds b in pieces of step bytes, as the kernel may hand a record over.
func feedPieces(c *Control, typ uint8, b []byte, step int, ops Ops) error {
	for i := 0; i < len(b); i += step {
		if err := c.Feed(typ, b[i:min(i+step, len(b))], ops); err != nil {
			return err
		}
	}
	return nil
}

// TestControl: each kind of non-data record, whole and in pieces, gives the result and
// asks the connection for what RFC 8446 wants.
func TestControl(t *testing.T) {
	for _, step := range []int{1, 2, 3, 100} {
		// close_notify is the EOF; user_canceled (warning) is skipped.
		ops := &fakeOps{}
		c := newControl(tls.VersionTLS13)
		if err := feedPieces(c, TypeAlert, []byte{1, 90, 1, 0}, step, ops); err != io.EOF {
			t.Fatalf("step %d: user_canceled+close_notify: %v", step, err)
		}
		// A fatal alert is a received *AlertError.
		c = newControl(tls.VersionTLS13)
		err := feedPieces(c, TypeAlert, []byte{2, 40}, step, ops)
		var ae *AlertError
		if !errors.As(err, &ae) || ae.Alert != 40 || !ae.Received {
			t.Fatalf("step %d: fatal alert: %v", step, err)
		}
		// KeyUpdate (requested): next RX keys from the traffic secret, our update owed.
		c = newControl(tls.VersionTLS13)
		ops = &fakeOps{}
		first := append([]byte(nil), c.RX...)
		if err := feedPieces(c, TypeHandshake, []byte{24, 0, 0, 1, 1}, step, ops); err != nil {
			t.Fatalf("step %d: KeyUpdate: %v", step, err)
		}
		next := NextSecret13(c.Suite, first)
		if len(ops.rx) != 1 || ops.owed != 1 || !bytes.Equal(c.RX, next) || c.KeyUpdates.Load() != 1 ||
			!bytes.Equal(ops.rx[0].Key, TrafficKeys13(c.Suite, next, 0).Key) || ops.rx[0].Seq != 0 {
			t.Fatalf("step %d: KeyUpdate: %+v, RX %x", step, ops, c.RX)
		}
		// A session ticket (TLS 1.3) is dropped and counted.
		ticket := append([]byte{4, 0, 0, 8}, make([]byte, 8)...)
		if err := feedPieces(c, TypeHandshake, ticket, step, ops); err != nil || c.Tickets.Load() != 1 {
			t.Fatalf("step %d: ticket: %v, %d", step, err, c.Tickets.Load())
		}
		if c.Pending() {
			t.Fatalf("step %d: bytes held after whole records", step)
		}
	}
}

// TestControlRefusals: what the connection must not accept ends it with the right alert.
func TestControlRefusals(t *testing.T) {
	cases := []struct {
		name    string
		version uint16
		typ     uint8
		b       []byte
		alert   uint8 // fatal alert sent (0: none)
		want    error
	}{
		{"KeyUpdate of a bad length", tls.VersionTLS13, TypeHandshake, []byte{24, 0, 0, 2, 1, 0}, 50, &AlertError{Alert: 50}},
		{"KeyUpdate of a bad value", tls.VersionTLS13, TypeHandshake, []byte{24, 0, 0, 1, 2}, 50, &AlertError{Alert: 50}},
		{"HelloRequest in 1.2", tls.VersionTLS12, TypeHandshake, []byte{0, 0, 0, 0}, 0, ErrRenegotiation},
		{"KeyUpdate in 1.2", tls.VersionTLS12, TypeHandshake, []byte{24, 0, 0, 1, 0}, 10, &AlertError{Alert: 10}},
		{"unknown record type", tls.VersionTLS13, 99, []byte{1}, 10, &AlertError{Alert: 10}},
	}
	for _, tc := range cases {
		ops := &fakeOps{}
		err := newControl(tc.version).Feed(tc.typ, tc.b, ops)
		if err == nil || err.Error() != tc.want.Error() {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if tc.alert != 0 && (len(ops.alerts) != 1 || ops.alerts[0] != tc.alert) {
			t.Errorf("%s: alerts sent %v, want %d", tc.name, ops.alerts, tc.alert)
		}
	}
	// A record type change in the middle of a control record is unexpected_message.
	c, ops := newControl(tls.VersionTLS13), &fakeOps{}
	c.Feed(TypeHandshake, []byte{24, 0}, ops)
	if err := c.Feed(TypeAlert, []byte{1, 0}, ops); err == nil || len(ops.alerts) != 1 || ops.alerts[0] != 10 {
		t.Fatalf("type change: %v %v", err, ops.alerts)
	}
	// More than 64 KiB held is refused, not kept.
	c, ops = newControl(tls.VersionTLS13), &fakeOps{}
	big := append([]byte{4, 0xff, 0xff, 0xff}, make([]byte, 70_000)...)
	if err := feedPieces(c, TypeHandshake, big, 16384, ops); err == nil || c.Held() > 1<<16+16384 {
		t.Fatalf("oversized message: %v, held %d", err, c.Held())
	}
	// A KeyUpdate the kernel cannot follow is an error that says so.
	c, ops = newControl(tls.VersionTLS13), &fakeOps{rxErr: errors.New("EBUSY")}
	if err := c.Feed(TypeHandshake, []byte{24, 0, 0, 1, 0}, ops); err == nil || c.KeyUpdates.Load() != 0 {
		t.Fatalf("refused rekey: %v", err)
	}
}
