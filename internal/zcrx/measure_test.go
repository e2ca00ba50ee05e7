package zcrx

import (
	"fmt"
	"io"
	"os"
	"sort"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/loop"
	"github.com/zcnet/zcnet/internal/testutil"
)

// TestMeasureRecv prints (never asserts) loopback receive throughput and CPU per MiB of a
// device-less zcrx receiver against read(2), side by side in one run, as MEASURE lines the
// VM harness collects. Only with ZCNET_MEASURE set (the 7.3 guest sets it): under TCG
// emulation only the ratio means something, and a device-less instance copies every byte,
// so this is the cost of the zcrx mechanics without the zero-copy gain a NIC brings.
func TestMeasureRecv(t *testing.T) {
	if os.Getenv("ZCNET_MEASURE") == "" {
		t.Skip("set ZCNET_MEASURE=1 to measure")
	}
	const size, rounds = 16 << 20, 5
	q := newQueue(t, loop.URingConfig{CQE32: true})
	r := noDev(t, q, Config{AreaSize: 1 << 20})
	payload := pattern(1<<20, 12)
	type sample struct{ mbps, cpuPerMiB float64 }
	var readS, zcrxS []sample
	measure := func(path string, recv func(fd int) (int, error)) sample {
		cfd, sfd := tcpPair(t)
		done := make(chan error, 1)
		go func() {
			for off := 0; off < size; off += len(payload) {
				if err := testutil.WriteAll(cfd, payload); err != nil {
					done <- err
					return
				}
			}
			done <- unix.Shutdown(cfd, unix.SHUT_WR)
		}()
		var ru0, ru1 unix.Rusage
		unix.Getrusage(unix.RUSAGE_SELF, &ru0)
		t0 := time.Now()
		n, rerr := recv(sfd)
		el := time.Since(t0)
		unix.Getrusage(unix.RUSAGE_SELF, &ru1)
		if err := <-done; err != nil || n != size || rerr != nil {
			t.Fatalf("%s: received %d of %d: receiver %v, sender %v; receiver stats %+v", path, n, size, rerr, err, r.Stats())
		}
		cpu := time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano()) * time.Nanosecond
		return sample{float64(size) / el.Seconds() / 1e6, cpu.Seconds() * 1e3 / float64(size>>20)}
	}
	readPath := func(fd int) (int, error) {
		buf := make([]byte, 64<<10)
		n, sum := 0, 0
		for {
			k, err := unix.Read(fd, buf)
			if err == unix.EINTR {
				continue
			}
			if err != nil || k == 0 {
				_ = sum
				return n, err
			}
			sum += int(buf[0]) + int(buf[k-1])
			n += k
		}
	}
	zcrxPath := func(fd int) (int, error) {
		h := &sumHandler{end: make(chan error, 1)}
		recv(t, r, fd, h)
		err := <-h.end
		if err == io.EOF {
			err = nil
		}
		return h.n, err
	}
	for i := 0; i < rounds; i++ {
		readS = append(readS, measure("read(2)", readPath))
		zcrxS = append(zcrxS, measure("zcrx", zcrxPath))
	}
	med := func(s []sample, f func(sample) float64) float64 {
		v := make([]float64, len(s))
		for i := range s {
			v[i] = f(s[i])
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	mb := func(s sample) float64 { return s.mbps }
	cpu := func(s sample) float64 { return s.cpuPerMiB }
	st := r.Stats()
	lines := []string{
		fmt.Sprintf("MEASURE recv-loopback read(2) 64KiB: median %.0f MB/s, %.2f ms CPU/MiB (%d x %d MiB)", med(readS, mb), med(readS, cpu), rounds, size>>20),
		fmt.Sprintf("MEASURE recv-loopback zcrx-nodev 1MiB area: median %.0f MB/s, %.2f ms CPU/MiB; %.1f KiB per completion, %.1f refills per FLUSH_RQ",
			med(zcrxS, mb), med(zcrxS, cpu), float64(st.Bytes)/float64(st.CQEs)/1024, float64(st.Refills)/float64(max(st.Flushes, 1))),
		fmt.Sprintf("MEASURE recv-loopback ratio zcrx-nodev/read(2): throughput %.2f, CPU per MiB %.2f", med(zcrxS, mb)/med(readS, mb), med(zcrxS, cpu)/med(readS, cpu)),
	}
	for _, l := range lines {
		fmt.Println(l)
	}
}

type sumHandler struct {
	n   int
	sum int
	end chan error
}

func (h *sumHandler) Data(s *Stream, b []byte, buf Buf) {
	h.n += len(b)
	h.sum += int(b[0]) + int(b[len(b)-1])
	buf.Release()
}

func (h *sumHandler) End(s *Stream, err error) { h.end <- err }
