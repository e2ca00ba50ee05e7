package harness

import (
	"bufio"
	"bytes"
	"maps"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bench/internal/frame"
	"github.com/zcnet/zcnet/bench/internal/stats"
)

// Meter measures one side of a case. Its methods are safe for concurrent use; the
// Sources, Verifiers and Recorders it hands out belong to one goroutine each.
type Meter struct {
	c      Case
	client bool

	once    sync.Once
	started atomic.Bool
	stopped atomic.Bool
	t0      time.Time
	ru0     unix.Rusage
	timer   *time.Timer

	stopOnce sync.Once
	t1       time.Time
	ru1      unix.Rusage

	mu        sync.Mutex
	sources   []*frame.Source
	verifiers []*frame.Verifier
	recs      []*stats.Recorder

	zc, copied         atomic.Uint64
	rxMapped, rxCopied atomic.Uint64

	// frames checked one by one (CheckFrame), and the first integrity error there
	checked, checkedBytes atomic.Uint64
	checkErr              error // under mu

	notes map[string]string // under mu

	ext *External // under mu: a server process of its own measured this side

	// Idle: memory before the first connection and once c.Conns are accepted
	conns    atomic.Int64
	idleOnce sync.Once
	before   memSample
	after    memSample
	idleDone chan struct{}
	// onIdle is called (once, from the sampling goroutine) after the idle sample
	onIdle func()
}

// NewMeter returns the meter of one side of c (client: the side that sends and stops at
// c.Duration), for a mode's own tests; the child processes make theirs in ChildMain.
func NewMeter(c Case, client bool) *Meter { return newMeter(c, client) }

func newMeter(c Case, client bool) *Meter {
	frame.Payload(c.Size) // build the payload now, outside any measured window
	return &Meter{c: c, client: client, idleDone: make(chan struct{})}
}

// IdleSettle is how long an Idle server waits after its last accepted connection
// before it samples its memory (goroutines and handlers settle into their idle state).
var IdleSettle = 300 * time.Millisecond

// Start opens the measured window: wall time and CPU are counted from here. Later
// calls do nothing. A client calls it when its connections are up; on a server the
// first byte fed to any Verifier calls it.
func (m *Meter) Start() {
	m.once.Do(func() {
		_ = unix.Getrusage(unix.RUSAGE_SELF, &m.ru0)
		m.t0 = time.Now()
		if m.client {
			m.timer = time.AfterFunc(m.c.Duration, func() { m.stopped.Store(true) })
		}
		m.started.Store(true)
	})
}

// Stopped reports whether a client should stop sending: true once Case.Duration has
// passed since Start. It calls Start if nobody has.
func (m *Meter) Stopped() bool {
	if !m.started.Load() {
		m.Start()
	}
	return m.stopped.Load()
}

// NewSource returns the frame source of one client connection.
func (m *Meter) NewSource() *frame.Source {
	corrupt := int64(-1)
	if m.client {
		corrupt = m.c.CorruptSeq
	}
	s, err := frame.NewSource(m.c.Size, corrupt)
	if err != nil {
		panic(err) // Case.Validate rejects such sizes before any mode runs
	}
	m.mu.Lock()
	m.sources = append(m.sources, s)
	m.mu.Unlock()
	return s
}

// NewVerifier returns the verifier of one connection's received bytes. A server asks
// for one per accepted connection: in the Idle scenario the c.Conns-th call starts the
// memory sample.
func (m *Meter) NewVerifier() *frame.Verifier {
	v, err := frame.NewVerifier(m.c.Size, m.Start)
	if err != nil {
		panic(err)
	}
	m.mu.Lock()
	m.verifiers = append(m.verifiers, v)
	m.mu.Unlock()
	if !m.client && m.c.Scenario == Idle && m.conns.Add(1) == int64(m.c.Conns) {
		m.idleOnce.Do(func() { go m.sampleIdle() })
	}
	return v
}

// sampleBefore takes the memory sample before any connection (ChildMain calls it when
// the server is listening).
func (m *Meter) sampleBefore() { m.before = readMem() }

