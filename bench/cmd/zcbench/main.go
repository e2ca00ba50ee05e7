// Command zcbench measures zcnet against plain sockets on this machine: bulk
// throughput and CPU per GB, echo and small-message rates, ping-pong latency, and the
// services suite (a relay, a pub/sub fan-out, file streaming, a key-value store,
// multi-queue echo on shared CPUs, HTTP under wrk: server CPU per unit of work). Every
// case runs as a server and a client child process of zcbench (pinned to different
// CPUs when there are two), variants interleave A B C C B A (odd rounds run backwards), each figure is a median
// with min–max over the repetitions, and every payload byte is checked.
//
// Usage:
//
//	zcbench [-quick] [-json FILE] [-png FILE] [-netns] [-modes net,syscall,...] [-scenarios bulk,services,...]
//
// `make bench` runs it with its defaults (about 8 minutes, 3–4 of them the services);
// -quick takes about 2 minutes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
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
	"github.com/zcnet/zcnet/bench/internal/services"
)

func main() {
	if harness.IsChild(os.Args) {
		os.Exit(harness.ChildMain(os.Args[1:], allModes(), os.Stdout, os.Stderr))
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
	mcQueues   int
	mcConns    string
	bulkSizes  string
	idleConns  int
	fileSize   int64
	fileDir    string
	// the services suite (issue 20)
	services   bool
	svcDur     time.Duration
	relayBytes int64
	filesTotal int64
	bigReps    int
}

// run is zcbench with its arguments; it returns the exit status: 0 done, 1 error,
// 2 bad usage, 3 wrong bytes (the payload check failed).
func run(args []string, stdout, stderr io.Writer) int {
	var cfg config
	fs := flag.NewFlagSet("zcbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&cfg.quick, "quick", false, "short run: about 60 s, 3 repetitions")
	fs.DurationVar(&cfg.budget, "budget", 0, "target total run time (default 4m, or 60s with -quick)")
	fs.IntVar(&cfg.reps, "reps", 0, "repetitions of every variant (default 5, or 3 with -quick)")
	fs.DurationVar(&cfg.dur, "d", 0, "traffic time of one repetition (default: derived from -budget)")
	fs.StringVar(&cfg.modes, "modes", "", "comma-separated modes to run (default: all available: "+strings.Join(allModeNames(), ",")+")")
	fs.StringVar(&cfg.scenarios, "scenarios", "", "comma-separated scenarios (default: all: "+strings.Join(scenarioNames(), ",")+"); services: the whole services suite")
	fs.IntVar(&cfg.mcQueues, "mc-queues", 4, "multicore: server queues, one CPU each (at most half the CPUs; the load runs on the others)")
	fs.StringVar(&cfg.mcConns, "mc-conns", "512,4096", "multicore: comma-separated connection counts")
	fs.StringVar(&cfg.bulkSizes, "bulk-sizes", "4096,65536,1048576", "bulk: comma-separated write sizes in bytes (4096 to 16 MiB)")
	fs.IntVar(&cfg.idleConns, "idle-conns", 10000, "idle: connections held open (RLIMIT_NOFILE is raised for them when it can be)")
	fs.Int64Var(&cfg.fileSize, "file-size", 0, "filesend: file size in bytes (default 1 GiB, 256 MiB with -quick)")
	fs.StringVar(&cfg.fileDir, "file-dir", "", "filesend: where the frame file is made (default /dev/shm, else the temp dir)")
	fs.BoolVar(&cfg.services, "services", true, "run the services suite (relay, relay-hc, fanout, files, kv, mq, wrk, and the TLS scenarios https, files-tls, relay-tls) with the other scenarios; -scenarios services picks it alone")
	fs.DurationVar(&cfg.svcDur, "svc-d", 0, "services: traffic time of one repetition of fanout, kv and mq (default 500ms, 300ms with -quick; wrk runs whole seconds)")
	fs.Int64Var(&cfg.relayBytes, "relay-bytes", 0, "relay: bytes each connection carries each way (default 64 MiB, 4 MiB with -quick)")
	fs.Int64Var(&cfg.filesTotal, "files-total", 0, "files: bytes all clients of one repetition receive together (default half the -file-size)")
	fs.IntVar(&cfg.bigReps, "big-reps", 3, "services: repetitions of the largest cases (relay ×64) when -reps is higher")
	fs.StringVar(&cfg.jsonPath, "json", "", "write results as JSON to `FILE`")
	fs.StringVar(&cfg.pngPath, "png", "", "write plots as PNG to `FILE`")
	fs.BoolVar(&cfg.useNetns, "netns", false, "run across two network namespaces joined by a multi-queue veth pair (root)")
	fs.Int64Var(&cfg.corruptSeq, "selftest-corrupt", -1, "damage one payload byte of frame `N` of every client connection, under a correct CRC field: the run must fail with wrong bytes (checks that receivers hash the payload)")
	fs.BoolVar(&cfg.pin, "pin", true, "pin client and server to different CPUs (when there are two)")
	fs.StringVar(&cfg.profileDir, "cpuprofile", "", "write a CPU profile (and an allocation profile, -allocs.pprof) of every server and client child into `DIR` (pprof)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "zcbench: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if cfg.budget == 0 {
		cfg.budget = 4 * time.Minute
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
	if cfg.fileSize == 0 {
		cfg.fileSize = 1 << 30
		if cfg.quick {
			cfg.fileSize = 256 << 20
		}
	}
	if cfg.svcDur == 0 {
		cfg.svcDur = 500 * time.Millisecond
		if cfg.quick {
			cfg.svcDur = 300 * time.Millisecond
		}
	}
	if cfg.relayBytes == 0 {
		cfg.relayBytes = 64 << 20
		if cfg.quick {
			cfg.relayBytes = 4 << 20
		}
	}
	if cfg.filesTotal == 0 {
		cfg.filesTotal = cfg.fileSize / 2
	}
	if cfg.fileDir == "" {
		cfg.fileDir = os.TempDir()
		if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() && unix.Access("/dev/shm", unix.W_OK) == nil {
			cfg.fileDir = "/dev/shm"
		}
	}

	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(stderr, "zcbench:", err)
		return 1
	}
	procs := &harness.Procs{}
	env := &harness.Env{Exe: exe, ServerHost: "127.0.0.1", Procs: procs}
	if cli, srv := harness.PickCPUs(); cfg.pin && cli >= 0 {
		env.Client.CPUs, env.Server.CPUs = []int{cli}, []int{srv}
	}
	files := &frameFiles{dir: cfg.fileDir, size: cfg.fileSize, corrupt: cfg.corruptSeq}

	// Every exit path ends the children (by PID) and removes the namespaces.
	var pair *netns.Pair
	var cleanOnce sync.Once
	cleanup := func() {
		cleanOnce.Do(func() {
			procs.KillAll()
			files.removeAll()
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
	// The multi-core scenario: server and load on disjoint CPU sets.
	mcEnv := *env
	mcServer, mcLoad, mcErr := harness.SplitCPUs(harness.AllowedCPUs(), cfg.mcQueues)
	mcEnv.Server.CPUs, mcEnv.Client.CPUs = mcServer, mcLoad
	skipped := map[harness.Scenario]string{}
	if mcErr != nil && wantScenario(cfg, harness.MultiCore) {
		skipped[harness.MultiCore] = mcErr.Error()
	}
	for _, s := range []harness.Scenario{harness.HTTPWrk, harness.HTTPSWrk} {
		if err := harness.WrkAvailable(); err != nil && wantScenario(cfg, s) {
			skipped[s] = err.Error()
		}
	}
	if cfg.useNetns {
		for _, s := range []harness.Scenario{harness.Relay, harness.RelayHalfClose, harness.RelayTLS} {
			if wantScenario(cfg, s) {
				skipped[s] = "the relay's backend runs in the client's namespace: loopback only"
			}
		}
	}
	// Multi-queue on shared CPUs: server and load generator on every allowed CPU.
	mqEnv := *env
	mqEnv.Server.CPUs, mqEnv.Client.CPUs = nil, nil
	mqQueues := min(2, max(1, len(harness.AllowedCPUs())))
	variants, notes, err := plan(cfg, skipped)
	if err != nil {
		fmt.Fprintln(stderr, "zcbench:", err)
		return 2
	}
	variants, note := fdLimit(variants)
	if note != "" {
		notes = append(notes, note)
	}
	if cfg.dur == 0 {
		timed, fixed := 0, time.Duration(0)
		for _, v := range variants {
			if v.Scenario.Service() {
				continue // the services have their own traffic time (-svc-d) and sizes
			}
			if c, ok := fixedCost(cfg, v); ok {
				fixed += c
			} else {
				timed++
			}
		}
		cfg.dur = perRun(cfg.budget, timed*cfg.reps, fixed*time.Duration(cfg.reps))
	}
	runs := harness.Interleave(variants, cfg.reps, func(v harness.Variant) bool {
		return v.Mode == report.ZCCopyAA || v.Mode == report.NetAA || v.Mode == report.NetTLSAA
	})
	// The largest services cases run fewer repetitions.
	runs = slices.DeleteFunc(runs, func(r harness.Run) bool { return bigCase(r.Variant) && r.Rep >= cfg.bigReps })

	title := describe(topology)
	fmt.Fprintf(stdout, "zcbench: %s\n", title)
	placement := "client and server not pinned"
	if len(env.Client.CPUs) > 0 {
		placement = fmt.Sprintf("client on CPU %v, server on CPU %v", env.Client.CPUs, env.Server.CPUs)
	}
	fmt.Fprintf(stdout, "%d variants × %d repetitions, interleaved; %v of traffic per repetition (iperf3: %d s); %s\n",
		len(variants), cfg.reps, cfg.dur, iperf.Seconds(cfg.dur), placement)
	if mcErr == nil && slices.ContainsFunc(variants, func(v harness.Variant) bool { return v.Scenario == harness.MultiCore }) {
		fmt.Fprintf(stdout, "multicore: server on CPUs %v, load generator on CPUs %v\n", mcServer, mcLoad)
	}
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
		renv := env
		switch r.Scenario {
		case harness.MultiCore:
			renv = &mcEnv
		case harness.MultiQueue:
			renv = &mqEnv
		}
		rep, err := runOne(ctx, renv, cfg, r.Variant, files, mqQueues)
		rep.Round = r.Rep
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
	goals := report.Goals(rows, skipped)
	report.PrintGoals(stdout, goals)
	if slices.ContainsFunc(variants, func(v harness.Variant) bool { return v.Scenario.Service() }) || cfg.services {
		sg := report.ServiceGoals(rows, skipped)
		report.PrintServiceGoals(stdout, sg)
		goals = append(goals, sg...)
	}
	if slices.ContainsFunc(variants, func(v harness.Variant) bool { return slices.Contains(harness.TLSScenarios, v.Scenario) }) {
		tg := report.TLSGoals(rows, skipped, services.KernelTLSAvailable())
		report.PrintTLSGoals(stdout, tg)
		goals = append(goals, tg...)
	}
	lg := report.LimitGoals(rows, skipped)
	report.PrintLimitGoals(stdout, lg)
	goals = append(goals, lg...)
	report.PrintNoise(stdout, rows)
	fmt.Fprintln(stdout, "Ratios are of medians (mode/net unless named). Latency is the round trip. Every payload byte was CRC-32C checked (iperf3 excepted).")

	status := 0
	if cfg.jsonPath != "" {
		run := report.RunInfo{Title: title, Reps: cfg.reps, Duration: cfg.dur.String(), Placement: placement,
			Skipped: map[string]string{}, Notes: notes}
		for s, why := range skipped {
			run.Skipped[string(s)] = why
		}
		if mcErr == nil {
			run.MultiCoreServerCPUs, run.MultiCoreLoadCPUs = mcServer, mcLoad
		}
		if err := report.WriteJSON(cfg.jsonPath, run, rows, goals); err != nil {
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

func runOne(ctx context.Context, env *harness.Env, cfg config, v harness.Variant, files *frameFiles, mqQueues int) (harness.Rep, error) {
	if v.Mode == iperf.Name {
		return iperf.Run(ctx, env, v.Size, cfg.dur)
	}
	c := harness.Case{
		Scenario: v.Scenario, Mode: v.Mode, Size: v.Size, Conns: v.Conns,
		RecvBuf: recvBuf(v.Size), Duration: cfg.dur, CorruptSeq: cfg.corruptSeq, ProfileDir: cfg.profileDir,
	}
	if v.Scenario.Service() {
		c.Duration = cfg.svcDur
	}
	// Size-bound cases may take as long as their bytes need at 50 MB/s, plus the usual.
	bound := func(bytes int64) time.Duration { return time.Duration(bytes/50e6)*time.Second + 30*time.Second }
	switch v.Scenario {
	case harness.MultiQueue:
		// the multi-core echo, with its server's queues and the load on the same CPUs
		c.Scenario, c.Queues = harness.MultiCore, mqQueues
	case harness.Relay, harness.RelayHalfClose, harness.RelayTLS:
		c.Total = cfg.relayBytes
		c.Limit = bound(2 * cfg.relayBytes * int64(v.Conns))
		port, err := freePort(env.ServerHost)
		if err != nil {
			return harness.Rep{}, fmt.Errorf("backend port: %w", err)
		}
		c.Backend = net.JoinHostPort(env.ServerHost, port)
	case harness.FileStream, harness.FilesTLS:
		f, err := files.get(v.Size)
		if err != nil {
			return harness.Rep{}, fmt.Errorf("frame file: %w", err)
		}
		c.File, c.Total = f, cfg.filesTotal
		c.Limit = bound(cfg.filesTotal)
	case harness.MultiCore:
		c.Queues = len(env.Server.CPUs)
	case harness.FileSend:
		f, err := files.get(v.Size)
		if err != nil {
			return harness.Rep{}, fmt.Errorf("frame file: %w", err)
		}
		c.File = f
	}
	return harness.RunPair(ctx, env, c)
}

// freePort picks a free TCP port on host for a relay's backend (the client process
// listens there, the relay dials it).
func freePort(host string) (string, error) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	l, err := lc.Listen(context.Background(), "tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", err
	}
	defer l.Close()
	_, port, err := net.SplitHostPort(l.Addr().String())
	return port, err
}

// bigCase reports whether v is one of the largest services cases, which run at most
// -big-reps repetitions.
func bigCase(v harness.Variant) bool {
	return v.Scenario == harness.Relay && v.Conns >= 64
}

// allModes is every mode a child may be asked to run: the scenarios' modes, then the
// services' own (harness.Supports tells them apart).
func allModes() []harness.Mode {
	return append(append(modes.All(), services.Modes()...), services.TLSModes()...)
}

// frameFiles makes the FileSend files (one per frame size, on first use) and removes
// them at the end.
type frameFiles struct {
	dir     string
	size    int64
	corrupt int64
	mu      sync.Mutex
	paths   map[int]string
}

func (f *frameFiles) get(frameSize int) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := f.paths[frameSize]; ok {
		return p, nil
	}
	p, err := harness.MakeFrameFile(f.dir, frameSize, f.size, f.corrupt)
	if err != nil {
		return "", err
	}
	if f.paths == nil {
		f.paths = map[int]string{}
	}
	f.paths[frameSize] = p
	return p, nil
}

func (f *frameFiles) removeAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, p := range f.paths {
		os.Remove(p)
		delete(f.paths, k)
	}
}

// fdLimit makes room under RLIMIT_NOFILE for the connections of the idle and
// multi-core variants (every child inherits the limit; Go raises its soft limit to the
// hard one): it raises the hard limit when it can; otherwise it lowers the idle
// connection count to fit and drops the multi-core variants that do not, saying so.
func fdLimit(vs []harness.Variant) ([]harness.Variant, string) {
	need := 0
	for _, v := range vs {
		switch v.Scenario {
		case harness.Idle, harness.MultiCore:
			need = max(need, v.Conns*modeFDs(v.Mode))
		case harness.FanOut, harness.Relay, harness.MultiQueue, harness.HTTPWrk, harness.FileStream, harness.KV, harness.HTTPSWrk, harness.FilesTLS, harness.RelayTLS:
			// the services' clients hold their connections (the relay's client also the
			// backend's ends): counted, not shrunk
			need = max(need, 2*v.Conns+2)
		}
	}
	if need == 0 {
		return vs, ""
	}
	const spare = 256 // the child's own descriptors: listener, rings, epoll, pipes
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return vs, "cannot read RLIMIT_NOFILE: " + err.Error()
	}
	want := uint64(need + spare)
	if lim.Max >= want {
		if lim.Cur < want {
			lim.Cur = lim.Max
			_ = unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)
		}
		return vs, ""
	}
	old := lim.Max
	lim.Cur, lim.Max = want, want
	err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)
	if err == nil {
		return vs, fmt.Sprintf("raised RLIMIT_NOFILE from %d to %d for %d descriptors", old, want, need)
	}
	out, idleFit, dropped := shrinkToFit(vs, max(1, int(old)-spare), modeFDs)
	note := fmt.Sprintf("RLIMIT_NOFILE is %d and cannot be raised to %d (%v): idle runs with at most %d connections", old, want, err, idleFit)
	if len(dropped) > 0 {
		note += "; multicore variants left out: " + strings.Join(dropped, ", ")
	}
	return out, note
}

// modeFDs is how many descriptors the named mode's server holds per connection.
func modeFDs(mode string) int {
	for _, m := range modes.All() {
		if m.Name() == mode {
			return harness.FDsPerConn(m)
		}
	}
	return 1
}

// shrinkToFit fits the plan into fit descriptors: idle variants all get the connection
// count the hungriest mode fits (they are compared with each other), multi-core variants
// that do not fit are dropped (named in dropped).
func shrinkToFit(vs []harness.Variant, fit int, fds func(mode string) int) (out []harness.Variant, idleFit int, dropped []string) {
	for _, v := range vs {
		if v.Scenario == harness.Idle {
			if f := max(1, fit/fds(v.Mode)); idleFit == 0 || f < idleFit {
				idleFit = f
			}
		}
	}
	for _, v := range vs {
		switch {
		case v.Scenario == harness.Idle && v.Conns > idleFit:
			v.Conns = idleFit
		case v.Scenario == harness.MultiCore && v.Conns > max(1, fit/fds(v.Mode)):
			dropped = append(dropped, fmt.Sprintf("%s ×%d", v.Mode, v.Conns))
			continue
		}
		out = append(out, v)
	}
	return out, idleFit, dropped
}

// fixedCost is how long a run that does not follow the traffic time takes, roughly
// (false: it follows it).
func fixedCost(cfg config, v harness.Variant) (time.Duration, bool) {
	switch {
	case v.Mode == iperf.Name:
		return time.Duration(iperf.Seconds(cfg.dur))*time.Second + 200*time.Millisecond, true
	case v.Scenario == harness.FileSend:
		// about 0.8 GB/s end to end with the receiver's check on a loaded 2-CPU VM, plus
		// the processes
		return time.Duration(cfg.fileSize)*13/10 + 200*time.Millisecond, true
	case v.Scenario == harness.Idle:
		// connect and close, a little over 50 µs per connection, plus the settle time
		return time.Duration(v.Conns)*120*time.Microsecond + harness.IdleSettle + 300*time.Millisecond, true
	}
	return 0, false
}

// recvBuf is the read size of stream receivers, the same in every mode: the write
// size, but at least 64 KiB (a receiver's best simple choice).
func recvBuf(size int) int { return max(size, 64<<10) }

func allModeNames() []string {
	var ns []string
	for _, m := range allModes() {
		if !slices.Contains(ns, m.Name()) {
			ns = append(ns, m.Name())
		}
	}
	return append(ns, iperf.Name)
}

// wantScenario reports whether -scenarios asks for s (no -scenarios: all, the services
// unless -services=false; "services" names the whole suite).
func wantScenario(cfg config, s harness.Scenario) bool {
	if cfg.scenarios == "" {
		return !s.Service() || cfg.services
	}
	list := strings.Split(cfg.scenarios, ",")
	return slices.Contains(list, string(s)) || (s.Service() && slices.Contains(list, "services"))
}

// serviceModes are the modes each services scenario compares (of those that support it).
var serviceModes = map[harness.Scenario][]string{
	harness.MultiQueue: {"net", "netpoll", "zc", report.CUring, report.CEpoll},
	harness.HTTPWrk:    {"net", "zc-net"},
}

func scenarioNames() []string {
	var ns []string
	for _, s := range harness.Scenarios {
		ns = append(ns, string(s))
	}
	return ns
}

// plan lists the variants of the run and notes about modes and scenarios left out
// (skipped: scenarios this machine cannot run, and why).
func plan(cfg config, skipped map[harness.Scenario]string) ([]harness.Variant, []string, error) {
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
	var scens []harness.Scenario
	if cfg.scenarios != "" {
		for _, s := range strings.Split(cfg.scenarios, ",") {
			if s != "services" && !slices.Contains(harness.Scenarios, harness.Scenario(s)) {
				return nil, nil, fmt.Errorf("unknown scenario %q", s)
			}
		}
	}
	for _, s := range harness.Scenarios {
		if wantScenario(cfg, s) {
			scens = append(scens, s)
		}
	}
	var ms []harness.Mode
	unavailable := map[string]bool{}
	for _, m := range allModes() {
		if !wantMode(m.Name()) {
			continue
		}
		if err := m.Available(); err != nil {
			if !unavailable[m.Name()] {
				msg := fmt.Sprintf("mode %s: not available: %v", m.Name(), err)
				if strings.HasPrefix(err.Error(), "not available") { // ztls: "not available here: kernel TLS ..."
					msg = fmt.Sprintf("mode %s: %v", m.Name(), err)
				}
				notes = append(notes, msg)
			}
			unavailable[m.Name()] = true
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
			// the scenario its servers run (mq: the multi-core echo)
			cs := s
			if s == harness.MultiQueue {
				cs = harness.MultiCore
			}
			if only, ok := serviceModes[s]; ok && !slices.Contains(only, m.Name()) {
				continue
			}
			if m.Name() == report.NetAA && !(s == harness.Relay && conns == 8 || s == harness.KV && size == 64) {
				continue // the services' A/A pair: relay ×8 and key-value small only
			}
			if m.Name() == report.NetTLSAA && !(s == harness.HTTPSWrk && size == 64 || s == harness.FilesTLS && conns == report.TLSFileConns[0]) {
				continue // the TLS A/A pair: https 64 B and files-tls with one client
			}
			if harness.Supports(m, cs) {
				vs = append(vs, harness.Variant{Scenario: s, Mode: m.Name(), Size: size, Conns: conns})
			}
		}
		if s == harness.Bulk && useIperf {
			vs = append(vs, harness.Variant{Scenario: s, Mode: iperf.Name, Size: size, Conns: conns})
		}
	}
	for _, s := range scens {
		if why, ok := skipped[s]; ok {
			notes = append(notes, fmt.Sprintf("scenario %s: not run: %s", s, why))
			continue
		}
		switch s {
		case harness.Bulk:
			for _, f := range strings.Split(cfg.bulkSizes, ",") {
				n, err := strconv.Atoi(strings.TrimSpace(f))
				if err != nil || n < 4096 || n > 16<<20 {
					return nil, nil, fmt.Errorf("-bulk-sizes: bad size %q (4096 to %d bytes)", f, 16<<20)
				}
				add(s, n, 1)
			}
		case harness.Echo:
			add(s, 64, 64)
			add(s, 1<<10, 64)
		case harness.PingPong:
			add(s, 64, 1)
		case harness.Stream:
			add(s, 64, 1)
		case harness.MultiCore:
			for _, f := range strings.Split(cfg.mcConns, ",") {
				n, err := strconv.Atoi(strings.TrimSpace(f))
				if err != nil || n < 1 {
					return nil, nil, fmt.Errorf("-mc-conns: bad count %q", f)
				}
				add(s, 64, n)
			}
		case harness.HTTP:
			add(s, 64, 32)
		case harness.FileSend:
			add(s, 64<<10, 1)
		case harness.Idle:
			if cfg.idleConns < 1 {
				return nil, nil, fmt.Errorf("-idle-conns %d < 1", cfg.idleConns)
			}
			add(s, 64, cfg.idleConns)
		case harness.Relay:
			for _, n := range report.RelayConns {
				add(s, report.ServiceFrame, n)
			}
		case harness.RelayHalfClose:
			add(s, report.ServiceFrame, 8)
		case harness.FanOut:
			for _, n := range report.FanOutConns {
				for _, size := range report.FanOutSizes {
					add(s, size, n)
				}
			}
		case harness.FileStream:
			for _, n := range report.FileConns {
				add(s, report.ServiceFrame, n)
			}
		case harness.KV:
			for _, size := range report.KVSizes {
				add(s, size, report.KVConns)
			}
		case harness.MultiQueue:
			add(s, 64, report.MQConns)
		case harness.HTTPWrk:
			for _, wc := range report.WrkCases() {
				add(s, wc.Size, wc.Conns)
			}
		case harness.HTTPSWrk:
			for _, size := range report.WrkSizes {
				add(s, size, report.HTTPSConns)
			}
		case harness.FilesTLS:
			for _, n := range report.TLSFileConns {
				add(s, report.ServiceFrame, n)
			}
		case harness.RelayTLS:
			add(s, report.ServiceFrame, report.TLSRelayConns)
		}
	}
	if len(vs) == 0 {
		return nil, notes, errors.New("nothing to run")
	}
	return vs, notes, nil
}

// perRun spreads the budget over the runs: each timed run costs its traffic time plus
// about 0.12 s (two processes, engines, connections, the drain after the client
// stops); fixed is what the other runs (iperf3's whole seconds, file sends, idle
// connections) take in all.
func perRun(budget time.Duration, timed int, fixed time.Duration) time.Duration {
	const ourCost = 120 * time.Millisecond
	if timed == 0 {
		return time.Second
	}
	d := (budget-fixed)/time.Duration(timed) - ourCost
	return min(max(d, 200*time.Millisecond), 10*time.Second).Round(10 * time.Millisecond)
}

func describe(topology string) string {
	var u unix.Utsname
	_ = unix.Uname(&u)
	load := ""
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			load = ", load average " + f[0] + " at the start"
		}
	}
	return fmt.Sprintf("Linux %s, %d CPUs, %s, %s, %s UTC%s",
		unix.ByteSliceToString(u.Release[:]), runtime.NumCPU(), runtime.Version(), topology,
		time.Now().UTC().Format("2006-01-02 15:04"), load)
}
