// Package cref builds and runs zcbench's C reference servers: what an echo server costs
// per request when it is written in C against the kernel directly, so that every run
// shows zc's server CPU against the limit and not only against Go.
//
//   - uring.c ("c-uring"): io_uring through the raw system calls and the kernel's uapi
//     header (no liburing): SINGLE_ISSUER|DEFER_TASKRUN where available, a provided-buffer
//     ring with one multishot RECV per connection, one SEND per received chunk from the
//     buffer the kernel filled, one io_uring_enter per loop (submit and wait).
//   - epoll.c ("c-epoll"): non-blocking sockets on a level-triggered epoll instance, one
//     read(2) and one write(2) per readiness.
//
// Both check every received byte with the frame checks of bench/internal/frame (in C, the
// same CRC-32C) before echoing it, as every Go server of zcbench does, and report their own
// measured window (first received byte to the last connection's close) and CPU time
// (getrusage of the whole process) on a RESULT line; c/cref.h describes the protocol.
//
// The sources are embedded; Build compiles each with the machine's gcc -O2 into a cache
// folder named by the hash of the sources and flags, once ($ZCBENCH_CREF_BIN: a folder of
// prebuilt ones instead, as the bench kit has). A machine without gcc (or
// without the kernel's uapi headers, package linux-libc-dev) gets an error saying so:
// zcbench prints it as "mode c-uring: not available: ..." and runs the other modes.
package cref

import (
	"bufio"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/zcnet/zcnet/bench/internal/frame"
)

//go:embed c/cref.h c/uring.c c/epoll.c
var sources embed.FS

// Kind names one reference server.
type Kind string

// The reference servers.
const (
	Uring Kind = "uring"
	Epoll Kind = "epoll"
)

// cflags are gcc's flags for every server.
var cflags = []string{"-O2", "-Wall", "-pthread"}

// BinDirEnv names the environment variable that points Build at a folder of prebuilt
// servers (c-uring, c-epoll) instead of compiling: the bench kit carries static ones
// (make bench-kit) to machines without gcc.
const BinDirEnv = "ZCBENCH_CREF_BIN"

// CacheDir is where Build puts the binaries: $ZCBENCH_CACHE if set, else the user's cache
// folder (os.UserCacheDir) under zcbench/, else the temporary folder.
func CacheDir() string {
	if d := os.Getenv("ZCBENCH_CACHE"); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "zcbench")
	}
	return filepath.Join(os.TempDir(), "zcbench-cache")
}

var (
	buildMu sync.Mutex
	built   = map[Kind]string{}
)

// Build returns the path of the compiled server k, compiling it at first use (in this
// process and on this machine: the cache outlives the process).
func Build(k Kind) (string, error) {
	if k != Uring && k != Epoll {
		return "", fmt.Errorf("cref: unknown server %q", k)
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[k]; ok {
		return p, nil
	}
	if dir := os.Getenv(BinDirEnv); dir != "" {
		// prebuilt (make bench-kit: a machine without gcc)
		bin := filepath.Join(dir, "c-"+string(k))
		if fi, err := os.Stat(bin); err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o100 == 0 {
			return "", fmt.Errorf("$%s=%s has no executable c-%s", BinDirEnv, dir, k)
		}
		built[k] = bin
		return bin, nil
	}
	h := sha256.New()
	for _, name := range []string{"cref.h", string(k) + ".c"} {
		b, err := sources.ReadFile("c/" + name)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", name, len(b))
		h.Write(b)
	}
	fmt.Fprintf(h, "%s %s\n", strings.Join(cflags, " "), runtime.GOARCH)
	dir := filepath.Join(CacheDir(), "cref-"+hex.EncodeToString(h.Sum(nil))[:16])
	bin := filepath.Join(dir, "c-"+string(k))
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o100 != 0 {
		built[k] = bin
		return bin, nil
	}
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		return "", errors.New("gcc not found: the C reference servers are compiled at first use (install it: bash .ci/need.sh gcc uringhdr)")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("cref: cache: %w", err)
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", fmt.Errorf("cref: cache: %w", err)
	}
	defer os.RemoveAll(tmp)
	for _, name := range []string{"cref.h", string(k) + ".c"} {
		b, _ := sources.ReadFile("c/" + name)
		if err := os.WriteFile(filepath.Join(tmp, name), b, 0o644); err != nil {
			return "", fmt.Errorf("cref: %w", err)
		}
	}
	args := append(append([]string{}, cflags...), "-o", filepath.Join(tmp, "bin"), filepath.Join(tmp, string(k)+".c"))
	out, err := exec.Command(gcc, args...).CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if len(msg) > 600 {
			msg = "..." + msg[len(msg)-600:]
		}
		hint := ""
		if strings.Contains(msg, "linux/io_uring.h") {
			hint = " (the kernel's uapi headers are missing: bash .ci/need.sh uringhdr)"
		}
		return "", fmt.Errorf("gcc %s.c failed: %v: %s%s", k, err, msg, hint)
	}
	// rename is atomic: a concurrent build elsewhere leaves one whole binary either way
	if err := os.Rename(filepath.Join(tmp, "bin"), bin); err != nil {
		return "", fmt.Errorf("cref: %w", err)
	}
	built[k] = bin
	return bin, nil
}

