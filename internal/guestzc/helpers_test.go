package guestzc

import (
	"fmt"
	"io"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/tcpglue"
)

// pat is the byte at offset off of every test stream: not periodic at any power of two
// below 64 KiB, so a buffer sent twice, skipped or reordered shows.
func pat(seed, off uint64) byte {
	x := off + seed*0x9e3779b97f4a7c15
	return byte(x ^ x>>9 ^ x>>17)
}

// fillPat writes the stream's bytes from offset off into p.
func fillPat(p []byte, seed, off uint64) {
	for i := range p {
		p[i] = pat(seed, off+uint64(i))
	}
}

// checker verifies a stream against pat as it arrives.
type checker struct {
	seed uint64
	off  uint64
	bad  error
}

// write checks p, the stream's next bytes; it keeps the first mismatch.
func (c *checker) write(p []byte) {
	for i, b := range p {
		if c.bad == nil && b != pat(c.seed, c.off+uint64(i)) {
			c.bad = fmt.Errorf("byte %d of the stream is %#x, want %#x", c.off+uint64(i), b, pat(c.seed, c.off+uint64(i)))
		}
	}
	c.off += uint64(len(p))
}

func (c *checker) Write(p []byte) (int, error) { c.write(p); return len(p), nil }

// mmapPat maps n bytes (page-aligned memory, as the kernel pins it) filled with the stream
// of seed; unmapped at the test's cleanup.
func mmapPat(t testing.TB, n int, seed uint64) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	fillPat(b, seed, 0)
	return b
}

// sink is a plain TCP listener whose connections are read to the end and checked against
// pat(seed): one result per connection on done.
type sink struct {
	l    *tcpglue.Socket
	addr netip.AddrPort
	done chan sinkResult
}

type sinkResult struct {
	n   uint64 // bytes read before the end (EOF or a read error)
	err error  // the read error (nil at EOF)
	bad error  // the first byte that differs from the stream
}

// ok fails the test unless the connection read exactly want bytes, all as sent, to EOF.
func (r sinkResult) ok(t testing.TB, want int) {
	t.Helper()
	if r.err != nil || r.bad != nil || r.n != uint64(want) {
		t.Fatalf("receiver: %d of %d bytes, read error %v, content %v", r.n, want, r.err, r.bad)
	}
}

// newSink listens on ap (port 0: any) in the caller's namespace, or in the pair's peer
// namespace when pair is not nil, and checks nconns connections.
func newSink(t testing.TB, pair *testutil.NICPair, ap netip.AddrPort, seed uint64, nconns int) *sink {
	t.Helper()
	k := &sink{done: make(chan sinkResult, nconns)}
	listen := func() (err error) {
		k.l, err = tcpglue.ListenAddrPort("tcp4", ap, tcpglue.ListenOptions{})
		return err
	}
	var err error
	if pair != nil {
		err = pair.In(listen)
	} else {
		err = listen()
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.l.Close() })
	if k.addr, err = k.l.LocalAddr(); err != nil {
		t.Fatal(err)
	}
	go func() {
		for i := 0; i < nconns; i++ {
			s, _, err := k.l.Accept()
			if err != nil {
				k.done <- sinkResult{err: err}
				return
			}
			go func() {
				defer s.Close()
				c := &checker{seed: seed}
				_, err := io.Copy(c, s)
				k.done <- sinkResult{n: c.off, err: err, bad: c.bad}
			}()
		}
	}()
	return k
}

// result waits for the sink's next connection to end.
func (k *sink) result(t testing.TB) sinkResult {
	t.Helper()
	select {
	case r := <-k.done:
		return r
	case <-time.After(2 * time.Minute):
		t.Fatal("receiver never reached the end of its stream")
		return sinkResult{}
	}
}