func (m *Meter) sampleIdle() {
	time.Sleep(IdleSettle)
	m.mu.Lock()
	m.after = readMem()
	m.mu.Unlock()
	close(m.idleDone)
	if m.onIdle != nil {
		m.onIdle()
	}
}

// CheckFrame checks one whole request frame on its own (frame.Check: servers whose
// requests arrive in no fixed order, HTTP) and counts it as verified; the first error
// is kept and also returned by the server side's result. Safe for concurrent use.
func (m *Meter) CheckFrame(p []byte) error {
	m.Start()
	if _, err := frame.Check(p, m.c.Size); err != nil {
		m.mu.Lock()
		if m.checkErr == nil {
			m.checkErr = err
		}
		m.mu.Unlock()
		return err
	}
	m.checked.Add(1)
	m.checkedBytes.Add(uint64(len(p)))
	return nil
}

// Count adds units of work and their payload bytes that this side verified by its own
// means (services clients: a delivered message, a key-value response, a request wrk
// checked); they count as Frames and Bytes. Safe for concurrent use.
func (m *Meter) Count(units, bytes uint64) {
	m.checked.Add(units)
	m.checkedBytes.Add(bytes)
}

// CheckErr returns the first error CheckFrame found, or nil.
func (m *Meter) CheckErr() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.checkErr
}

// Note records a fact about this side (how a zc server steered its connections), shown
// in the results.
func (m *Meter) Note(key, value string) {
	m.mu.Lock()
	if m.notes == nil {
		m.notes = map[string]string{}
	}
	m.notes[key] = value
	m.mu.Unlock()
}

// Notes returns a copy of what Note recorded.
func (m *Meter) Notes() map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.notes)
}

// NewRecorder returns the round-trip latency recorder of one client connection.
func (m *Meter) NewRecorder() *stats.Recorder {
	r := &stats.Recorder{}
	m.mu.Lock()
	m.recs = append(m.recs, r)
	m.mu.Unlock()
	return r
}

// AddZeroCopy adds to the bytes a mode sent zero-copy and the bytes the kernel
// reported it copied instead (zc modes; others never call it).
func (m *Meter) AddZeroCopy(zc, copied uint64) {
	m.zc.Add(zc)
	m.copied.Add(copied)
}

// AddRecvMapped adds to the bytes a mapped receive path (TCP_ZEROCOPY_RECEIVE) got as
// mapped pages and the bytes it had to copy (zc-mmap; others never call it).
func (m *Meter) AddRecvMapped(mapped, copied uint64) {
	m.rxMapped.Add(mapped)
	m.rxCopied.Add(copied)
}

// Stop closes the measured window: a mode calls it when its traffic is over and only
// teardown (closing an engine, unmapping rings) is left, so that teardown is not
// counted. Later calls do nothing; if no one calls it, the window closes when Server
// or Client returns.
func (m *Meter) Stop() {
	m.stopOnce.Do(func() {
		_ = unix.Getrusage(unix.RUSAGE_SELF, &m.ru1)
		m.t1 = time.Now()
	})
}

// External is what a server running in a process of its own (the C reference servers,
// bench/internal/cref) measured of itself: its window (first received byte to its last
// connection's close, as Start and Stop bound a Go server's), its CPU time over that
// window (getrusage RUSAGE_SELF of that process: all its threads), and the frames and
// bytes its own checker verified (the checks of package frame).
type External struct {
	Wall, User, Sys time.Duration
	Frames, Bytes   uint64
}

// SetExternal makes e this side's figures: its window and CPU replace this process's
// (which only waited for the other), its frames and bytes count as verified. A server
// mode that runs its server as a child process calls it when that child has reported.
func (m *Meter) SetExternal(e External) {
	m.mu.Lock()
	m.ext = &e
	m.mu.Unlock()
}

