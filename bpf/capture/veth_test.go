package capture

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gopacket/gopacket/pcapgo"

	"github.com/zcnet/zcnet/internal/netns"
	"github.com/zcnet/zcnet/internal/testutil"
	"github.com/zcnet/zcnet/zc"
	"github.com/zcnet/zcnet/zc/netconn"
)

// zcEngine starts a zc engine for a test. Its listeners use the kernel's
// reuseport hashing, not zcnet's steering programs: the flows do not need
// them, and bpf's tests count every steering program loaded on the
// machine while they run (packages are tested in parallel).
func zcEngine(t *testing.T) *zc.Engine {
	t.Helper()
	e, err := zc.New(zc.Config{Queues: 2, NoPin: true, Steering: zc.SteerReuseportHash})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// echoListener listens with zc's net.Listener face in namespace ns and
// echoes every connection until it closes.
func echoListener(t *testing.T, v *testutil.VethPair, e *zc.Engine) netip.AddrPort {
	t.Helper()
	var ln net.Listener
	v.In(t, v.Srv, func() (err error) {
		ln, err = netconn.Listen(e, "tcp", netip.AddrPortFrom(v.SrvAddr, 0).String())
		return err
	})
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				echoConn(c)
				if cw, ok := c.(interface{ CloseWrite() error }); ok {
					cw.CloseWrite()
				}
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// echoConn echoes until EOF with plain Read and Write calls.
func echoConn(c net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// echoExchange dials to from the client namespace with zc, sends payload
// while reading the echo, and checks every byte came back. It returns the
// connection's local address.
func echoExchange(t *testing.T, v *testutil.VethPair, e *zc.Engine, to netip.AddrPort, payload []byte) (netip.AddrPort, error) {
	var c netconn.Conn
	err := netns.Do(v.Cli.Fd(), func() (err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err = netconn.Dial(ctx, e, "tcp", to.String())
		return err
	})
	if err != nil {
		return netip.AddrPort{}, err
	}
	defer c.Close()
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(payload)
		werr <- err
	}()
	// Read exactly what was sent, then close (no half-close: what a
	// connection does after its last byte is not what these tests check).
	got := make([]byte, len(payload))
	if _, err := io.ReadFull(c, got); err != nil {
		return local, fmt.Errorf("read echo: %w", err)
	}
	if err := <-werr; err != nil {
		return local, fmt.Errorf("write: %w", err)
	}
	if !bytes.Equal(got, payload) {
		return local, fmt.Errorf("echo differs: %d bytes back of %d (sha256 %x vs %x)", len(got), len(payload), sha256.Sum256(got), sha256.Sum256(payload))
	}
	return local, nil
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// startCapture starts a capture in the server namespace writing to a
// temporary file.
func startCapture(t *testing.T, v *testutil.VethPair, opts Options, sel ...Selector) (*Capture, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cap.pcapng")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	var c *Capture
	v.In(t, v.Srv, func() (err error) {
		c, err = New(f, opts, sel...)
		return err
	})
	t.Cleanup(func() { c.Close() })
	return c, path
}

// readPcapng reads a capture file with gopacket's pcapng reader.
type pcapPacket struct {
	ts     time.Time
	data   []byte
	length int
	iface  int
	opts   pcapgo.NgPacketOptions
}

func readPcapng(t *testing.T, path string) (*pcapgo.NgReader, []pcapPacket) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewNgReader(f, pcapgo.NgReaderOptions{})
	if err != nil {
		t.Fatalf("pcapng reader: %v", err)
	}
	var out []pcapPacket
	for {
		var p pcapPacket
		data, ci, opts, err := r.ReadPacketDataWithOptions()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("pcapng reader: packet %d: %v", len(out), err)
		}
		p.data, p.ts, p.length, p.iface, p.opts = data, ci.Timestamp, ci.Length, ci.InterfaceIndex, opts
		out = append(out, p)
	}
	return r, out
}

// tshark runs tshark on a file and returns its output; the test is
// skipped when tshark is not installed (make test installs it).
func tshark(t *testing.T, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed (make test installs it: apt-get install tshark)")
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir()) // no profile of the user
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tshark %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// followTCP returns both directions of TCP stream 0 of a capture,
// reassembled by tshark: from the node that sent the first packet (the
// client when the handshake was captured), and to it.
func followTCP(t *testing.T, path string, stream int) (fromFirst, toFirst []byte) {
	out := tshark(t, "-r", path, "-q", "-z", fmt.Sprintf("follow,tcp,raw,%d", stream))
	var a, b bytes.Buffer
	body := false
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, "Node 1:"):
			body = true
			continue
		case strings.HasPrefix(line, "===="):
			body = false
			continue
		case !body || strings.TrimSpace(line) == "":
			continue
		}
		dst := &a
		if strings.HasPrefix(line, "\t") {
			dst = &b
		}
		raw, err := hex.DecodeString(strings.TrimSpace(line))
		if err != nil {
			t.Fatalf("tshark follow output: %q: %v", line, err)
		}
		dst.Write(raw)
	}
	return a.Bytes(), b.Bytes()
}

