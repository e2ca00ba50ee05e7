package zc

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/tcpglue"
)

// TestTLSRekeyOptions: RekeyRecords below 4 would leave no record for data under a key.
func TestTLSRekeyOptions(t *testing.T) {
	e := newEngine(t, Config{Queues: 1})
	scfg, ccfg := tlsConfigs(t, tls.VersionTLS13)
	_, err := e.Listen("tcp", "127.0.0.1:0", func(*Conn) Handler { return HandlerFuncs{} },
		ListenOptions{TLS: &TLSOptions{Config: scfg, RekeyRecords: 3}})
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "TLS.RekeyRecords" {
		t.Fatalf("Listen with RekeyRecords 3: %v, want a *ConfigError for TLS.RekeyRecords", err)
	}
	_, err = e.Dial(context.Background(), "tcp", "127.0.0.1:1", HandlerFuncs{},
		DialOptions{TLS: &TLSOptions{Config: ccfg, RekeyRecords: 1}})
	if !errors.As(err, &ce) || ce.Field != "TLS.RekeyRecords" {
		t.Fatalf("Dial with RekeyRecords 1: %v, want a *ConfigError for TLS.RekeyRecords", err)
	}
}

// TestTLSRekey: the engine updates a connection's TX keys by itself (a KeyUpdate, then the
// next TLS_TX keys) every RekeyRecords records, the application noticing nothing: a zc
// server echoing to crypto/tls clients, and a zc client writing (Write, then SendFile) to a
// crypto/tls echo server, every byte checked across the updates (crypto/tls reads on across KeyUpdates),
// the updates counted per connection and in Stats.TLS. It needs kernel TLS that takes new
// keys (Linux 6.14: the 7.3 guest); before it the bound is not enforced, visibly (RekeyAt 0).
func TestTLSRekey(t *testing.T) {
	if !wantKernelTLS(t) {
		t.Skip("no kernel TLS here (CONFIG_TLS is not set): the qemu guests run it")
	}
	testutil.SkipIfNotSupported(t, tcpglue.ProbeTLSRekey(), "6.14")
	const bound = 8
	for _, b := range tlsBackends {
		t.Run(b.String()+"/server", func(t *testing.T) {
			e := newTLSEngine(t, b)
			scfg, ccfg := tlsConfigs(t, tls.VersionTLS13)
			conns, ends := make(chan *Conn, 1), make(chan error, 1)
			l := tlsServerEcho(t, e, &TLSOptions{Config: scfg, RekeyRecords: bound}, conns, ends)
			if err := tlsEchoClient(l.Addr().String(), ccfg, tls.VersionTLS13, 1<<20, 11); err != nil {
				t.Fatalf("%v\n%s", err, engineDump(e)+tlsCloseErrsString())
			}
			c := recvEvent(t, conns, "conn")
			<-c.Done()
			checkRekeys(t, e, checkTLSPath(t, c), bound, 1<<20)
		})
		t.Run(b.String()+"/client", func(t *testing.T) {
			e := newTLSEngine(t, b)
			scfg, ccfg := tlsConfigs(t, tls.VersionTLS13)
			addr, sres := tlsPeerServer(t, scfg, func(tc *tls.Conn) error {
				if _, err := io.Copy(tc, tc); err != nil {
					return err
				}
				return tc.Close()
			})
			h := newTLSCollector()
			c, err := e.Dial(context.Background(), "tcp", addr, h, DialOptions{TLS: &TLSOptions{Config: ccfg, RekeyRecords: bound}})
			if err != nil {
				t.Fatal(err)
			}
			data := make([]byte, 1<<20)
			newStreamGen(12).fill(data)
			if err := randomWrites(c, data, 12); err != nil {
				t.Fatal(err)
			}
			// SendFile too (sendfile(2) into the kernel-TLS socket, cut at the bound).
			f, fdata := streamFile(t, 13, 512<<10+7)
			if err := c.SendFile(f, 0, int64(len(fdata))); err != nil {
				t.Fatal(err)
			}
			data = append(data, fdata...)
			endEcho(t, c, h, sres, data)
			checkRekeys(t, e, checkTLSPath(t, c), bound, len(data))
		})
	}
}