// finish closes the window and returns this side's figures.
func (m *Meter) finish(role string) Side {
	m.Stop()
	if m.timer != nil {
		m.timer.Stop()
	}
	s := Side{Role: role}
	if m.started.Load() {
		s.Wall = m.t1.Sub(m.t0)
		s.User = tv(m.ru1.Utime) - tv(m.ru0.Utime)
		s.Sys = tv(m.ru1.Stime) - tv(m.ru0.Stime)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, src := range m.sources {
		s.Sent += src.Frames()
	}
	for _, v := range m.verifiers {
		s.Frames += v.Frames()
		s.Bytes += v.Bytes()
	}
	s.Frames += m.checked.Load()
	s.Bytes += m.checkedBytes.Load()
	if e := m.ext; e != nil {
		s.Wall, s.User, s.Sys = e.Wall, e.User, e.Sys
		s.Frames += e.Frames
		s.Bytes += e.Bytes
	}
	if len(m.notes) > 0 {
		s.Notes = maps.Clone(m.notes)
	}
	if !m.client && m.c.Scenario == Idle {
		s.Accepted = int(m.conns.Load())
		select {
		case <-m.idleDone:
			s.RSSBefore, s.RSSAfter = m.before.rss, m.after.rss
			s.PinBefore, s.PinAfter = m.before.pin, m.after.pin
		default:
		}
	}
	s.Lat = stats.Merge(m.recs...)
	s.ZCBytes = m.zc.Load()
	s.CopiedBytes = m.copied.Load()
	s.RxMappedBytes = m.rxMapped.Load()
	s.RxCopiedBytes = m.rxCopied.Load()
	return s
}

func tv(t unix.Timeval) time.Duration {
	return time.Duration(t.Sec)*time.Second + time.Duration(t.Usec)*time.Microsecond
}

// Side is what one process reports about its side of a case.
type Side struct {
	Role string `json:"role"`
	// Wall, User and Sys cover the measured window only.
	Wall time.Duration `json:"wall"`
	User time.Duration `json:"user"`
	Sys  time.Duration `json:"sys"`
	// Sent counts frames sent; Frames and Bytes what the verifiers checked.
	Sent   uint64          `json:"sent"`
	Frames uint64          `json:"frames"`
	Bytes  uint64          `json:"bytes"`
	Lat    stats.Latencies `json:"lat"`

	ZCBytes     uint64 `json:"zc_bytes"`
	CopiedBytes uint64 `json:"copied_bytes"`
	// Mapped receive path: bytes received as mapped pages / copied.
	RxMappedBytes uint64 `json:"rx_mapped_bytes"`
	RxCopiedBytes uint64 `json:"rx_copied_bytes"`
	CPUs          []int  `json:"cpus"`
	GOMAXPROCS    int    `json:"gomaxprocs"`

	// Idle server: connections accepted, and VmRSS / VmPin (bytes) before the first
	// connection and once all were accepted and settled (0: not sampled).
	Accepted            int    `json:"accepted,omitempty"`
	RSSBefore, RSSAfter uint64 `json:",omitempty"`
	PinBefore, PinAfter uint64 `json:",omitempty"`
	// Notes: facts a mode reports about this side (Meter.Note).
	Notes map[string]string `json:"notes,omitempty"`
}

// CPU is the process CPU time of the window.
func (s Side) CPU() time.Duration { return s.User + s.Sys }

// memSample is what /proc/self/status says about this process's memory, in bytes.
type memSample struct{ rss, pin uint64 }

// readMem reads VmRSS (resident memory) and VmPin (pinned pages: io_uring's registered
// buffers count there) from /proc/self/status; a missing field reads as 0.
func readMem() memSample {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return memSample{}
	}
	return parseStatus(b)
}

func parseStatus(b []byte) memSample {
	var m memSample
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := bytes.Cut(sc.Bytes(), []byte(":"))
		if !ok {
			continue
		}
		f := bytes.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseUint(string(f[0]), 10, 64)
		if err != nil {
			continue
		}
		if len(f) > 1 && string(f[1]) == "kB" {
			n *= 1024
		}
		switch string(k) {
		case "VmRSS":
			m.rss = n
		case "VmPin":
			m.pin = n
		}
	}
	return m
}
