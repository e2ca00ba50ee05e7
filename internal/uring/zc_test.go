package uring

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/testutil"
)

// TestSendZCFixed sends from a registered buffer with SEND_ZC over loopback TCP and checks that
// every send completion is paired with exactly one notification, and that the kernel's
// ZC_COPIED report is surfaced (loopback always copies).
func TestSendZCFixed(t *testing.T) {
	caps := DetectCapabilities()
	testutil.SkipIfNotSupported(t, caps.NeedOp(OpSendZC, "SEND_ZC", "6.0"), "6.0")
	r := newRing(t, 32, nil)
	c, s := tcpPair(t)
	const chunk, total = 64 << 10, 8 << 20
	src := mmapBuf(t, 4*chunk)
	if err := r.RegisterBuffers([]Iovec{{Base: uint64(addr(src)), Len: uint64(len(src))}}, nil); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, total)
	recvDone := make(chan error, 1)
	go func() {
		got := 0
		for got < total {
			n, err := unix.Read(s, dst[got:])
			if err != nil {
				recvDone <- err
				return
			}
			if n == 0 {
				recvDone <- errors.New("EOF")
				return
			}
			got += n
		}
		recvDone <- nil
	}()
	want := make([]byte, 0, total)
	// Slot k of src is free again only after its notification.
	slotBusy := make([]bool, 4)
	pendingNotif := map[uint64]bool{}
	sent, copied, notifs, sends := 0, 0, 0, 0
	next := 0
	seq := uint64(0)
	for sent < total || len(pendingNotif) > 0 {
		for k := 0; k < 4 && next < total; k++ {
			if slotBusy[k] {
				continue
			}
			n := min(chunk, total-next)
			buf := src[k*chunk : k*chunk+n]
			fill(buf, uint64(next))
			want = append(want, buf...)
			seq++
			ud := seq<<8 | uint64(k)
			sqe := r.GetSQE()
			sqe.PrepSendZCFixed(int32(c), addr(buf), uint32(n), 0, SendZCReportUsage, 0)
			sqe.UserData = ud
			slotBusy[k] = true
			pendingNotif[ud] = true
			next += n
		}
		cqe, err := func() (CQE, error) { mustSubmit(t, r); return r.WaitCQETimeout(10 * time.Second) }()
		if err != nil {
			t.Fatal(err)
		}
		k := int(cqe.UserData & 0xff)
		switch {
		case cqe.Notif():
			if !pendingNotif[cqe.UserData] {
				t.Fatalf("notification for unknown or already notified send %#x", cqe.UserData)
			}
			delete(pendingNotif, cqe.UserData)
			notifs++
			if cqe.ZCCopied() {
				copied++
			}
			slotBusy[k] = false
		default:
			sends++
			if cqe.Res < 0 {
				t.Fatalf("send_zc: %v", unix.Errno(-cqe.Res))
			}
			if !cqe.More() {
				t.Fatalf("send completion %#x without F_MORE: no notification would follow", cqe.UserData)
			}
			sent += int(cqe.Res)
		}
	}
	if err := <-recvDone; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst, want) {
		t.Fatal("received data differs from what was sent")
	}
	if sends != notifs {
		t.Fatalf("%d sends, %d notifications", sends, notifs)
	}
	if copied != notifs {
		t.Errorf("loopback: %d of %d notifications reported ZC_COPIED, want all", copied, notifs)
	}
	t.Logf("%d sends, %d notifications, %d reported copied", sends, notifs, copied)
}

// TestSendZCFailedStillNotifies: a SEND_ZC on a socket that is not connected fails and still
// posts its notification, so the buffer is released exactly once.
func TestSendZCFailedStillNotifies(t *testing.T) {
	r := newRing(t, 8, nil)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		t.Fatal(err)
	}
	closeFD(t, fd)
	buf := mmapBuf(t, 4096)
	r.GetSQE().PrepSendZC(int32(fd), addr(buf), 4096, unix.MSG_NOSIGNAL, SendZCReportUsage)
	r.lastSQE().UserData = 5
	mustSubmit(t, r)
	var res, notif int
	for res+notif < 2 {
		c, err := r.WaitCQETimeout(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if c.Notif() {
			notif++
		} else {
			if c.Res >= 0 {
				t.Fatalf("send on unconnected socket succeeded: %d", c.Res)
			}
			res++
		}
	}
}