// TestCaptureListenerVeth captures a zc listener's flows across a veth
// pair while another listener's flow runs, and checks the file with
// tshark: the handshake, every payload byte both ways (reassembled),
// timestamps that never go back, nothing of the other flow.
func TestCaptureListenerVeth(t *testing.T) {
	v := newVethPair(t, 2)
	e := zcEngine(t)
	chosen := echoListener(t, v, e)
	other := echoListener(t, v, e)
	c, path := startCapture(t, v, Options{Interfaces: []int{v.SrvIdx}, Snap: MaxSnap, RingSize: 32 << 20}, Listener(chosen))

	// veth has software timestamps only, and says so.
	if ifs := c.Interfaces(); len(ifs) != 1 || ifs[0].Name != v.SrvIf || ifs[0].HWTimestamping || ifs[0].TimestampInfoErr != nil ||
		!strings.Contains(ifs[0].Timestamps(), "no hardware timestamping") {
		t.Errorf("interfaces: %+v", ifs)
	}
	payload := randomBytes(1 << 20)
	var wg sync.WaitGroup
	var otherErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 4 && otherErr == nil; i++ {
			_, otherErr = echoExchange(t, v, e, other, randomBytes(256<<10))
		}
	}()
	client, err := echoExchange(t, v, e, chosen, payload)
	if err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if otherErr != nil {
		t.Fatal(otherErr)
	}
	// Let the FIN/ACK exchange finish before stopping.
	time.Sleep(50 * time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	st, _ := c.Stats()
	t.Logf("stats: %+v", st)
	if st.Dropped != 0 || st.Truncated != 0 || st.OutOfOrder != 0 || st.BadRecords != 0 || st.Written != st.Captured || st.Captured != st.Matched {
		t.Errorf("counters: %+v", st)
	}

	// gopacket's reader: the interface description and the packets.
	r, pkts := readPcapng(t, path)
	if r.NInterfaces() != 1 {
		t.Fatalf("%d interfaces in the file", r.NInterfaces())
	}
	ifc, _ := r.Interface(0)
	if ifc.Name != v.SrvIf || ifc.TimestampResolution != 9 || ifc.LinkType != 1 || !strings.Contains(ifc.Description, "software") ||
		!strings.Contains(ifc.Description, "no hardware timestamping") {
		t.Errorf("interface description: %+v", ifc)
	}
	if uint64(len(pkts)) != st.Written {
		t.Errorf("%d packets in the file, %d written", len(pkts), st.Written)
	}
	var in, out int
	queues := map[string]int{}
	for i, p := range pkts {
		if p.opts.Queue != nil {
			queues[fmt.Sprint(*p.opts.Queue)]++
		} else {
			queues["none"]++
		}
		if i > 0 && p.ts.Before(pkts[i-1].ts) {
			t.Errorf("packet %d: timestamp %v before the previous %v", i, p.ts, pkts[i-1].ts)
		}
		if p.opts.Flags == nil {
			t.Fatalf("packet %d has no direction", i)
		}
		switch p.opts.Flags.Direction {
		case pcapgo.NgEpbFlagDirectionInbound:
			in++
		case pcapgo.NgEpbFlagDirectionOutbound:
			out++
		}
	}
	if in == 0 || out == 0 {
		t.Errorf("inbound %d, outbound %d packets", in, out)
	}
	if d := time.Since(pkts[0].ts); d < 0 || d > time.Minute {
		t.Errorf("first timestamp %v is %v from now: not UTC?", pkts[0].ts, d)
	}

	// tshark, an independent reader.
	fields := tshark(t, "-r", path, "-T", "fields", "-E", "separator=,", "-e", "frame.time_epoch",
		"-e", "ip.src", "-e", "tcp.srcport", "-e", "ip.dst", "-e", "tcp.dstport", "-e", "tcp.flags.syn",
		"-e", "tcp.flags.ack", "-e", "frame.interface_name")
	var syn, synack int
	prev := 0.0
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(fields), "\n") {
		f := strings.Split(line, ",")
		if len(f) != 8 {
			t.Fatalf("tshark line %q", line)
		}
		n++
		ts, err := strconv.ParseFloat(f[0], 64)
		if err != nil || ts < prev {
			t.Errorf("tshark: timestamp %s after %f", f[0], prev)
		}
		prev = ts
		sport, dport := f[2], f[4]
		cp := strconv.Itoa(int(chosen.Port()))
		if sport != cp && dport != cp {
			t.Errorf("tshark: packet of another flow: %s", line)
		}
		if f[7] != v.SrvIf {
			t.Errorf("tshark: interface %q", f[7])
		}
		if f[5] == "1" && f[6] == "0" {
			syn++
			if f[1] != client.Addr().String() || f[2] != strconv.Itoa(int(client.Port())) {
				t.Errorf("SYN from %s:%s, client is %v", f[1], f[2], client)
			}
		}
		if f[5] == "1" && f[6] == "1" {
			synack++
		}
	}
	if n != len(pkts) {
		t.Errorf("tshark read %d packets, gopacket %d", n, len(pkts))
	}
	if syn != 1 || synack != 1 {
		t.Errorf("handshake: %d SYN, %d SYN-ACK", syn, synack)
	}
	sent, echoed := followTCP(t, path, 0)
	if !bytes.Equal(sent, payload) || !bytes.Equal(echoed, payload) {
		t.Errorf("reassembled by tshark: %d bytes client->server, %d back, want %d each (equal: %v %v)",
			len(sent), len(echoed), len(payload), bytes.Equal(sent, payload), bytes.Equal(echoed, payload))
	}
	t.Logf("%d packets (%d in, %d out; RX queues recorded %v), handshake and %d payload bytes each way reassembled by tshark", len(pkts), in, out, queues, len(payload))
}

