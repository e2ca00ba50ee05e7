package harness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/zcnet/zcnet/bench/internal/frame"
)

// Env is where the cases of one zcbench run execute.
type Env struct {
	// Exe is the program to re-execute for the child roles (zcbench itself).
	Exe string
	// ExtraEnv is appended to the children's environment.
	ExtraEnv []string
	// ServerHost is the address the server listens on: 127.0.0.1, or the server
	// namespace's address.
	ServerHost   string
	Server       Placement
	Client       Placement
	Procs        *Procs
	StartTimeout time.Duration // how long a server may take to listen; 0: 10 s
}

// Rep is the outcome of one repetition of one case. Figures that do not apply to the
// scenario are NaN.
type Rep struct {
	Gbps     float64 `json:"gbps"`
	MsgsPerS float64 `json:"msgs_per_s"`
	// Round-trip latency percentiles in microseconds.
	P50us, P99us, P999us float64
	// CPU seconds per GB of payload of the sending and the receiving side.
	CPUSndPerGB, CPURcvPerGB float64
	// CPU microseconds per message, both sides together, and the server's alone
	// (request/response scenarios).
	CPUusPerMsg, SrvCPUusPerMsg float64
	// SrvCPUPerGB is the server's CPU seconds per GB of payload the client verified
	// (services: the relay's CPU per GB relayed, the file server's per GB sent).
	SrvCPUPerGB float64
	// Idle: connections the server held when it sampled its memory, its resident
	// memory growth per connection ((VmRSS after − before) / conns, bytes), and its
	// pinned memory (VmPin, bytes) with all connections open.
	IdleConns        int
	IdleBytesPerConn float64
	IdlePinned       float64
	// Round is the repetition (0-based) this Rep belongs to: variants interleave, so
	// the Reps of one round ran side by side.
	Round       int
	Bytes       uint64
	ZCBytes     uint64
	CopiedBytes uint64
	// Mapped receive path (zc-mmap): bytes received as mapped pages / copied.
	RxMappedBytes, RxCopiedBytes uint64
	Server                       Side
	Client                       Side
}

// IntegrityError is a run that moved wrong bytes; it fails the whole benchmark.
type IntegrityError struct {
	Case Case
	Msg  string
}

func (e *IntegrityError) Error() string {
	return fmt.Sprintf("%s %s size %d conns %d: %s", e.Case.Mode, e.Case.Scenario, e.Case.Size, e.Case.Conns, e.Msg)
}

// Unwrap makes errors.Is(err, frame.ErrCorrupt) true.
func (e *IntegrityError) Unwrap() error { return frame.ErrCorrupt }

// RunPair runs c once: a server child, then a client child dialling it; it waits for
// both, checks that every frame sent was verified, and computes the figures.
func RunPair(ctx context.Context, env *Env, c Case) (Rep, error) {
	if err := c.Validate(); err != nil {
		return Rep{}, err
	}
	limit := c.Deadline()
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()

	sc := c
	sc.Addr = net.JoinHostPort(env.ServerHost, "0")
	srv, err := startChild(env, "server", sc, env.Server)
	if err != nil {
		return Rep{}, err
	}
	defer srv.kill()
	st := env.StartTimeout
	if st == 0 {
		st = 10 * time.Second
	}
	addr, err := srv.ready(st)
	if err != nil {
		return Rep{}, fmt.Errorf("%s server: %w%s", c.Mode, err, srv.stderrTail())
	}
	cc := c
	cc.Addr = addr
	cli, err := startChild(env, "client", cc, env.Client)
	if err != nil {
		return Rep{}, err
	}
	defer cli.kill()
	// Idle: the client holds its connections until the server has sampled its memory.
	srv.onIdle = cli.release

	var wg sync.WaitGroup
	var cliSide, srvSide Side
	var cliErr, srvErr error
	wg.Add(2)
	go func() { defer wg.Done(); cliSide, cliErr = cli.result() }()
	go func() { defer wg.Done(); srvSide, srvErr = srv.result() }()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		cli.kill()
		srv.kill()
		<-done
		return Rep{}, fmt.Errorf("%s %s: no result within %v", c.Mode, c.Scenario, limit)
	}
	for _, e := range []error{srvErr, cliErr} {
		var ie *IntegrityError
		if errors.As(e, &ie) {
			ie.Case = c
			return Rep{}, ie
		}
	}
	if srvErr != nil {
		return Rep{}, srvErr
	}
	if cliErr != nil {
		return Rep{}, cliErr
	}
	return compute(c, srvSide, cliSide)
}

