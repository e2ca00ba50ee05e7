package harness

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/zcnet/zcnet/bench/internal/frame"
)

// wrkPath is what wrk GETs in the HTTPWrk scenario.
const wrkPath = "/body"

// WrkBody is the HTTPWrk response body of size bytes: letters in a pattern that wrk's
// script rebuilds on its side to compare every response with.
func WrkBody(size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = 'a' + byte(i*7%26)
	}
	return b
}

// wrkScript checks every response of wrk against the body WrkBody makes (LuaJIT interns
// strings: the comparison is a hash and a memcmp of the whole body) and prints the
// counts of all threads at the end.
const wrkScript = `
local size = %d
local parts = {}
for i = 0, size - 1 do parts[#parts + 1] = string.char(97 + (i * 7) %% 26) end
local expected = table.concat(parts)
local threads = {}
body_ok = 0
body_bad = 0
function setup(thread) table.insert(threads, thread) end
function response(status, headers, body)
  if status == 200 and body == expected then body_ok = body_ok + 1 else body_bad = body_bad + 1 end
end
function done(summary, latency, requests)
  local ok, bad = 0, 0
  for _, t in ipairs(threads) do ok = ok + t:get("body_ok"); bad = bad + t:get("body_bad") end
  local e = summary.errors
  io.write(string.format("ZCBENCH ok=%%d bad=%%d errors=%%d p50=%%d p99=%%d\n", ok, bad,
    e.connect + e.read + e.write + e.status + e.timeout, latency:percentile(50), latency:percentile(99)))
end
`

// WrkAvailable reports whether wrk can run here.
func WrkAvailable() error {
	if _, err := exec.LookPath("wrk"); err != nil {
		return fmt.Errorf("wrk not installed (Debian package wrk; make bench installs it when it can)")
	}
	return nil
}

var wrkLine = regexp.MustCompile(`ZCBENCH ok=(\d+) bad=(\d+) errors=(\d+) p50=(\d+) p99=(\d+)`)

// wrkClient runs wrk against the server for c.Duration (whole seconds, at least one) on
// c.Conns keep-alive connections, one thread per CPU of this process; every response is
// checked by the script; then it tells the server to quit.
func wrkClient(ctx context.Context, c Case, m *Meter) error {
	dir, err := os.MkdirTemp("", "zcbench-wrk")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	script := filepath.Join(dir, "check.lua")
	if err := os.WriteFile(script, []byte(fmt.Sprintf(wrkScript, c.Size)), 0o644); err != nil {
		return err
	}
	scheme := "http://"
	if c.Scenario == HTTPSWrk {
		scheme = "https://" // wrk does not verify the server's certificate
	}
	secs := max(1, int(c.Duration.Round(time.Second)/time.Second))
	threads := max(1, min(len(AllowedCPUs()), c.Conns))
	var out, errb bytes.Buffer
	m.Start()
	// A machine too loaded to finish one request of c.Conns connections in the window (the
	// tiny runs of the tests: 1 s, 512 connections, on a busy 2-CPU machine) gets a longer
	// window, up to 8 s; the extra time is in the CPU measured, and a note says so.
	var runErr error
	var g []string
	for try := 0; ; try++ {
		out.Reset()
		errb.Reset()
		cmd := exec.CommandContext(ctx, "wrk", "-t", strconv.Itoa(threads), "-c", strconv.Itoa(c.Conns),
			"-d", fmt.Sprintf("%ds", secs), "--timeout", "5s", "-s", script, scheme+c.Addr+wrkPath)
		cmd.Stdout, cmd.Stderr = &out, &errb
		runErr = cmd.Run()
		g = wrkLine.FindStringSubmatch(out.String())
		if runErr != nil || g == nil || g[1] != "0" || g[2] != "0" || g[3] != "0" || secs >= 8 || ctx.Err() != nil {
			if try > 0 {
				m.Note("wrk_retries", strconv.Itoa(try))
			}
			break
		}
		secs *= 2
	}
	m.Stop()
	quitErr := wrkQuit(ctx, scheme, c.Addr)
	if runErr != nil {
		return fmt.Errorf("wrk: %w: %s%s", runErr, out.String(), errb.String())
	}
	if g == nil {
		return fmt.Errorf("wrk printed no counts: %s%s", out.String(), errb.String())
	}
	ok, _ := strconv.ParseUint(g[1], 10, 64)
	bad, _ := strconv.ParseUint(g[2], 10, 64)
	nerr, _ := strconv.ParseUint(g[3], 10, 64)
	if bad > 0 {
		return fmt.Errorf("%w: wrk: %d of %d responses were not the %d byte body", frame.ErrCorrupt, bad, ok+bad, c.Size)
	}
	if nerr > 0 {
		return fmt.Errorf("wrk: %d socket or status errors: %s", nerr, strings.TrimSpace(out.String()))
	}
	m.Count(ok, ok*uint64(c.Size))
	m.Note("wrk_p50_us", g[4])
	m.Note("wrk_p99_us", g[5])
	return quitErr
}

func wrkQuit(ctx context.Context, scheme, addr string) error {
	var d net.Dialer
	d.SetMultipathTCP(false)
	// https: the server's certificate is a self-signed one it made at start
	tr := &http.Transport{DialContext: d.DialContext, TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, scheme+addr+httpQuitPath, nil)
	if err != nil {
		return err
	}
	r, err := cl.Do(req)
	if err != nil {
		return fmt.Errorf("quit: %w", err)
	}
	r.Body.Close()
	return nil
}