// Config is what a server is told.
type Config struct {
	// Addr is host:port to listen on (port 0: any).
	Addr string
	// Conns is how many connections it accepts before serving; it returns when all
	// have ended.
	Conns int
	// Size is the frame size of the requests (bench/internal/frame).
	Size int
	// Threads is how many threads serve (each pinned to one CPU of the process's mask,
	// connection i to thread i mod Threads); 0 or 1: one, not pinned.
	Threads int
}

// Result is what a server reports at its end.
type Result struct {
	// Frames and Bytes are what its checker verified.
	Frames, Bytes uint64
	// Wall, User and Sys cover its measured window: first received byte to the close
	// of its last connection (zero when no byte arrived).
	Wall, User, Sys time.Duration
	// Resets counts connections that ended in an error (reset, broken pipe).
	Resets int
	// Threads is how many threads served; Setup how (c-uring: the ring's task-running
	// flags; c-epoll: "epoll-level-triggered").
	Threads int
	Setup   string
}

// PayloadCRC is the CRC-32C of the payload of a frame of size bytes, which the C checker
// compares every frame with.
func PayloadCRC(size int) uint32 {
	return crc32.Checksum(frame.Payload(size), crc32.MakeTable(crc32.Castagnoli))
}

// ExitCorrupt is the C servers' exit status when a received byte was wrong.
const ExitCorrupt = 3

// Serve runs server k with cfg until every connection has ended, calling ready with the
// bound address once it listens. Cancelling ctx kills the server (its PID only). The
// server gets SIGKILL if the thread that started it dies. A wrong byte is an error that
// wraps frame.ErrCorrupt. stderr, if not nil, receives the server's stderr as well.
func Serve(ctx context.Context, k Kind, cfg Config, ready func(addr string), stderr io.Writer) (Result, error) {
	bin, err := Build(k)
	if err != nil {
		return Result{}, err
	}
	threads := max(cfg.Threads, 1)
	cmd := exec.Command(bin, "-addr", cfg.Addr, "-conns", strconv.Itoa(cfg.Conns), "-size", strconv.Itoa(cfg.Size),
		"-crc", strconv.FormatUint(uint64(PayloadCRC(cfg.Size)), 16), "-threads", strconv.Itoa(threads))
	var errBuf tail
	cmd.Stderr = &errBuf
	if stderr != nil {
		cmd.Stderr = io.MultiWriter(&errBuf, stderr)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return Result{}, err
	}
	// Pdeathsig fires when the forking thread exits: this goroutine keeps its thread
	// until the server has been waited for.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return Result{}, fmt.Errorf("start c-%s: %w", k, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = cmd.Process.Kill() })
	defer stop()

	var res Result
	var parseErr error
	sawResult := false
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "READY "):
			ready(strings.TrimPrefix(line, "READY "))
		case strings.HasPrefix(line, "RESULT "):
			res, parseErr = parseResult(strings.TrimPrefix(line, "RESULT "))
			sawResult = true
		}
	}
	werr := cmd.Wait()
	if ctx.Err() != nil {
		return Result{}, fmt.Errorf("c-%s: %w", k, ctx.Err())
	}
	if werr != nil {
		var ee *exec.ExitError
		if errors.As(werr, &ee) && ee.ExitCode() == ExitCorrupt {
			return Result{}, fmt.Errorf("c-%s: %w: %s", k, frame.ErrCorrupt, errBuf.String())
		}
		return Result{}, fmt.Errorf("c-%s: %v: %s", k, werr, errBuf.String())
	}
	if !sawResult {
		return Result{}, fmt.Errorf("c-%s: exited without a RESULT line: %s", k, errBuf.String())
	}
	return res, parseErr
}

// parseResult reads "frames=N bytes=N wall_ns=N user_us=N sys_us=N resets=N threads=N setup=S".
func parseResult(s string) (Result, error) {
	var r Result
	for _, f := range strings.Fields(s) {
		key, val, ok := strings.Cut(f, "=")
		if !ok {
			return r, fmt.Errorf("bad RESULT field %q", f)
		}
		if key == "setup" {
			r.Setup = val
			continue
		}
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil || n < 0 {
			return r, fmt.Errorf("bad RESULT field %q", f)
		}
		switch key {
		case "frames":
			r.Frames = uint64(n)
		case "bytes":
			r.Bytes = uint64(n)
		case "wall_ns":
			r.Wall = time.Duration(n)
		case "user_us":
			r.User = time.Duration(n) * time.Microsecond
		case "sys_us":
			r.Sys = time.Duration(n) * time.Microsecond
		case "resets":
			r.Resets = int(n)
		case "threads":
			r.Threads = int(n)
		}
	}
	return r, nil
}

// tail keeps the last 2 KiB written to it.
type tail struct {
	mu sync.Mutex
	b  []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > 2048 {
		t.b = append(t.b[:0], t.b[len(t.b)-2048:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
}