// TestRingFull: a ring of one page under bulk load loses packets; the
// loss shows in the counters, in the packets that follow a loss (drop
// count and comment) and in the interface statistics, and the flow itself
// keeps every byte.
func TestRingFull(t *testing.T) {
	v := newVethPair(t, 1)
	e := zcEngine(t)
	srv := echoListener(t, v, e)
	snap := 1514
	c, path := startCapture(t, v, Options{Interfaces: []int{v.SrvIdx}, Snap: snap, RingSize: minRingSize(snap)}, Listener(srv))
	if _, err := echoExchange(t, v, e, srv, randomBytes(16<<20)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	st, _ := c.Stats()
	t.Logf("ring %d bytes: %+v", minRingSize(snap), st)
	if st.Dropped == 0 {
		t.Fatalf("no drops with a %d-byte ring under bulk load", minRingSize(snap))
	}
	if st.Matched != st.Captured+st.Dropped || st.Written != st.Captured || st.BadRecords != 0 {
		t.Errorf("counters disagree: %+v", st)
	}
	if st.Truncated == 0 {
		t.Errorf("no truncated packets with snap %d", snap)
	}
	r, pkts := readPcapng(t, path)
	var inFile uint64
	comments := 0
	for _, p := range pkts {
		if p.opts.DropCount != nil {
			inFile += *p.opts.DropCount
			if len(p.opts.Comments) != 1 || !strings.Contains(p.opts.Comments[0], "capture ring full") {
				t.Errorf("drop count %d without its comment: %q", *p.opts.DropCount, p.opts.Comments)
			}
			comments++
		}
		if len(p.data) > snap || len(p.data) > p.length {
			t.Errorf("packet of %d bytes captured %d with snap %d", p.length, len(p.data), snap)
		}
	}
	if inFile == 0 || inFile > st.Dropped {
		t.Errorf("drop counts in the file sum to %d, %d dropped", inFile, st.Dropped)
	}
	ifc, _ := r.Interface(0)
	if ifc.Statistics.PacketsDropped != st.Dropped || ifc.Statistics.PacketsReceived != st.Matched {
		t.Errorf("interface statistics block: %+v, counters %+v", ifc.Statistics, st)
	}
	// tshark sees the same drop counts.
	var tsum uint64
	for _, f := range strings.Fields(tshark(t, "-r", path, "-Y", "frame.drop_count", "-T", "fields", "-e", "frame.drop_count")) {
		n, _ := strconv.ParseUint(f, 10, 64)
		tsum += n
	}
	if tsum != inFile {
		t.Errorf("tshark: drop counts sum to %d, gopacket %d", tsum, inFile)
	}
	t.Logf("%d packets written, %d dropped (%d reported on %d packets), flow intact", len(pkts), st.Dropped, inFile, comments)
}

// streamExchange dials to from the client namespace and sends a
// deterministic pseudo-random stream until stop is closed, reading the
// echo and checking every byte of it against the same stream. It returns
// the number of bytes that went both ways.
func streamExchange(v *testutil.VethPair, e *zc.Engine, to netip.AddrPort, stop <-chan struct{}) (int64, error) {
	var c netconn.Conn
	err := netns.Do(v.Cli.Fd(), func() (err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err = netconn.Dial(ctx, e, "tcp", to.String())
		return err
	})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	werr := make(chan error, 1)
	var sent atomic.Int64 // set once the sender stopped; -1 while it runs
	sent.Store(-1)
	go func() {
		src := mrand.NewChaCha8([32]byte{1})
		buf := make([]byte, 64<<10)
		var n int64
		for {
			select {
			case <-stop:
				sent.Store(n)
				werr <- nil
				return
			default:
			}
			src.Read(buf)
			k, err := c.Write(buf)
			n += int64(k)
			if err != nil {
				sent.Store(n)
				werr <- err
				return
			}
		}
	}()
	want := mrand.NewChaCha8([32]byte{1})
	got := make([]byte, 64<<10)
	exp := make([]byte, 64<<10)
	var n int64
	var stopped time.Time // when stop was seen closed
	last := time.Now()    // last data
	for {
		if stopped.IsZero() {
			select {
			case <-stop:
				stopped = time.Now()
			default:
			}
		}
		if total := sent.Load(); total >= 0 && n == total {
			break // every byte sent came back
		}
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		k, err := c.Read(got)
		if k > 0 {
			last = time.Now()
		}
		if k > 0 {
			want.Read(exp[:k])
			if !bytes.Equal(got[:k], exp[:k]) {
				return n, fmt.Errorf("echoed stream differs from what was sent at byte %d..%d", n, n+int64(k))
			}
			n += int64(k)
		}
		if err != nil {
			when := "before the sender stopped"
			if !stopped.IsZero() {
				when = fmt.Sprintf("%v after the sender was told to stop", last.Sub(stopped))
			}
			return n, fmt.Errorf("read echo after %d bytes (last data %s): %w", n, when, err)
		}
	}
	return n, <-werr
}

// TestStartStopLive starts and stops captures (and adds and removes
// selectors) again and again on one running bulk flow: the flow loses and
// reorders nothing, and every capture file is whole.
func TestStartStopLive(t *testing.T) {
	v := newVethPair(t, 2)
	e := zcEngine(t)
	srv := echoListener(t, v, e)
	stop := make(chan struct{})
	done := make(chan error, 1)
	var total int64
	go func() {
		var err error
		total, err = streamExchange(v, e, srv, stop)
		done <- err
	}()
	const rounds = 20
	busy := 0 // rounds that saw packets
	for round := 0; round < rounds; round++ {
		path := filepath.Join(t.TempDir(), fmt.Sprintf("cap%d.pcapng", round))
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		var c *Capture
		v.In(t, v.Srv, func() (err error) {
			c, err = New(f, Options{Interfaces: []int{v.SrvIdx}, Snap: 256}, Listener(srv))
			return err
		})
		time.Sleep(5 * time.Millisecond)
		if err := c.Remove(Listener(srv)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
		if err := c.Add(Listener(srv)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		f.Close()
		st, _ := c.Stats()
		if st.Written != st.Captured || st.BadRecords != 0 {
			t.Errorf("round %d: %+v", round, st)
		}
		if st.Matched > 0 {
			busy++
		}
		if _, pkts := readPcapng(t, path); uint64(len(pkts)) != st.Written {
			t.Errorf("round %d: %d packets in the file, %d written", round, len(pkts), st.Written)
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatalf("the flow was disturbed: %v", err)
	}
	if total == 0 || busy == 0 {
		t.Fatalf("nothing went through (%d bytes, %d captures saw packets)", total, busy)
	}
	t.Logf("%d captures (%d saw packets) started and stopped on one live echo flow; %d MiB echoed, every byte intact", rounds, busy, total>>20)
}
