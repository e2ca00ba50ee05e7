// Command rawsend sends Ethernet frames it builds itself from a raw queue (AF_XDP,
// hwq.RawQueue): each frame is written in place in a registered buffer (destination MAC,
// the interface's MAC, an EtherType, a sequence number and a pattern) and handed to the
// TX ring without a copy on the application's side:
//
//	rawsend -i eth1 -dst 02:00:00:00:00:02 -count 1000 -size 60
//	rawsend -i veth0 -netns blue -dst 33:33:00:00:00:01 -ethertype 0x88b5 -size 1514
//
// It prints how many frames were sent and completed, and the queue's mode. The receiver
// sees payload bytes 0-3 as the sequence number (big endian), then byte i = (i + seq) mod
// 256. Needs root (CAP_NET_ADMIN, CAP_BPF).
package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/zcnet/zcnet/hwq"
	"github.com/zcnet/zcnet/memreg"
)

type config struct {
	Iface     string
	NetNS     string
	Queue     int
	Dst       net.HardwareAddr
	EtherType uint16
	Size      int
	Count     int
	Buffers   int // the region's buffers (frames in flight, fill ring and TX reserve)
}

func main() {
	var c config
	dst := flag.String("dst", "ff:ff:ff:ff:ff:ff", "destination MAC")
	et := flag.String("ethertype", "0x88b5", "EtherType (0x88b5: IEEE local experimental)")
	flag.StringVar(&c.Iface, "i", "", "interface (required)")
	flag.StringVar(&c.NetNS, "netns", "", "network namespace name (/run/netns/NAME)")
	flag.IntVar(&c.Queue, "queue", 0, "device queue")
	flag.IntVar(&c.Size, "size", 60, "frame size in bytes, Ethernet header included (14..MTU+14)")
	flag.IntVar(&c.Count, "count", 1000, "frames to send")
	flag.IntVar(&c.Buffers, "buffers", 1024, "buffers of 2 KiB in the queue's region")
	flag.Parse()
	var err error
	if c.Dst, err = net.ParseMAC(*dst); err != nil || c.Iface == "" {
		fmt.Fprintln(os.Stderr, "rawsend: -i and a valid -dst are required")
		os.Exit(2)
	}
	v, err := strconv.ParseUint(*et, 0, 16)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rawsend: -ethertype:", err)
		os.Exit(2)
	}
	c.EtherType = uint16(v)
	if err := run(c, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "rawsend:", err)
		os.Exit(1)
	}
}

func run(c config, out io.Writer) error {
	nsfd := 0
	if c.NetNS != "" {
		f, err := os.Open("/run/netns/" + c.NetNS)
		if err != nil {
			return err
		}
		defer f.Close()
		nsfd = int(f.Fd())
	}
	if c.Buffers == 0 {
		c.Buffers = 1024
	}
	r, err := memreg.New(memreg.Options{BufSize: 2048, Count: c.Buffers})
	if err != nil {
		return err
	}
	defer r.CloseWhenReleased()
	// The queue's defaults: the fill ring (receive) never takes the region's TxReserve (a
	// quarter of it), so Get finds a buffer whenever no frame is in flight.
	q, err := hwq.OpenRawQueue(c.Iface, c.Queue, r, &hwq.RawQueueOptions{NetNS: nsfd})
	if err != nil {
		return err
	}
	defer q.Close()
	src := q.HardwareAddr()
	if c.Size < 14 || c.Size > q.MTU()+14 {
		return fmt.Errorf("-size %d: want 14..%d", c.Size, q.MTU()+14)
	}
	start := time.Now()
	frames := make([]hwq.Frame, 0, 64)
	sent := 0
	idle := false // the last wait found nothing in flight
	for sent < c.Count {
		batch := frames[:0]
		for len(batch) < cap(batch) && sent+len(batch) < c.Count {
			b, err := q.Get()
			if errors.Is(err, memreg.ErrExhausted) {
				break // every buffer in flight: wait for completions below
			}
			if err != nil {
				return err
			}
			build(b.Bytes()[:c.Size], c.Dst, src, c.EtherType, uint32(sent+len(batch)))
			batch = append(batch, hwq.Frame{Buf: b, Len: c.Size})
		}
		if len(batch) == 0 {
			n, err := waitCompletions(q)
			if err != nil {
				return err
			}
			if n == 0 && idle {
				// Nothing in flight and still no buffer: the frames are held elsewhere,
				// and waiting would never end.
				return errors.New("no free buffer and no frame in flight")
			}
			idle = n == 0
			continue
		}
		idle = false
		for len(batch) > 0 {
			n, err := q.Send(batch)
			if err != nil {
				return err
			}
			sent += n
			batch = batch[n:]
			if len(batch) > 0 {
				if _, err := q.Flush(); err != nil {
					return err
				}
			}
		}
		if _, err := q.Flush(); err != nil {
			return err
		}
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		n, err := q.Flush()
		if err != nil {
			return err
		}
		if n == 0 {
			break
		}
	}
	st, err := q.Stats()
	if err != nil {
		return err
	}
	m := q.Mode()
	mode := "zero-copy"
	if !m.ZeroCopy {
		mode = "copy mode"
	}
	el := time.Since(start).Seconds()
	fmt.Fprintf(out, "rawsend: %d frames of %d bytes sent, %d completed, %d invalid, in %.3f s (%.0f frames/s), %s on %s queue %d\n",
		st.TxFrames, c.Size, st.TxCompleted, st.TxInvalid, el, float64(st.TxFrames)/el, mode, c.Iface, c.Queue)
	if st.TxCompleted != uint64(c.Count) {
		return fmt.Errorf("%d of %d frames completed", st.TxCompleted, c.Count)
	}
	return nil
}

// waitCompletions waits for sent frames to complete when Get found no free buffer, and
// returns how many are still in flight. A raw queue has no wait for completions (poll
// reports TX ring room, not completions), so it flushes with a growing pause until some
// completed, and gives up when nothing completes for 5 s.
func waitCompletions(q *hwq.RawQueue) (int, error) {
	last := -1
	stuck := time.Duration(0)
	for pause := 20 * time.Microsecond; ; pause = min(2*pause, 5*time.Millisecond) {
		n, err := q.Flush()
		if err != nil || n == 0 || (last >= 0 && n < last) {
			return n, err
		}
		if n == last {
			if stuck += pause; stuck > 5*time.Second {
				return n, fmt.Errorf("%d frames in flight made no progress for 5 s", n)
			}
		}
		last = n
		time.Sleep(pause)
	}
}

// build writes one frame in place.
func build(f []byte, dst, src net.HardwareAddr, et uint16, seq uint32) {
	copy(f[0:6], dst)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:], et)
	p := f[14:]
	if len(p) >= 4 {
		binary.BigEndian.PutUint32(p, seq)
		for i := 4; i < len(p); i++ {
			p[i] = byte(uint32(i) + seq)
		}
	}
}