// checkRekeys checks that a connection that sent n bytes under a bound of bound records
// per key updated its TX keys at least as often as full records demand, and that the
// engine counted the same.
func checkRekeys(t *testing.T, e *Engine, st ConnStats, bound, n int) {
	t.Helper()
	info := st.TLS
	if info.RekeyAt != uint64(bound) {
		t.Fatalf("RekeyAt %d, want %d", info.RekeyAt, bound)
	}
	if least := uint64(n / ktlsMaxRecord / bound); info.TxRekeys < least {
		t.Fatalf("%d TX key updates for %d bytes, want at least %d (one per %d full records)", info.TxRekeys, n, least, bound)
	}
	if es := e.Stats().TLS; es.TxRekeys != info.TxRekeys || es.KeyUpdatesSent != 0 {
		t.Fatalf("engine TLS stats %+v, connection %+v: want the connection's TX updates, none asked for", es, info)
	}
	t.Logf("%d TX key updates for %d bytes (bound %d records)", info.TxRekeys, n, bound)
}

const ktlsMaxRecord = 16384

// tlsRelayPath is the path a relay of a TLS connection takes here: splice, except on
// kernel TLS before Linux 6.14 (SendData).
func tlsRelayPath(t *testing.T) RelayPath {
	if wantKernelTLS(t) && tcpglue.ProbeTLSRekey() != nil {
		return RelaySendData
	}
	return RelaySplice
}

// TestTLSRelaySplice: a TLS-terminating splice relay on kernel TLS with KeyUpdates both
// ways: a zc/ztls client rekeying every 8 records sends 1 MiB through the relay to a plain
// echo backend (each KeyUpdate stops the splice out of the TLS socket; the relay reads it,
// gives the kernel the next RX keys and splices on), and the listener's RekeyRecords 8
// makes the relay's splices into the TLS socket update their TX keys. Every byte comes
// back; the client's close_notify reaches the backend as its EOF, the backend's FIN comes
// back as close_notify. Linux 6.14 (the 7.3 guest).
func TestTLSRelaySplice(t *testing.T) {
	if !wantKernelTLS(t) {
		t.Skip("no kernel TLS here (CONFIG_TLS is not set): the qemu guests run it")
	}
	testutil.SkipIfNotSupported(t, tcpglue.ProbeTLSRekey(), "6.14")
	for _, b := range tlsBackends {
		t.Run(b.String(), func(t *testing.T) {
			e := newTLSEngine(t, b)
			scfg, ccfg := tlsConfigs(t, tls.VersionTLS13)
			backend := echoBackend(t)
			relays := make(chan *RelayStats, 1)
			fronts := make(chan *Conn, 1)
			l, err := e.Listen("tcp", "127.0.0.1:0", func(front *Conn) Handler {
				fronts <- front
				front.SetReceivePaused(true)
				e.DialAsync(context.Background(), "tcp", backend.Addr().String(), HandlerFuncs{}, func(back *Conn, err error) {
					if err != nil {
						front.Close()
						return
					}
					r, err := Relay(front, back, RelayOptions{Path: RelaySplice})
					if err != nil {
						t.Error(err)
						front.Close()
						back.Close()
						return
					}
					relays <- r
				})
				return HandlerFuncs{}
			}, ListenOptions{TLS: &TLSOptions{Config: scfg, RekeyRecords: 8}})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			zt := rekeyingEcho(t, e, l.Addr().String(), ccfg, 15, 2*time.Minute)
			r := recvEvent(t, relays, "relay")
			front := recvEvent(t, fronts, "front")
			<-front.Done()
			if r.Path != RelaySplice || r.AtoB.Load() != 1<<20 || r.BtoA.Load() != 1<<20 {
				t.Fatalf("relay %v forwarded %d and %d bytes (err %v)", r.Path, r.AtoB.Load(), r.BtoA.Load(), r.Err())
			}
			st := front.Stats().TLS
			es := e.Stats()
			if st.KeyUpdates == 0 || st.TxRekeys < 8 || zt.Info().KeyUpdates != st.TxRekeys || es.Forward.BytesSpliced == 0 {
				t.Fatalf("relay: %d KeyUpdates received (the client sent %d), %d TX updates (the client applied %d), %d bytes spliced",
					st.KeyUpdates, zt.Info().TxRekeys, st.TxRekeys, zt.Info().KeyUpdates, es.Forward.BytesSpliced)
			}
			t.Logf("%d KeyUpdates received and %d sent through the splice relay, %d bytes spliced", st.KeyUpdates, st.TxRekeys, es.Forward.BytesSpliced)
		})
	}
}
