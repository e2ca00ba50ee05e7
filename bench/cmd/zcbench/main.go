// Command zcbench measures zcnet against plain sockets on this machine: bulk
// throughput and CPU per GB, echo and small-message rates, ping-pong latency. Every
// case runs as a server and a client child process of zcbench (pinned to different
// CPUs when there are two), variants interleave A B C A B C, each figure is a median
// with min–max over the repetitions, and every payload byte is checked.
//
// Usage:
//
//	zcbench [-quick] [-json FILE] [-png FILE] [-netns] [-modes net,syscall,...]
//
// `make bench` runs it with its defaults (about 3 minutes); -quick takes about 60 s.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/zcnet/zcnet/bench/internal/frame"
	"github.com/zcnet/zcnet/bench/internal/harness"
	"github.com/zcnet/zcnet/bench/internal/iperf"
	"github.com/zcnet/zcnet/bench/internal/modes"
	"github.com/zcnet/zcnet/bench/internal/netns"
	"github.com/zcnet/zcnet/bench/internal/report"
)

func main() {
	if harness.IsChild(os.Args) {
		os.Exit(harness.ChildMain(os.Args[1:], modes.All(), os.Stdout, os.Stderr))
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

type config struct {
	quick      bool
	budget     time.Duration
	reps       int
	dur        time.Duration
	modes      string
	scenarios  string
	jsonPath   string
	pngPath    string
	useNetns   bool
	corruptSeq int64
	profileDir string
	pin        bool
}

// run is zcbench with its arguments; it returns the exit status: 0 done, 1 error,
// 2 bad usage, 3 wrong bytes (the payload check failed).
func run(args []string, stdout, stderr io.Writer) int {
	var cfg config
	fs := flag.NewFlagSet("zcbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&cfg.quick, "quick", false, "short run: about 60 s, 3 repetitions")
	fs.DurationVar(&cfg.budget, "budget", 0, "target total run time (default 3m, or 60s with -quick)")
	fs.IntVar(&cfg.reps, "reps", 0, "repetitions of every variant (default 5, or 3 with -quick)")
	fs.DurationVar(&cfg.dur, "d", 0, "traffic time of one repetition (default: derived from -budget)")
	fs.StringVar(&cfg.modes, "modes", "", "comma-separated modes to run (default: all available: "+strings.Join(allModeNames(), ",")+")")
	fs.StringVar(&cfg.scenarios, "scenarios", "", "comma-separated scenarios (default: bulk,echo,pingpong,stream)")
	fs.StringVar(&cfg.jsonPath, "json", "", "write results as JSON to `FILE`")
	fs.StringVar(&cfg.pngPath, "png", "", "write plots as PNG to `FILE`")
	fs.BoolVar(&cfg.useNetns, "netns", false, "run across two network namespaces joined by a multi-queue veth pair (root)")
	fs.Int64Var(&cfg.corruptSeq, "selftest-corrupt", -1, "corrupt frame `N` of every client connection: the run must fail (checks the checker)")
	fs.BoolVar(&cfg.pin, "pin", true, "pin client and server to different CPUs (when there are two)")
	fs.StringVar(&cfg.profileDir, "cpuprofile", "", "write a CPU profile of every server and client child into `DIR` (pprof)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "zcbench: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if cfg.budget == 0 {
		cfg.budget = 3 * time.Minute
		if cfg.quick {
			cfg.budget = time.Minute
		}
	}
	if cfg.reps == 0 {
		cfg.reps = 5
		if cfg.quick {
			cfg.reps = 3
		}
	}

	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(stderr, "zcbench:", err)
		return 1
	}
	procs := &harness.Procs{}
	env := &harness.Env{Exe: exe, ServerHost: "127.0.0.1", Procs: procs}
	env.Client.CPU, env.Server.CPU = harness.PickCPUs()
	if !cfg.pin {
		env.Client.CPU, env.Server.CPU = -1, -1
	}

	// Every exit path ends the children (by PID) and removes the namespaces.
	var pair *netns.Pair
	var cleanOnce sync.Once
	cleanup := func() {
		cleanOnce.Do(func() {
			procs.KillAll()
			if err := pair.Close(); err != nil {
				fmt.Fprintln(stderr, "zcbench: cleanup:", err)
			}
		})
	}
	defer cleanup()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case s := <-sigs:
			fmt.Fprintf(stderr, "\nzcbench: %v: stopping, cleaning up\n", s)
			cleanup()
			os.Exit(130)
		case <-finished:
		}
	}()

	topology := "loopback"
	if cfg.useNetns {
		pair, err = netns.Create()
		if err != nil {
			fmt.Fprintln(stderr, "zcbench:", err)
			return 1
		}
		env.ServerHost = netns.ServerIP
		env.Server.NetNS, env.Client.NetNS = pair.ServerNS, pair.ClientNS
		topology = fmt.Sprintf("veth %d queues between namespaces %s and %s", pair.Queues, pair.Server, pair.Client)
	}

	if cfg.profileDir != "" {
		if err := os.MkdirAll(cfg.profileDir, 0o755); err != nil {
			fmt.Fprintln(stderr, "zcbench:", err)
			return 1
		}
		if cfg.profileDir, err = filepath.Abs(cfg.profileDir); err != nil {
			fmt.Fprintln(stderr, "zcbench:", err)
			return 1
		}
	}
	variants, notes, err := plan(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "zcbench:", err)
		return 2
	}
	nIperf := 0
	for _, v := range variants {
		if v.Mode == iperf.Name {
			nIperf++
		}
	}
	if cfg.dur == 0 {
		cfg.dur = perRun(cfg.budget, (len(variants)-nIperf)*cfg.reps, nIperf*cfg.reps)
	}
	runs := harness.Interleave(variants, cfg.reps)

	title := describe(topology)
	fmt.Fprintf(stdout, "zcbench: %s\n", title)
	placement := "client and server not pinned"
	if env.Client.CPU >= 0 {
		placement = fmt.Sprintf("client on CPU %d, server on CPU %d", env.Client.CPU, env.Server.CPU)
	}
	fmt.Fprintf(stdout, "%d variants × %d repetitions, interleaved; %v of traffic per repetition (iperf3: %d s); %s\n",
		len(variants), cfg.reps, cfg.dur, iperf.Seconds(cfg.dur), placement)
	for _, n := range notes {
		fmt.Fprintln(stdout, n)
	}

	// A live bar on a terminal; in a log, a plain line every tenth of the run.
	barOut, tty := stderr, false
	if f, ok := stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		tty = true
	} else {
		barOut = io.Discard
	}
	started := time.Now()
	bar := progressbar.NewOptions(len(runs),
		progressbar.OptionSetWriter(barOut),
		progressbar.OptionSetDescription("starting"),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
	)
	rows := make([]report.Row, len(variants))
	for i, v := range variants {
		rows[i].Variant = v
	}
	ctx := context.Background()
	var failures []string
	for _, r := range runs {
		bar.Describe(fmt.Sprintf("%-8s %-8s %-7s ×%-2d rep %d/%d", r.Scenario, r.Mode, report.SizeString(r.Size), r.Conns, r.Rep+1, cfg.reps))
		rep, err := runOne(ctx, env, cfg, r.Variant)
		if errors.Is(err, frame.ErrCorrupt) {
			// A fast wrong answer: nothing of this run can be trusted.
			bar.Exit()
			fmt.Fprintln(stderr)
			fmt.Fprintln(stderr, "zcbench: FAILED: wrong bytes:", err)
			return 3
		}
		if err != nil {
			// Any other failure loses this repetition only; the run fails at the end.
			failures = append(failures, fmt.Sprintf("%s %s %s ×%d rep %d: %v",
				r.Scenario, r.Mode, report.SizeString(r.Size), r.Conns, r.Rep+1, err))
		} else {
			rows[r.Index].Reps = append(rows[r.Index].Reps, rep)
		}
		bar.Add(1)
		if done := len(failures) + countReps(rows); !tty && (done*10/len(runs) != (done-1)*10/len(runs) || done == len(runs)) {
			fmt.Fprintf(stderr, "zcbench: %d/%d repetitions done (%v)\n", done, len(runs), time.Since(started).Round(time.Second))
		}
	}
	bar.Finish()
	fmt.Fprintln(stdout)
	report.Table(stdout, rows)
	report.PrintGoals(stdout, report.Goals(rows))
	fmt.Fprintln(stdout, "Ratios are of medians (mode/net). Latency is the round trip. Every payload byte was CRC-32C checked (iperf3 excepted).")

	status := 0
	if cfg.jsonPath != "" {
		if err := report.WriteJSON(cfg.jsonPath, rows); err != nil {
			fmt.Fprintln(stderr, "zcbench: -json:", err)
			status = 1
		} else {
			fmt.Fprintln(stdout, "wrote", cfg.jsonPath)
		}
	}
	if cfg.pngPath != "" {
		if err := report.WritePNG(cfg.pngPath, rows, title); err != nil {
			fmt.Fprintln(stderr, "zcbench: -png:", err)
			status = 1
		} else {
			fmt.Fprintln(stdout, "wrote", cfg.pngPath)
		}
	}
	if len(failures) > 0 {
		fmt.Fprintf(stderr, "zcbench: FAILED: %d of %d repetitions did not complete:\n", len(failures), len(runs))
		for _, f := range failures {
			fmt.Fprintln(stderr, "  "+f)
		}
		status = 1
	}
	return status
}

