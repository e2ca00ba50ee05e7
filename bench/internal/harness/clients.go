package harness

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bench/internal/frame"
	"github.com/zcnet/zcnet/bench/internal/stats"
)

// The harness's own clients: the scenarios where only the server differs by mode use
// the same client whatever the mode (Scenario.HarnessClient).

// dialRaw opens a blocking TCP socket (IPPROTO_TCP, never MPTCP) to addr with
// TCP_NODELAY on, and returns its descriptor.
func dialRaw(addr string) (int, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return -1, err
	}
	family, sa := unix.AF_INET, unix.Sockaddr(nil)
	if ap.Addr().Is4() {
		sa = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	} else {
		family = unix.AF_INET6
		sa = &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return -1, os.NewSyscallError("socket", err)
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		unix.Close(fd)
		return -1, os.NewSyscallError("setsockopt TCP_NODELAY", err)
	}
	for {
		err = unix.Connect(fd, sa)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return -1, os.NewSyscallError("connect", err)
	}
	return fd, nil
}

// idleClient opens c.Conns connections, sends nothing, and closes them all when the
// parent says so (a line on release, or its end).
func idleClient(_ context.Context, c Case, m *Meter, release io.Reader) error {
	fds := make([]int, 0, c.Conns)
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for range c.Conns {
		fd, err := dialRaw(c.Addr)
		if err != nil {
			return fmt.Errorf("idle connection %d of %d: %w", len(fds)+1, c.Conns, err)
		}
		fds = append(fds, fd)
	}
	m.Start()
	_, _ = bufio.NewReader(release).ReadString('\n')
	return nil
}

// loadClient is the MultiCore load generator: one thread per CPU of this process
// (pinned to it), each driving its share of c.Conns connections through one epoll
// instance with non-blocking read(2)/write(2), one request of c.Size bytes in flight per
// connection, the round trip of every request recorded. It is the same for every mode,
// and cheaper per message than any mode's server, so that the server is what is
// measured.
func loadClient(_ context.Context, c Case, m *Meter) error {
	cpus := AllowedCPUs()
	if len(cpus) == 0 {
		cpus = []int{-1}
	}
	threads := make([]*lgThread, min(len(cpus), c.Conns))
	for i := range threads {
		threads[i] = &lgThread{cpu: cpus[i], m: m, size: c.Size}
	}
	defer func() {
		for _, t := range threads {
			t.closeAll()
		}
	}()
	for i := range c.Conns {
		fd, err := dialRaw(c.Addr)
		if err != nil {
			return fmt.Errorf("connection %d of %d: %w", i+1, c.Conns, err)
		}
		t := threads[i%len(threads)]
		lc := &lgConn{fd: fd, src: m.NewSource(), v: m.NewVerifier(), rec: m.NewRecorder(),
			req: make([]byte, c.Size), resp: make([]byte, c.Size)}
		lc.src.Fill(lc.req)
		t.conns = append(t.conns, lc)
		if err := unix.SetNonblock(fd, true); err != nil {
			return os.NewSyscallError("fcntl O_NONBLOCK", err)
		}
	}
	m.Start()
	errs := make([]error, len(threads))
	var wg sync.WaitGroup
	for i, t := range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = t.run()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

type lgThread struct {
	cpu   int
	m     *Meter
	size  int
	conns []*lgConn
	ep    int
}

type lgConn struct {
	fd        int
	src       *frame.Source
	v         *frame.Verifier
	rec       *stats.Recorder
	req, resp []byte
	got       int
	t0        time.Time
	closed    bool
}

func (t *lgThread) closeAll() {
	for _, lc := range t.conns {
		if !lc.closed {
			lc.closed = true
			unix.Close(lc.fd)
		}
	}
}

func (t *lgThread) run() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if t.cpu >= 0 {
		var set unix.CPUSet
		set.Set(t.cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			return os.NewSyscallError("sched_setaffinity", err)
		}
	}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return os.NewSyscallError("epoll_create1", err)
	}
	defer unix.Close(ep)
	t.ep = ep
	for i, lc := range t.conns {
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(i)}
		if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, lc.fd, &ev); err != nil {
			return os.NewSyscallError("epoll_ctl", err)
		}
		if err := lc.send(); err != nil {
			return err
		}
	}
	active := len(t.conns)
	evs := make([]unix.EpollEvent, 256)
	for active > 0 {
		n, err := unix.EpollWait(ep, evs, 1000)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return os.NewSyscallError("epoll_wait", err)
		}
		for _, ev := range evs[:n] {
			lc := t.conns[ev.Fd]
			done, err := lc.readable(t.m)
			if err != nil {
				return err
			}
			if done {
				_ = unix.EpollCtl(ep, unix.EPOLL_CTL_DEL, lc.fd, nil)
				lc.closed = true
				unix.Close(lc.fd)
				active--
			}
		}
	}
	return nil
}