// recvAll arms multishot recv on fd with a provided-buffer ring and collects size bytes,
// re-arming whenever a CQE comes without F_MORE (including ENOBUFS when the ring runs dry).
// Buffers are returned to the ring only after a delay of `hold` CQEs, to force exhaustion.
func recvAll(t *testing.T, r *Ring, br *BufRing, bufs []byte, bufSize int, fd int, size int, bundle bool, hold int) (data []byte, cqes, rearms, enobufs int) {
	t.Helper()
	arm := func() {
		r.GetSQE().PrepRecvMultishot(int32(fd), br.Group(), 0, bundle)
		r.lastSQE().UserData = 77
	}
	arm()
	nbufs := int(br.Entries())
	var held []uint16
	giveBack := func(bid uint16) {
		br.Add(addr(bufs)+uintptr(int(bid)*bufSize), uint32(bufSize), bid, 0)
		br.Advance(1)
	}
	for len(data) < size {
		mustSubmit(t, r)
		c, err := r.WaitCQETimeout(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if c.UserData != 77 {
			continue
		}
		cqes++
		switch {
		case c.Res == -int32(unix.ENOBUFS):
			enobufs++
			for _, b := range held {
				giveBack(b)
			}
			held = held[:0]
		case c.Res < 0:
			t.Fatalf("recv: %v", unix.Errno(-c.Res))
		case c.Res == 0:
			t.Fatal("unexpected EOF")
		default:
			if !c.HasBuffer() {
				t.Fatal("recv CQE without a buffer")
			}
			// With bundles, one CQE covers consecutive buffers starting at the reported id.
			left := int(c.Res)
			bid := c.BufferID()
			for left > 0 {
				n := min(left, bufSize)
				data = append(data, bufs[int(bid)*bufSize:int(bid)*bufSize+n]...)
				held = append(held, bid)
				left -= n
				bid = uint16((int(bid) + 1) % nbufs)
			}
			if len(held) > hold {
				for _, b := range held {
					giveBack(b)
				}
				held = held[:0]
			}
		}
		if !c.More() {
			rearms++
			arm()
		}
	}
	return data, cqes, rearms, enobufs
}

func TestMultishotRecvBufRing(t *testing.T) {
	for _, bundle := range []bool{false, true} {
		name := "plain"
		if bundle {
			name = "bundle"
		}
		t.Run(name, func(t *testing.T) {
			if bundle {
				testutil.RequireFeature(t, DetectCapabilities().Has(FeatRecvsendBundle), "IORING_FEAT_RECVSEND_BUNDLE", "6.10")
			}
			r := newRing(t, 16, nil)
			c, s := tcpPair(t)
			const nbufs, bufSize, size = 16, 4096, 4 << 20
			br, bufs := filledBufRing(t, r, nbufs, bufSize, 3, 0)
			want := make([]byte, size)
			fill(want, 11)
			go func() {
				for off := 0; off < size; {
					n, err := unix.Write(c, want[off:min(off+100000, size)])
					if err != nil {
						return
					}
					off += n
				}
			}()
			// hold = nbufs: keep every buffer until the ring is empty, forcing ENOBUFS.
			got, cqes, rearms, enobufs := recvAll(t, r, br, bufs, bufSize, s, size, bundle, nbufs)
			if !bytes.Equal(got, want) {
				t.Fatal("data arrived corrupted or out of order")
			}
			if enobufs == 0 || rearms == 0 {
				t.Errorf("ring exhaustion was not exercised: %d ENOBUFS, %d re-arms", enobufs, rearms)
			}
			t.Logf("%d bytes in %d CQEs, %d re-arms, %d ENOBUFS", size, cqes, rearms, enobufs)
		})
	}
}

func TestIncrementalBufRing(t *testing.T) {
	r := newRing(t, 16, nil)
	const bufSize = 64 << 10
	_, bufs := filledBufRing(t, r, 4, bufSize, 9, PbufRingInc)
	c, s := tcpPair(t)
	want := make([]byte, 3000)
	fill(want, 5)
	var got []byte
	offs := map[uint16]int{}
	sawMore := false
	for round := 0; round < 3; round++ {
		if _, err := unix.Write(c, want[round*1000:(round+1)*1000]); err != nil {
			t.Fatal(err)
		}
		r.GetSQE().PrepRecv(int32(s), 0, 0, 0)
		r.lastSQE().Flags |= SQEBufferSelect
		r.lastSQE().BufIndex = 9
		cqe := submitWait(t, r)
		if cqe.Res <= 0 || !cqe.HasBuffer() {
			t.Fatalf("recv %+v", cqe)
		}
		bid := cqe.BufferID()
		o := int(bid)*bufSize + offs[bid]
		got = append(got, bufs[o:o+int(cqe.Res)]...)
		offs[bid] += int(cqe.Res)
		if cqe.BufMore() {
			sawMore = true
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatal("incremental recv data differs")
	}
	if !sawMore {
		t.Error("no CQE said the incremental buffer had room left (F_BUF_MORE)")
	}
}

// TestRecvMultishotLimit: a multishot bundle receive limited to 40 KiB in all delivers
// exactly 40 KiB of the 200 KiB waiting and ends without CQEFMore (zc limits every receive
// to a connection's credit this way).
func TestRecvMultishotLimit(t *testing.T) {
	caps := DetectCapabilities()
	if !caps.RecvMultishotLimit {
		testutil.SkipIfNotSupported(t, fmt.Errorf("multishot recv total limit: %w", ErrNotSupported), "6.17")
	}
	if !caps.Has(FeatRecvsendBundle) {
		t.Fatal("a kernel with the multishot limit has bundles")
	}
	r := newRing(t, 16, nil)
	c, s := tcpPair(t)
	const nbufs, bufSize, limit = 64, 4096, 40 << 10
	_, bufs := filledBufRing(t, r, nbufs, bufSize, 5, 0)
	want := make([]byte, 200<<10)
	fill(want, 3)
	if err := testutil.WriteAll(c, want); err != nil {
		t.Fatal(err)
	}
	sqe := r.GetSQE()
	sqe.PrepRecvMultishotLimit(int32(s), 5, true, limit)
	sqe.UserData = 9
	var got []byte
	for {
		mustSubmit(t, r)
		cqe, err := r.WaitCQETimeout(5 * time.Second)
		if err != nil {
			t.Fatalf("after %d bytes: %v", len(got), err)
		}
		if cqe.Res < 0 {
			t.Fatalf("recv: %v", unix.Errno(-cqe.Res))
		}
		for left, bid := int(cqe.Res), int(cqe.BufferID()); left > 0; bid = (bid + 1) % nbufs {
			n := min(left, bufSize)
			got = append(got, bufs[bid*bufSize:bid*bufSize+n]...)
			left -= n
		}
		if !cqe.More() {
			break
		}
	}
	if len(got) != limit || !bytes.Equal(got, want[:limit]) {
		t.Fatalf("received %d bytes (want the first %d, intact)", len(got), limit)
	}
}
