package zc_test

// net/http over the net.Conn face (zc/netconn) on both ends.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/net/nettest"

	"github.com/zcnet/zcnet/zc"
	"github.com/zcnet/zcnet/zc/netconn"
)

// TestNetConnHTTP: net/http over the net.Conn face (zc/netconn) on both ends (the server
// on netconn.Listen, the client's transport dialing with netconn.Dial), concurrent requests with every
// body checked, then Engine.Close under traffic: Serve returns, no goroutine is left.
// nettest.TestConn runs on one engine of one queue whose send pool serves a few buffers.
func TestNetConnHTTP(t *testing.T) {
	eachBackend(t, func(t *testing.T, b zc.Backend) {
		checkLeaks(t)
		cfg := zc.Config{Queues: 1, Backend: b, NoFallback: true, SendBufSize: 16 << 10, SendBufs: 2, SendPoolMax: 64 << 10}
		t.Run("nettest", func(t *testing.T) {
			e := userEngine(t, cfg)
			nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
				ln, err := netconn.Listen(e, "tcp", "127.0.0.1:0")
				if err != nil {
					return nil, nil, nil, err
				}
				acc := make(chan net.Conn, 1)
				go func() {
					c, _ := ln.Accept()
					acc <- c
				}()
				c1, err = netconn.Dial(context.Background(), e, "tcp", ln.Addr().String())
				if err != nil {
					ln.Close()
					return nil, nil, nil, err
				}
				c2 = <-acc
				ln.Close()
				if c2 == nil {
					c1.Close()
					return nil, nil, nil, errors.New("no accepted connection")
				}
				return c1, c2, func() { c1.Close(); c2.Close() }, nil
			})
		})
		t.Run("http", func(t *testing.T) {
			e := userEngine(t, cfg)
			ln, err := netconn.Listen(e, "tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			served := make(chan error, 1)
			go func() {
				served <- http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					body, _ := io.ReadAll(r.Body)
					w.Write(frameAnswer(body))
				}))
			}()
			tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return netconn.Dial(ctx, e, network, addr)
			}}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr, Timeout: userBound}
			var wg sync.WaitGroup
			var failed sync.Map
			stop := make(chan struct{})
			twice := make(chan struct{}, 8)
			var closing atomic.Bool
			for i := 0; i < 8; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					rng := rand.New(rand.NewSource(int64(i)))
					for j := 0; ; j++ {
						select {
						case <-stop:
							return
						default:
						}
						req := make([]byte, rng.Intn(100000))
						rng.Read(req)
						resp, err := client.Post("http://"+ln.Addr().String()+"/", "application/octet-stream", bytes.NewReader(req))
						if err != nil {
							if !closing.Load() {
								failed.Store(fmt.Sprintf("client %d request %d", i, j), err)
							}
							return // the engine closed under it
						}
						if j == 1 {
							twice <- struct{}{}
						}
						got, err := io.ReadAll(resp.Body)
						resp.Body.Close()
						if err == nil && !bytes.Equal(got, frameAnswer(req)) {
							failed.Store(fmt.Sprintf("client %d request %d", i, j), "wrong body")
							return
						}
					}
				}(i)
			}
			for i := 0; i < 8; i++ {
				within(t, "first requests", func() { <-twice })
			}
			closing.Store(true)
			within(t, "Engine.Close", func() { e.Close() })
			close(stop)
			within(t, "http clients", wg.Wait)
			var serr error
			within(t, "http.Serve", func() { serr = <-served })
			if !errors.Is(serr, net.ErrClosed) {
				t.Errorf("http.Serve after Engine.Close: %v", serr)
			}
			failed.Range(func(k, v any) bool {
				t.Errorf("%v: %v", k, v)
				return true
			})
		})
	})
}
