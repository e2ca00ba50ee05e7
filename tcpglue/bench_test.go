package tcpglue

import (
	"errors"
	"io"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkReceive compares receiving through a RecvWindow with read(2), for
// a MSG_ZEROCOPY sender (pages map) and a plain sender (nothing maps), on one
// loopback connection with TCP_MAXSEG 4108. Besides throughput it reports
// the mapped share and the process CPU time per MiB (sender included, so
// compare variants with the same sender).
func BenchmarkReceive(b *testing.B) {
	for _, bc := range []struct {
		name     string
		zcSend   bool
		useWindw bool
	}{
		{"zcsender/window", true, true},
		{"zcsender/read", true, false},
		{"plainsender/window", false, true},
		{"plainsender/read", false, false},
	} {
		b.Run(bc.name, func(b *testing.B) { benchReceive(b, bc.zcSend, bc.useWindw) })
	}
}

func cpuNanos() int64 {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

func benchReceive(b *testing.B, zcSend, useWindow bool) {
	const chunk = 1 << 20
	c, s := mssPair(b, 4108)
	if zcSend {
		if err := c.SetZeroCopy(true); err != nil {
			b.Fatal(err)
		}
	}
	buf, err := unix.Mmap(-1, 0, chunk, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(buf)
	for i := range buf {
		buf[i] = byte(i)
	}
	total := int64(b.N) * chunk
	sendErr := make(chan error, 1)
	z := &zcSender{s: c}
	go func() {
		for i := 0; i < b.N; i++ {
			var err error
			if zcSend {
				err = z.send(buf) // contents never change, so reuse is safe here
			} else {
				_, err = c.Write(buf)
			}
			if err != nil {
				sendErr <- err
				return
			}
		}
		c.Shutdown(unix.SHUT_WR)
		if zcSend {
			sendErr <- z.wait()
			return
		}
		sendErr <- nil
	}()
	b.SetBytes(chunk)
	b.ResetTimer()
	cpu0 := cpuNanos()
	var got int64
	var st RecvStats
	copyBuf := make([]byte, 256<<10)
	if useWindow {
		w, err := NewRecvWindow(s, 2<<20)
		if err != nil {
			b.Fatal(err)
		}
		for {
			res, err := w.Recv(copyBuf)
			got += int64(res.Len())
			if err == io.EOF {
				break
			}
			if err != nil {
				w.Close()
				b.Fatal(err)
			}
		}
		st = w.Stats()
		w.Close()
	} else {
		for {
			n, err := s.Read(copyBuf)
			got += int64(n)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		st.CopiedBytes = uint64(got)
	}
	cpu := cpuNanos() - cpu0
	b.StopTimer()
	if err := <-sendErr; err != nil {
		b.Fatal(err)
	}
	if got != total {
		b.Fatalf("received %d of %d bytes", got, total)
	}
	b.ReportMetric(100*float64(st.MappedBytes)/float64(total), "%mapped")
	b.ReportMetric(float64(cpu)/float64(total>>20), "cpu-ns/MiB")
}