// send writes the next request (64 B into an empty socket: it goes at once; a short
// write waits for room).
func (lc *lgConn) send() error {
	lc.src.Stamp(lc.req)
	lc.t0 = time.Now()
	for off := 0; off < len(lc.req); {
		n, err := unix.Write(lc.fd, lc.req[off:])
		if errors.Is(err, unix.EAGAIN) {
			pfd := []unix.PollFd{{Fd: int32(lc.fd), Events: unix.POLLOUT}}
			_, _ = unix.Poll(pfd, 100)
			continue
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return os.NewSyscallError("write request", err)
		}
		off += n
	}
	lc.src.Sent()
	return nil
}

// readable reads what arrived; a complete response is checked and timed, and the next
// request goes out unless the meter says stop (then done: close the connection).
func (lc *lgConn) readable(m *Meter) (done bool, err error) {
	for {
		n, err := unix.Read(lc.fd, lc.resp[lc.got:])
		if errors.Is(err, unix.EAGAIN) {
			return false, nil
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false, os.NewSyscallError("read response", err)
		}
		if n == 0 {
			return false, fmt.Errorf("server closed a connection with a request in flight")
		}
		if err := lc.v.Feed(lc.resp[lc.got : lc.got+n]); err != nil {
			return false, err
		}
		lc.got += n
		if lc.got < len(lc.resp) {
			continue
		}
		lc.rec.Add(time.Since(lc.t0))
		lc.got = 0
		if m.Stopped() {
			return true, nil
		}
		if err := lc.send(); err != nil {
			return false, err
		}
	}
}

// The HTTP scenario: paths of ServeHTTP.
const (
	httpEchoPath = "/echo"
	httpQuitPath = "/quit"
)

// ServeHTTP is the server of the HTTP scenario on any mode's net.Listener: net/http
// with a handler that checks the POSTed frame (Meter.CheckFrame) and sends it back as
// the response body. It returns when the client's quit request came and the server shut
// down, with the first integrity error if any.
func ServeHTTP(c Case, m *Meter, ln net.Listener, ready func(string)) error {
	quit := make(chan struct{})
	var quitOnce sync.Once
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+httpEchoPath, func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if err := m.CheckFrame(body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(body)
	})
	if c.Scenario == HTTPWrk || c.Scenario == HTTPSWrk {
		body := WrkBody(c.Size)
		var served atomic.Int64
		mux.HandleFunc("GET "+wrkPath, func(w http.ResponseWriter, _ *http.Request) {
			m.Start()
			n := served.Add(1) - 1
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			if n == c.CorruptSeq {
				// -selftest-corrupt: one damaged response, which wrk's check must catch
				bad := bytes.Clone(body)
				bad[len(bad)/2] ^= 0x20
				_, _ = w.Write(bad)
				return
			}
			_, _ = w.Write(body)
		})
	}
	mux.HandleFunc("POST "+httpQuitPath, func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
		quitOnce.Do(func() { close(quit) })
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: time.Minute}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	ready(ln.Addr().String())
	select {
	case <-quit:
	case err := <-served:
		return fmt.Errorf("http serve: %w", err)
	}
	m.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		return fmt.Errorf("http shutdown: %w", err)
	}
	<-served
	return m.CheckErr()
}