func countReps(rows []report.Row) int {
	n := 0
	for _, r := range rows {
		n += len(r.Reps)
	}
	return n
}

func runOne(ctx context.Context, env *harness.Env, cfg config, v harness.Variant) (harness.Rep, error) {
	if v.Mode == iperf.Name {
		return iperf.Run(ctx, env, v.Size, cfg.dur)
	}
	c := harness.Case{
		Scenario: v.Scenario, Mode: v.Mode, Size: v.Size, Conns: v.Conns,
		RecvBuf: recvBuf(v.Size), Duration: cfg.dur, CorruptSeq: cfg.corruptSeq, ProfileDir: cfg.profileDir,
	}
	return harness.RunPair(ctx, env, c)
}

// recvBuf is the read size of stream receivers, the same in every mode: the write
// size, but at least 64 KiB (a receiver's best simple choice).
func recvBuf(size int) int { return max(size, 64<<10) }

func allModeNames() []string {
	var ns []string
	for _, m := range modes.All() {
		ns = append(ns, m.Name())
	}
	return append(ns, iperf.Name)
}

// plan lists the variants of the run and notes about modes left out.
func plan(cfg config) ([]harness.Variant, []string, error) {
	var notes []string
	wantMode := func(string) bool { return true }
	if cfg.modes != "" {
		list := strings.Split(cfg.modes, ",")
		for _, m := range list {
			if !slices.Contains(allModeNames(), m) {
				return nil, nil, fmt.Errorf("unknown mode %q (known: %s)", m, strings.Join(allModeNames(), ","))
			}
		}
		wantMode = func(m string) bool { return slices.Contains(list, m) }
	}
	scens := harness.Scenarios
	if cfg.scenarios != "" {
		scens = nil
		for _, s := range strings.Split(cfg.scenarios, ",") {
			if !slices.Contains(harness.Scenarios, harness.Scenario(s)) {
				return nil, nil, fmt.Errorf("unknown scenario %q", s)
			}
			scens = append(scens, harness.Scenario(s))
		}
	}
	var ms []harness.Mode
	for _, m := range modes.All() {
		if !wantMode(m.Name()) {
			continue
		}
		if err := m.Available(); err != nil {
			notes = append(notes, fmt.Sprintf("mode %s: not available: %v", m.Name(), err))
			continue
		}
		ms = append(ms, m)
	}
	haveZC := slices.ContainsFunc(modes.All(), func(m harness.Mode) bool { return strings.HasPrefix(m.Name(), "zc") })
	if !haveZC {
		notes = append(notes, "modes zc, zc-copy, zc-sendzc, zc-mmap: not available (package zc has no adapter in bench/internal/modes yet)")
	}
	useIperf := wantMode(iperf.Name) && slices.Contains(scens, harness.Bulk)
	if useIperf {
		if err := iperf.Available(); err != nil {
			notes = append(notes, "mode iperf3: not available: "+err.Error())
			useIperf = false
		}
	}
	var vs []harness.Variant
	add := func(s harness.Scenario, size, conns int) {
		for _, m := range ms {
			if harness.Supports(m, s) {
				vs = append(vs, harness.Variant{Scenario: s, Mode: m.Name(), Size: size, Conns: conns})
			}
		}
		if s == harness.Bulk && useIperf {
			vs = append(vs, harness.Variant{Scenario: s, Mode: iperf.Name, Size: size, Conns: conns})
		}
	}
	for _, s := range scens {
		switch s {
		case harness.Bulk:
			for _, size := range []int{4 << 10, 64 << 10, 1 << 20} {
				add(s, size, 1)
			}
		case harness.Echo:
			add(s, 64, 64)
			add(s, 1<<10, 64)
		case harness.PingPong:
			add(s, 64, 1)
		case harness.Stream:
			add(s, 64, 1)
		}
	}
	if len(vs) == 0 {
		return nil, notes, errors.New("nothing to run")
	}
	return vs, notes, nil
}

// perRun spreads the budget over the runs: each of ours costs its traffic time plus
// about 0.06 s (two processes, connections, checks); iperf3 runs whole seconds plus
// about 0.2 s.
func perRun(budget time.Duration, ours, iperfs int) time.Duration {
	const ourCost, iperfCost = 60 * time.Millisecond, 200 * time.Millisecond
	if ours == 0 {
		return time.Second
	}
	d := (budget - time.Duration(iperfs)*(time.Second+iperfCost)) / time.Duration(ours)
	d -= ourCost
	if d >= time.Second { // iperf3 runs as long as ours: share evenly
		d = budget/time.Duration(ours+iperfs) - ourCost
	}
	return min(max(d, 200*time.Millisecond), 10*time.Second).Round(10 * time.Millisecond)
}

func describe(topology string) string {
	var u unix.Utsname
	_ = unix.Uname(&u)
	return fmt.Sprintf("Linux %s, %d CPUs, %s, %s, %s UTC",
		unix.ByteSliceToString(u.Release[:]), runtime.NumCPU(), runtime.Version(), topology,
		time.Now().UTC().Format("2006-01-02 15:04"))
}
