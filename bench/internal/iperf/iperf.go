// Package iperf runs iperf3 as zcbench's outside reference for the bulk scenario: a
// one-off server and a client with the same write size, each a child process placed
// like zcbench's own sides, with CPU time taken from each process's rusage.
package iperf

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/zcnet/zcnet/bench/internal/harness"
)

// Name is the mode name of iperf3 in results.
const Name = "iperf3"

// Available returns nil if an iperf3 binary is on PATH and runs (its libraries load:
// the benchmark kit carries them unpacked from Debian packages).
func Available() error {
	path, err := exec.LookPath("iperf3")
	if err != nil {
		return errors.New("iperf3 not installed (make bench installs it: apt-get install iperf3)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, path, "--version").CombinedOutput(); err != nil {
		return fmt.Errorf("%s --version: %v: %s", path, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Seconds is the duration iperf3 runs for a wanted duration: iperf3 takes whole
// seconds only (and 0 would mean forever).
func Seconds(d time.Duration) int {
	return max(1, int(math.Round(d.Seconds())))
}

// Run runs one bulk transfer of size-byte writes for about d.
func Run(ctx context.Context, env *harness.Env, size int, d time.Duration) (harness.Rep, error) {
	secs := Seconds(d)
	ctx, cancel := context.WithTimeout(ctx, time.Duration(secs)*time.Second+30*time.Second)
	defer cancel()
	port, err := freePort(env)
	if err != nil {
		return harness.Rep{}, err
	}
	srv := exec.Command("iperf3", "-s", "-1", "--forceflush", "-B", env.ServerHost, "-p", strconv.Itoa(port))
	out, err := srv.StdoutPipe()
	if err != nil {
		return harness.Rep{}, err
	}
	if err := env.Procs.Start(srv, env.Server); err != nil {
		return harness.Rep{}, fmt.Errorf("start iperf3 server: %w", err)
	}
	srvDone := make(chan struct{}) // closed once the server has been reaped
	defer func() {
		_ = srv.Process.Kill() // by PID; harmless after exit
		<-srvDone
	}()
	listening := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		signalled := false
		for sc.Scan() {
			if !signalled && strings.Contains(sc.Text(), "Server listening") {
				close(listening)
				signalled = true
			}
		}
		_ = srv.Wait() // its verdict is the client's JSON
		env.Procs.Done(srv)
		if !signalled {
			close(listening)
		}
		close(srvDone)
	}()
	select {
	case <-listening:
	case <-ctx.Done():
		return harness.Rep{}, errors.New("iperf3 server did not start")
	}

	cli := exec.CommandContext(ctx, "iperf3", "-c", env.ServerHost, "-p", strconv.Itoa(port),
		"-t", strconv.Itoa(secs), "-l", strconv.Itoa(size), "-J")
	cli.Cancel = func() error { return cli.Process.Kill() }
	var stdout strings.Builder
	cli.Stdout = &stdout
	if err := env.Procs.Start(cli, env.Client); err != nil {
		return harness.Rep{}, fmt.Errorf("start iperf3 client: %w", err)
	}
	cerr := cli.Wait()
	env.Procs.Done(cli)
	if cerr != nil {
		return harness.Rep{}, fmt.Errorf("iperf3 client: %w: %s", cerr, tail(stdout.String()))
	}
	select {
	case <-srvDone:
	case <-ctx.Done():
		return harness.Rep{}, errors.New("iperf3 server did not exit")
	}
	res, err := Parse([]byte(stdout.String()))
	if err != nil {
		return harness.Rep{}, err
	}
	gb := float64(res.Bytes) / 1e9
	nan := math.NaN()
	r := harness.Rep{Gbps: res.BitsPerSecond / 1e9, MsgsPerS: nan, P50us: nan, P99us: nan, P999us: nan, CPUusPerMsg: nan, Bytes: res.Bytes}
	r.CPUSndPerGB = cpu(cli).Seconds() / gb
	r.CPURcvPerGB = cpu(srv).Seconds() / gb
	return r, nil
}

func cpu(c *exec.Cmd) time.Duration {
	if c.ProcessState == nil {
		return 0
	}
	return c.ProcessState.UserTime() + c.ProcessState.SystemTime()
}

// Result is what zcbench takes from iperf3's JSON output.
type Result struct {
	Bytes         uint64
	BitsPerSecond float64
}

// Parse reads the client's -J output: the receiver's totals.
func Parse(b []byte) (Result, error) {
	var doc struct {
		Error string `json:"error"`
		End   struct {
			SumReceived struct {
				Bytes         uint64  `json:"bytes"`
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return Result{}, fmt.Errorf("iperf3 JSON: %w", err)
	}
	if doc.Error != "" {
		return Result{}, fmt.Errorf("iperf3: %s", doc.Error)
	}
	s := doc.End.SumReceived
	if s.Bytes == 0 || s.BitsPerSecond <= 0 {
		return Result{}, errors.New("iperf3 JSON: no end.sum_received totals")
	}
	return Result{Bytes: s.Bytes, BitsPerSecond: s.BitsPerSecond}, nil
}

// freePort picks the port for the iperf3 server. In a namespace zcbench created
// nothing else listens, so iperf3's usual port is free; on loopback the kernel picks.
func freePort(env *harness.Env) (int, error) {
	if env.Server.NetNS != nil {
		return 5201, nil
	}
	l, err := net.Listen("tcp4", net.JoinHostPort(env.ServerHost, "0"))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(s string) string {
	if len(s) > 2000 {
		return s[len(s)-2000:]
	}
	return s
}
