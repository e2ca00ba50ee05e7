package zc

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/ktls"
	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/tcpglue"
)

// TestTLSSpliceControlRecord measures what splice(2) out of a kernel-TLS socket does at a
// non-data record (the question behind the refusal of the splice relay on kernel TLS):
// data, a warning alert, data arrive on a kernel-TLS socket; splice moves the first data
// into a pipe, then fails at the alert; one recvmsg with room for the record type reads
// the alert (the queue's control path), and splice resumes with the data after it.
func TestTLSSpliceControlRecord(t *testing.T) {
	if !wantKernelTLS(t) {
		t.Skip("no kernel TLS here (CONFIG_TLS is not set): the qemu guests run it")
	}
	// The splice relay over kernel TLS is offered from Linux 6.14 (tlsSpliceRefusal), where
	// this was measured; older kernels keep SendData.
	testutil.SkipIfNotSupported(t, tcpglue.ProbeTLSRekey(), "6.14")
	for _, v := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
		t.Run(tls.VersionName(v), func(t *testing.T) {
			scfg, ccfg := tlsConfigs(t, v)
			scfg = scfg.Clone()
			scfg.SessionTicketsDisabled = true // no ticket ahead of the data
			ln, err := net.Listen("tcp4", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			acc := make(chan net.Conn, 1)
			go func() { c, _ := ln.Accept(); acc <- c }()
			cli, err := net.Dial("tcp4", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			srv := recvEvent(t, acc, "accept")
			if srv == nil {
				t.Fatal("accept failed")
			}
			defer srv.Close()
			sh, ch := ktls.Server(srv, ktls.ServerConfig(scfg)), ktls.Client(cli, ccfg, false)
			herr := make(chan error, 1)
			go func() { herr <- sh.Run(context.Background()) }()
			if err := ch.Run(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := recvEvent(t, herr, "server handshake"); err != nil {
				t.Fatal(err)
			}
			install := func(nc net.Conn, h *ktls.Handshake) {
				tx, rx, err := h.Keys()
				if err != nil {
					t.Fatal(err)
				}
				if err := withFD(nc, func(fd int) error { _, err := ktls.Install(fd, false, tx, rx); return err }); err != nil {
					t.Fatal(err)
				}
			}
			install(srv, sh)
			install(cli, ch)
			first, second := sslDigits(1000, 41), sslDigits(1500, 42)
			if err := withFD(srv, func(fd int) error {
				if _, err := unix.Write(fd, first); err != nil {
					return err
				}
				if _, err := tcpglue.SendTLSRecord(fd, ktls.TypeAlert, []byte{1, 90}, 0); err != nil { // user_canceled, a warning
					return err
				}
				_, err := unix.Write(fd, second)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			var p [2]int
			if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
				t.Fatal(err)
			}
			defer unix.Close(p[0])
			defer unix.Close(p[1])
			var spliced int
			var errs []error
			sawAlert := false
			buf := make([]byte, ktls.MaxRecord+256)
			if err := withFD(cli, func(fd int) error {
				var pfd = []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
				for i := 0; spliced < len(first)+len(second) && i < 1000; i++ {
					if _, err := unix.Poll(pfd, 10_000); err != nil && !errors.Is(err, unix.EINTR) {
						return err
					}
					n, err := unix.Splice(fd, nil, p[1], nil, 65536, unix.SPLICE_F_NONBLOCK)
					switch {
					case err == nil && n == 0:
						return errors.New("splice: end of stream")
					case err == nil:
						spliced += int(n)
						continue
					case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR):
						continue
					}
					errs = append(errs, err)
					if len(errs) > 3 {
						return errors.Join(errs...)
					}
					// The control path: one recvmsg with room for the record type.
					k, typ, rerr := tcpglue.RecvTLS(fd, buf, unix.MSG_DONTWAIT)
					if rerr != nil {
						return rerr
					}
					t.Logf("splice at %d bytes: %v; recvmsg then read a record of type %d, %d bytes", spliced, err, typ, k)
					if typ != ktls.TypeAlert || k != 2 || buf[1] != 90 {
						return errors.New("not the alert")
					}
					sawAlert = true
				}
				return nil
			}); err != nil {
				t.Fatalf("%v (spliced %d bytes, errors %v)", err, spliced, errs)
			}
			if !sawAlert || spliced != len(first)+len(second) || len(errs) != 1 {
				t.Fatalf("spliced %d of %d bytes, alert read %v, splice errors %v", spliced, len(first)+len(second), sawAlert, errs)
			}
			got := make([]byte, spliced)
			if n, err := unix.Read(p[0], got); err != nil || n != spliced || string(got) != string(first)+string(second) {
				t.Fatalf("the pipe holds %d bytes (%v), not the data in order", n, err)
			}
			t.Logf("splice out of kernel TLS stops at a non-data record with %v; after a recvmsg took the record it resumes", errs[0])
		})
	}
}
