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
	r, err := memreg.New(memreg.Options{BufSize: 2048, Count: 1024})
	if err != nil {
		return err
	}
	defer r.CloseWhenReleased()
	q, err := hwq.OpenRawQueue(c.Iface, c.Queue, r, &hwq.RawQueueOptions{NetNS: nsfd, RingSize: 512})
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
