package capture

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/zcnet/zcnet/hwq"
)

// RawWriter writes the frames of raw queues (hwq.RawQueue: AF_XDP) to a pcapng file with
// the same writer the BPF capture uses. Nothing is copied out of the queue's region until
// the application calls Write for a frame: the frame's bytes go straight from the region
// into the file's buffer. Each frame is recorded at the XDP hook with the verdict
// XDP_REDIRECT (the steering program sent it to the raw queue) and its RX queue.
//
// Frames are buffered (1 MiB) on their way to the writer. So that a file that can no
// longer be written is found at Write and not only at Close: NewRawWriter writes the
// header through at once, an *os.File (any writer with SyscallConn) is checked to be open
// at every Write without a system call, and the first error of the writer is returned by
// every later Write, Flush and Close.
//
// A RawWriter is not safe for concurrent use; Close flushes it (it does not close out).
type RawWriter struct {
	bw    *bufio.Writer
	rc    syscall.RawConn // the file's, when w has one: Write checks it is still open
	err   error           // the first write error: every later call returns it
	out   *pcapWriter
	off   int64
	n     uint64
	per   map[int]uint64 // frames written per ifindex
	start time.Time
}

// RawWriterOptions describe the file.
type RawWriterOptions struct {
	// Interfaces are those whose raw queues' frames will be written (ProbeInterface gives
	// them); at least one.
	Interfaces []Interface
	// Comment is added to the section's comment.
	Comment string
	// Snap is the most bytes kept per frame (0: MaxSnap).
	Snap int
}

// xdpRedirect is XDP_REDIRECT (enum xdp_action).
const xdpRedirect = 4

// NewRawWriter writes the pcapng section header and interface descriptions to w.
func NewRawWriter(w io.Writer, o RawWriterOptions) (*RawWriter, error) {
	const op = "new raw writer"
	snap := o.Snap
	if snap == 0 {
		snap = MaxSnap
	}
	if snap < 0 || snap > MaxSnap {
		return nil, opErr(op, fmt.Errorf("%w: snap %d out of 1..%d", ErrInvalid, snap, MaxSnap))
	}
	off, err := taiOffset()
	if err != nil {
		return nil, opErr(op, err)
	}
	comment := "zcnet raw queue (AF_XDP) frames, copied out by the application"
	if o.Comment != "" {
		comment += "; " + o.Comment
	}
	r := &RawWriter{bw: bufio.NewWriterSize(w, 1<<20), off: off, per: map[int]uint64{}, start: time.Now()}
	if sc, ok := w.(syscall.Conn); ok {
		if r.rc, err = sc.SyscallConn(); err != nil {
			return nil, opErr(op, err)
		}
	}
	r.out, err = newPcapWriter(r.bw, pcapSection{Comment: comment, Snap: snap, Interfaces: o.Interfaces, Hooks: HookXDP}, off)
	if err != nil {
		return nil, opErr(op, err)
	}
	if err := r.bw.Flush(); err != nil {
		return nil, opErr(op, err)
	}
	return r, nil
}

// fail records the writer's first error and returns it.
func (r *RawWriter) fail(op string, err error) error {
	if r.err == nil {
		r.err = opErr(op, err)
	}
	return r.err
}

// Write records one received frame of a raw queue. at is when it was received (the
// device's RX timestamp converted to UTC where the application has one, time.Now()
// otherwise). The frame's bytes are copied into the file buffer here; the caller may
// release the frame's buffer when Write returns.
func (r *RawWriter) Write(q *hwq.RawQueue, f hwq.Frame, at time.Time) error {
	if r.err != nil {
		return r.err
	}
	if r.rc != nil {
		// A closed file: RawConn.Control fails without entering the kernel.
		if err := r.rc.Control(func(uintptr) {}); err != nil {
			// os.File says "use of closed file" (poll.ErrFileClosing): make it match
			// os.ErrClosed.
			return r.fail("write raw frame", fmt.Errorf("%w (%v)", os.ErrClosed, err))
		}
	}
	data := f.Bytes()
	if data == nil {
		return opErr("write raw frame", fmt.Errorf("%w: the frame's buffer is no longer held", ErrInvalid))
	}
	pk := Packet{TAI: at.UnixNano() + r.off, Ifindex: q.Ifindex(), Hook: HookXDP, Length: len(data),
		Data: data, Queue: q.Queue(), Verdict: xdpRedirect}
	if snap := r.out.snap; snap > 0 && len(pk.Data) > snap {
		pk.Data = pk.Data[:snap]
	}
	if err := r.out.packet(&pk); err != nil {
		return r.fail("write raw frame", err)
	}
	r.n++
	r.per[q.Ifindex()]++
	return nil
}

// Frames is the number of frames written.
func (r *RawWriter) Frames() uint64 { return r.n }

// Flush writes the buffered frames through to the writer.
func (r *RawWriter) Flush() error {
	if r.err != nil {
		return r.err
	}
	if err := r.out.flush(); err != nil {
		return r.fail("flush raw writer", err)
	}
	if err := r.bw.Flush(); err != nil {
		return r.fail("flush raw writer", err)
	}
	return nil
}

// Close writes an interface statistics block (frames written) for each interface that
// had frames, and flushes.
func (r *RawWriter) Close() error {
	if r.err != nil {
		return r.err
	}
	end := time.Now()
	for i, n := range r.per {
		if err := r.out.stats(i, r.start, end, n, 0); err != nil {
			return opErr("close raw writer", err)
		}
	}
	if err := r.out.flush(); err != nil {
		return opErr("close raw writer", err)
	}
	return opErr("close raw writer", r.bw.Flush())
}
