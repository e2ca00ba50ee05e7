package zc

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Handler methods are serialized on every backend: a handler whose state is touched
// without locks from OnData, OnWritable, OnEOF, OnClose and functions given to Conn.Post
// (posted from other goroutines) must be race-free. Under -race the detector checks the
// unsynchronized fields; without it the "inside" counter catches two methods running at once.

type serialHandler struct {
	inside  atomic.Int32 // methods running now: never more than one
	overlap atomic.Int32

	// Unsynchronized: only ever touched from handler methods and posted functions.
	data, writable, posted, eof int
	bytes                       int
	last                        string
	echo                        bool // echo by copy (Buffer + Send), so OnWritable runs
}

func (h *serialHandler) enter(what string) {
	if h.inside.Add(1) != 1 {
		h.overlap.Add(1)
	}
	h.last = what
}

func (h *serialHandler) exit() { h.inside.Add(-1) }

func (h *serialHandler) OnData(c *Conn, d Data) {
	h.enter("OnData")
	defer h.exit()
	h.data++
	h.bytes += d.Len()
	if h.echo {
		if b, err := c.Buffer(); err == nil {
			n := copy(b.Bytes(), d.Bytes())
			c.Send(b, n) // a short echo is fine: only the serialization is checked
		}
	}
	d.Release()
}

func (h *serialHandler) OnWritable(c *Conn) {
	h.enter("OnWritable")
	defer h.exit()
	h.writable++
	if h.eof > 0 && c.Queued() == 0 {
		c.Close() // everything echoed went out
	}
}

// OnEOF closes once the echo is out (here, or in the OnWritable that follows the last send),
// so every echoing handler sees OnWritable at least once.
func (h *serialHandler) OnEOF(c *Conn, err error) {
	h.enter("OnEOF")
	defer h.exit()
	h.eof++
	if !h.echo || c.Queued() == 0 {
		c.Close()
	}
}

func (h *serialHandler) OnClose(c *Conn, err error) {
	h.enter("OnClose")
	defer h.exit()
	h.last = fmt.Sprint("closed: ", err)
}

func (h *serialHandler) post(c *Conn) error {
	return c.Post(func() {
		h.enter("posted")
		defer h.exit()
		h.posted++
	})
}

func TestHandlersSerialized(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) { testHandlersSerialized(t, Config{Backend: b, Queues: 2, NoPin: true}) })
}

func testHandlersSerialized(t *testing.T, cfg Config) {
	srv, cli := newPair(t, cfg)
	const conns = 4
	const total = 2 << 20
	srvHs := make(chan *serialHandler, conns)
	sconns := make(chan *Conn, conns)
	l, err := srv.Listen("tcp", "127.0.0.1:0", func(c *Conn) Handler {
		h := &serialHandler{echo: true}
		h.enter("accept")
		h.exit()
		srvHs <- h
		sconns <- c
		return h
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var wg sync.WaitGroup
	var cliHs []*serialHandler
	var cs []*Conn
	for i := 0; i < conns; i++ {
		h := &serialHandler{}
		c, err := cli.Dial(context.Background(), "tcp", l.Addr().String(), h)
		if err != nil {
			t.Fatal(err)
		}
		cliHs = append(cliHs, h)
		cs = append(cs, c)
	}
	var srvConns []*Conn
	var srvH []*serialHandler
	for i := 0; i < conns; i++ {
		srvConns = append(srvConns, recvEvent(t, sconns, "accept"))
		srvH = append(srvH, recvEvent(t, srvHs, "handler"))
	}
	// Posters hammer every connection's queue while data flows both ways.
	stop := make(chan struct{})
	var posts atomic.Int64
	// Every poster gets one post accepted before the data starts (an accepted Post always
	// runs), so each handler sees posted functions whatever the scheduler does.
	var first sync.WaitGroup
	for i := 0; i < conns; i++ {
		for _, pair := range []struct {
			c *Conn
			h *serialHandler
		}{{cs[i], cliHs[i]}, {srvConns[i], srvH[i]}} {
			wg.Add(1)
			first.Add(1)
			go func() {
				defer wg.Done()
				if err := pair.h.post(pair.c); err != nil {
					t.Errorf("first post: %v", err)
				}
				posts.Add(1)
				first.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if pair.h.post(pair.c) == nil {
						posts.Add(1)
					}
					time.Sleep(50 * time.Microsecond)
				}
			}()
		}
	}
	first.Wait()
	var writers sync.WaitGroup
	for _, c := range cs {
		writers.Add(1)
		go func() {
			defer writers.Done()
			p := make([]byte, 16<<10)
			for sent := 0; sent < total; sent += len(p) {
				if _, err := c.Write(p); err != nil {
					t.Error(err)
					return
				}
			}
			c.CloseWrite()
		}()
	}
	writers.Wait()
	// The servers see EOF and close; then the clients finish.
	for _, c := range cs {
		select {
		case <-c.Done():
		case <-time.After(30 * time.Second):
			t.Fatalf("client connection not done\nclient:\n%sserver:\n%s", engineDump(cli), engineDump(srv))
		}
	}
	close(stop)
	wg.Wait()
	for _, c := range srvConns {
		<-c.Done()
	}
	// Read the handlers' state on their own queues (serialized with them).
	for i, h := range append(srvH, cliHs...) {
		c := append(srvConns, cs...)[i]
		type snap struct{ data, writable, posted, eof, bytes int }
		ch := make(chan snap, 1)
		q := c.q
		if err := q.Post(func() { ch <- snap{h.data, h.writable, h.posted, h.eof, h.bytes} }); err != nil {
			t.Fatal(err)
		}
		s := <-ch
		if n := h.overlap.Load(); n != 0 {
			t.Errorf("handler %d: %d times two methods ran at once", i, n)
		}
		server := i < conns
		if server && (s.bytes != total || s.writable == 0 || s.eof != 1) {
			t.Errorf("server handler %d: %+v (want %d bytes, OnWritable calls, one EOF)", i, s, total)
		}
		if s.posted == 0 {
			t.Errorf("handler %d: no posted function ran", i)
		}
		t.Logf("handler %d: %+v conn %+v", i, s, c.Stats())
	}
	t.Logf("%d functions posted", posts.Load())
}