// httpClient is the HTTP scenario's client, the same for every mode: net/http on Go net
// (MPTCP off), c.Conns keep-alive clients, each with one POST of a c.Size byte frame in
// flight, checking and timing every response; a quit request at the end.
func httpClient(ctx context.Context, c Case, m *Meter) error {
	var d net.Dialer
	d.SetMultipathTCP(false)
	tr := &http.Transport{DialContext: d.DialContext, MaxIdleConns: c.Conns, MaxIdleConnsPerHost: c.Conns,
		MaxConnsPerHost: c.Conns, DisableCompression: true}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr}
	post := func(path string, body []byte) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+c.Addr+path, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/octet-stream")
		return cl.Do(req)
	}
	m.Start()
	errs := make([]error, c.Conns)
	var wg sync.WaitGroup
	for i := range c.Conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			src, v, rec := m.NewSource(), m.NewVerifier(), m.NewRecorder()
			req, resp := make([]byte, c.Size), make([]byte, c.Size)
			src.Fill(req)
			for {
				src.Stamp(req)
				t0 := time.Now()
				r, err := post(httpEchoPath, req)
				if err != nil {
					errs[i] = err
					return
				}
				src.Sent()
				_, err = io.ReadFull(r.Body, resp)
				extra, _ := io.Copy(io.Discard, r.Body)
				r.Body.Close()
				if r.StatusCode != http.StatusOK {
					errs[i] = fmt.Errorf("%w: HTTP %s: %q", frame.ErrCorrupt, r.Status, resp)
					return
				}
				if err != nil || extra != 0 {
					errs[i] = fmt.Errorf("%w: response body: %v, %d bytes too many", frame.ErrCorrupt, err, extra)
					return
				}
				rec.Add(time.Since(t0))
				if err := v.Feed(resp); err != nil {
					errs[i] = err
					return
				}
				if m.Stopped() {
					return
				}
			}
		}()
	}
	wg.Wait()
	m.Stop()
	r, err := post(httpQuitPath, nil)
	if err == nil {
		r.Body.Close()
	}
	return errors.Join(append(errs, err)...)
}

// MakeFrameFile writes a FileSend file of frames of size bytes into dir, about total
// bytes (whole frames, at least one), frame corrupt (>= 0) with a damaged payload byte
// (frame.NewSource); the caller removes it.
func MakeFrameFile(dir string, size int, total int64, corrupt int64) (string, error) {
	src, err := frame.NewSource(size, corrupt)
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp(dir, fmt.Sprintf("zcbench-%d-*.frames", os.Getpid()))
	if err != nil {
		return "", err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	buf := make([]byte, size)
	src.Fill(buf)
	for n := max(1, total/int64(size)); n > 0; n-- {
		src.Stamp(buf)
		if _, err := w.Write(buf); err != nil {
			f.Close()
			os.Remove(f.Name())
			return "", err
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		os.Remove(f.Name())
		return "", err
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// SendFile is the FileSend client's work on any connection: io.Copy from the *os.File
// to w (the mode's connection itself, so that io.Copy finds its io.ReaderFrom, or the
// file's WriteTo finds a socket for sendfile), then the frames are recorded as sent.
func SendFile(c Case, m *Meter, w io.Writer) error {
	f, err := os.Open(c.File)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	// What io.Copy can use: the connection's io.ReaderFrom (Go net: sendfile), or the
	// file's WriteTo finding a socket; else a 32 KiB Read/Write loop.
	_, rf := w.(io.ReaderFrom)
	_, wt := w.(io.WriterTo)
	m.Note("io.ReaderFrom", strconv.FormatBool(rf))
	m.Note("io.WriterTo", strconv.FormatBool(wt))
	src := m.NewSource()
	m.Start()
	n, err := io.Copy(w, f)
	if err != nil {
		return fmt.Errorf("io.Copy from the file: %w", err)
	}
	if n != st.Size() || n%int64(c.Size) != 0 {
		return fmt.Errorf("io.Copy sent %d bytes of a %d-byte file of %d-byte frames", n, st.Size(), c.Size)
	}
	src.SentFrames(uint64(n / int64(c.Size)))
	return nil
}