func compute(c Case, srv, cli Side) (Rep, error) {
	nan := math.NaN()
	r := Rep{Gbps: nan, MsgsPerS: nan, P50us: nan, P99us: nan, P999us: nan,
		CPUSndPerGB: nan, CPURcvPerGB: nan, CPUusPerMsg: nan, SrvCPUusPerMsg: nan, SrvCPUPerGB: nan,
		IdleBytesPerConn: nan, IdlePinned: nan, Server: srv, Client: cli}
	r.ZCBytes = srv.ZCBytes + cli.ZCBytes
	r.CopiedBytes = srv.CopiedBytes + cli.CopiedBytes
	r.RxMappedBytes = srv.RxMappedBytes + cli.RxMappedBytes
	r.RxCopiedBytes = srv.RxCopiedBytes + cli.RxCopiedBytes
	bad := func(format string, args ...any) (Rep, error) {
		return Rep{}, &IntegrityError{Case: c, Msg: fmt.Sprintf(format, args...)}
	}
	if c.Scenario == Idle {
		if srv.Accepted != c.Conns || srv.RSSAfter == 0 {
			return Rep{}, fmt.Errorf("%s idle: the server accepted %d of %d connections, memory sampled: %v", c.Mode, srv.Accepted, c.Conns, srv.RSSAfter != 0)
		}
		r.IdleConns = srv.Accepted
		r.IdleBytesPerConn = (float64(srv.RSSAfter) - float64(srv.RSSBefore)) / float64(srv.Accepted)
		r.IdlePinned = float64(srv.PinAfter)
		return r, nil
	}
	if c.Scenario.Service() {
		// The client checked every unit (a relayed frame, a delivered message, a file
		// frame, a key-value response, a request) and returned a wrong-bytes error itself
		// for anything missing or damaged; the server's CPU is spread over what it
		// verified.
		if cli.Frames == 0 || cli.Wall <= 0 {
			return Rep{}, fmt.Errorf("%s %s: no units of work verified", c.Mode, c.Scenario)
		}
		r.Bytes = cli.Bytes
		r.MsgsPerS = float64(cli.Frames) / cli.Wall.Seconds()
		r.CPUusPerMsg = (cli.CPU() + srv.CPU()).Seconds() * 1e6 / float64(cli.Frames)
		r.SrvCPUusPerMsg = srv.CPU().Seconds() * 1e6 / float64(cli.Frames)
		if cli.Bytes > 0 {
			gb := float64(cli.Bytes) / 1e9
			r.Gbps = gb * 8 / cli.Wall.Seconds()
			r.SrvCPUPerGB = srv.CPU().Seconds() / gb
		}
		if cli.Lat.N > 0 {
			r.P50us, r.P99us, r.P999us = us(cli.Lat.P50), us(cli.Lat.P99), us(cli.Lat.P999)
		}
		return r, nil
	}
	if c.Scenario.RequestResponse() {
		if cli.Frames != cli.Sent || srv.Frames != cli.Sent {
			return bad("client sent %d requests, server verified %d, client verified %d responses", cli.Sent, srv.Frames, cli.Frames)
		}
		if cli.Frames == 0 || cli.Wall <= 0 {
			return Rep{}, fmt.Errorf("%s %s: no messages exchanged", c.Mode, c.Scenario)
		}
		r.Bytes = cli.Frames * uint64(c.Size)
		r.MsgsPerS = float64(cli.Frames) / cli.Wall.Seconds()
		r.P50us = us(cli.Lat.P50)
		r.P99us = us(cli.Lat.P99)
		r.P999us = us(cli.Lat.P999)
		r.CPUusPerMsg = (cli.CPU() + srv.CPU()).Seconds() * 1e6 / float64(cli.Frames)
		r.SrvCPUusPerMsg = srv.CPU().Seconds() * 1e6 / float64(cli.Frames)
		return r, nil
	}
	if srv.Frames != cli.Sent {
		return bad("client sent %d frames, server verified %d", cli.Sent, srv.Frames)
	}
	if srv.Bytes == 0 || srv.Wall <= 0 {
		return Rep{}, fmt.Errorf("%s %s: no bytes received", c.Mode, c.Scenario)
	}
	r.Bytes = srv.Bytes
	gb := float64(srv.Bytes) / 1e9
	r.Gbps = gb * 8 / srv.Wall.Seconds()
	r.MsgsPerS = float64(srv.Frames) / srv.Wall.Seconds()
	r.CPUSndPerGB = cli.CPU().Seconds() / gb
	r.CPURcvPerGB = srv.CPU().Seconds() / gb
	return r, nil
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

type child struct {
	role   string
	c      Case
	cmd    *exec.Cmd
	procs  *Procs
	lines  *bufio.Scanner
	stdin  io.WriteCloser
	stderr *tailBuffer
	once   sync.Once
	waited chan error
	// onIdle runs when the server says it has sampled its idle memory.
	onIdle func()
}

func startChild(env *Env, role string, c Case, p Placement) (*child, error) {
	cmd := exec.Command(env.Exe, childArgs(role, c)...)
	cmd.Env = append(cmd.Environ(), env.ExtraEnv...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	tb := &tailBuffer{max: 4096}
	cmd.Stderr = tb
	if err := env.Procs.Start(cmd, p); err != nil {
		return nil, fmt.Errorf("start %s %s: %w", c.Mode, role, err)
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	return &child{role: role, c: c, cmd: cmd, procs: env.Procs, lines: sc, stdin: in, stderr: tb}, nil
}

// release tells a client that holds its connections (Idle) to close them.
func (ch *child) release() {
	_, _ = io.WriteString(ch.stdin, releaseLine+"\n")
	_ = ch.stdin.Close()
}

// ready waits for the server's READY line.
func (ch *child) ready(timeout time.Duration) (string, error) {
	got := make(chan string, 1)
	go func() {
		for ch.lines.Scan() {
			if a, ok := strings.CutPrefix(ch.lines.Text(), "READY "); ok {
				got <- a
				return
			}
		}
		close(got)
	}()
	select {
	case a, ok := <-got:
		if !ok {
			return "", fmt.Errorf("exited before listening: %v", ch.wait())
		}
		return a, nil
	case <-time.After(timeout):
		ch.kill()
		return "", fmt.Errorf("not listening after %v", timeout)
	}
}

// result reads the RESULT line and waits for the process.
func (ch *child) result() (Side, error) {
	var side Side
	var found bool
	for ch.lines.Scan() {
		if ch.lines.Text() == idleLine && ch.onIdle != nil {
			ch.onIdle()
			continue
		}
		if b, ok := strings.CutPrefix(ch.lines.Text(), "RESULT "); ok {
			if err := json.Unmarshal([]byte(b), &side); err != nil {
				return side, fmt.Errorf("%s %s: bad result: %w", ch.c.Mode, ch.role, err)
			}
			found = true
		}
	}
	err := ch.wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == exitCorrupt {
		return side, &IntegrityError{Case: ch.c, Msg: ch.role + ": " + strings.TrimSpace(ch.stderr.String())}
	}
	if err != nil {
		return side, fmt.Errorf("%s %s: %w%s", ch.c.Mode, ch.role, err, ch.stderrTail())
	}
	if !found {
		return side, fmt.Errorf("%s %s: exited without a result%s", ch.c.Mode, ch.role, ch.stderrTail())
	}
	return side, nil
}

func (ch *child) wait() error {
	ch.once.Do(func() {
		ch.waited = make(chan error, 1)
		go func() {
			err := ch.cmd.Wait()
			ch.procs.Done(ch.cmd)
			ch.waited <- err
			close(ch.waited)
		}()
	})
	err, ok := <-ch.waited
	if !ok {
		return nil
	}
	return err
}

// kill ends the child (by its PID; harmless once it has exited) and reaps it.
func (ch *child) kill() {
	_ = ch.stdin.Close()
	_ = ch.cmd.Process.Kill()
	_ = ch.wait()
}

func (ch *child) stderrTail() string {
	s := strings.TrimSpace(ch.stderr.String())
	if s == "" {
		return ""
	}
	return ":\n" + s
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   bytes.Buffer
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b.Write(p)
	if t.b.Len() > t.max {
		keep := t.b.Bytes()[t.b.Len()-t.max:]
		nb := append([]byte(nil), keep...)
		t.b.Reset()
		t.b.Write(nb)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.b.String()
}
