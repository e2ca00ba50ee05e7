package shim

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/zcnet/zcnet/kmod/internal/abi"
)

// fakeQueue lays out ring memory exactly as the module does (header of four
// 64-byte index slots, then SQEs, then CQEs) without a kernel, so that the
// client's ring logic is tested on any host.
func fakeQueue(sq, cq uint32) *Queue {
	s := abi.Setup{Sq_entries: sq, Cq_entries: cq, Sq_head_off: 0, Sq_tail_off: 64, Cq_head_off: 128, Cq_tail_off: 192, Sqes_off: 256}
	s.Cqes_off = 256 + sq*abi.SizeofSqe
	s.Ring_size = uint64(s.Cqes_off + cq*abi.SizeofCqe)
	q := &Queue{fd: -1, setup: s}
	q.mapRing(make([]byte, s.Ring_size))
	return q
}

func TestPrepEncodesEntries(t *testing.T) {
	q := fakeQueue(4, 8)
	if err := q.PrepSend(3, 7, 4096, 100, 0xabc); err != nil {
		t.Fatal(err)
	}
	if err := q.PrepRecv(4, 8, 1, 2, 0xdef); err != nil {
		t.Fatal(err)
	}
	q.PrepNop(9)
	q.PrepNop(10)
	if err := q.PrepNop(11); err == nil {
		t.Fatal("fifth entry in a 4-entry SQ accepted")
	}
	raw := q.ring[256:]
	le := binary.LittleEndian
	if raw[0] != abi.OpSend || le.Uint32(raw[4:]) != 3 || le.Uint32(raw[8:]) != 7 || le.Uint32(raw[12:]) != 100 ||
		le.Uint64(raw[16:]) != 4096 || le.Uint64(raw[24:]) != 0xabc {
		t.Fatalf("SEND entry bytes: % x", raw[:32])
	}
	if raw[64] != abi.OpRecv || le.Uint64(raw[64+24:]) != 0xdef {
		t.Fatalf("RECV entry bytes: % x", raw[64:96])
	}
	if q.Prepared() != 4 || q.SQSpace() != 0 {
		t.Fatalf("prepared %d space %d", q.Prepared(), q.SQSpace())
	}
}

func TestCompletionFlags(t *testing.T) {
	c := Completion{UserData: 1, Res: 10, Flags: abi.CqeFMore}
	if !c.More() || c.Notif() || c.Copied() || c.Err() != nil {
		t.Fatal(c)
	}
	n := Completion{Flags: abi.CqeFNotif | abi.CqeFCopied}
	if !n.Notif() || !n.Copied() || n.More() {
		t.Fatal(n)
	}
	e := Completion{Res: -125}
	if e.Err() == nil || e.Err().Error() != "operation canceled" {
		t.Fatalf("Err() = %v", e.Err())
	}
}

// FuzzCompletions: whatever the kernel side (here: the fuzzer) writes into
// the CQ, reading completions never panics, never returns more than asked
// or than the tail announces, and returns the slots' contents in order.
func FuzzCompletions(f *testing.F) {
	f.Add(uint32(0), uint32(3), uint8(4), []byte{1, 2, 3})
	f.Add(uint32(0xfffffffe), uint32(5), uint8(16), []byte{})
	f.Add(uint32(7), uint32(1000), uint8(1), []byte{0xff})
	f.Fuzz(func(t *testing.T, head, adv uint32, want uint8, fill []byte) {
		q := fakeQueue(4, 8)
		cqes := q.ring[q.setup.Cqes_off:]
		for i := range cqes {
			if len(fill) > 0 {
				cqes[i] = fill[i%len(fill)]
			}
		}
		*q.cqHead, q.cqLocal = head, head
		*q.cqTail = head + adv // may claim more than the ring holds
		dst := make([]Completion, want)
		n := q.Completions(dst)
		if n > int(want) || uint32(n) > adv {
			t.Fatalf("read %d (asked %d, tail advanced %d)", n, want, adv)
		}
		for i := 0; i < n; i++ {
			slot := (head + uint32(i)) & q.cqMask
			raw := cqes[slot*abi.SizeofCqe:]
			le := binary.LittleEndian
			if dst[i].UserData != le.Uint64(raw) || dst[i].Res != int32(le.Uint32(raw[8:])) || dst[i].Flags != le.Uint32(raw[12:]) {
				t.Fatalf("completion %d = %v, slot bytes % x", i, dst[i], raw[:16])
			}
		}
		if *q.cqHead != head+uint32(n) {
			t.Fatalf("head %d after reading %d from %d", *q.cqHead, n, head)
		}
	})
}

func TestProbe(t *testing.T) {
	err := Probe()
	if inVM && err != nil {
		t.Fatalf("Probe in the VM: %v", err)
	}
	if err != nil && !errors.Is(err, ErrNotSupported) {
		t.Fatalf("Probe: %v, want nil or ErrNotSupported", err)
	}
	t.Logf("Probe: %v", err)
}
