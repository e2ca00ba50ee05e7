package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/bench/internal/frame"
)

// The hidden command line of a child process: zcbench -zcbench-role=server
// -zcbench-case='{json}'. Children write "READY host:port" (server) and
// "RESULT {json}" lines to stdout; errors go to stderr.
const (
	roleFlag = "zcbench-role"
	caseFlag = "zcbench-case"

	exitCorrupt = 3 // the payload check failed
	exitTimeout = 4 // the child's own watchdog fired

	// Idle: the server writes idleLine once it has sampled its memory; the parent then
	// writes releaseLine to the client's stdin, and the client closes its connections.
	idleLine    = "IDLE-SAMPLED"
	releaseLine = "RELEASE"
)

// IsChild reports whether args (os.Args) start a child role.
func IsChild(args []string) bool {
	return len(args) > 1 && strings.HasPrefix(args[1], "-"+roleFlag)
}

func childArgs(role string, c Case) []string {
	b, _ := json.Marshal(c)
	return []string{"-" + roleFlag + "=" + role, "-" + caseFlag + "=" + string(b)}
}

// ChildMain runs one side of a case in this process, with the mode named in the case
// taken from modes, and returns the process exit code.
func ChildMain(args []string, modes []Mode, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("zcbench child", flag.ContinueOnError)
	fs.SetOutput(stderr)
	role := fs.String(roleFlag, "", "server or client")
	cjson := fs.String(caseFlag, "", "case as JSON")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var c Case
	if err := json.Unmarshal([]byte(*cjson), &c); err != nil {
		fmt.Fprintf(stderr, "zcbench %s: bad case: %v\n", *role, err)
		return 2
	}
	if err := c.Validate(); err != nil {
		fmt.Fprintf(stderr, "zcbench %s: %v\n", *role, err)
		return 2
	}
	var m Mode
	for _, x := range modes {
		if x.Name() == c.Mode && Supports(x, c.Scenario) {
			m = x
			break
		}
	}
	if m == nil {
		fmt.Fprintf(stderr, "zcbench %s: unknown mode %q\n", *role, c.Mode)
		return 2
	}
	// A child never outlives its case by much, whatever happens to its peer.
	wd := time.AfterFunc(c.Deadline()+30*time.Second, func() {
		fmt.Fprintf(stderr, "zcbench %s: watchdog: %s %s still running after %v\n", *role, c.Mode, c.Scenario, c.Deadline()+30*time.Second)
		os.Exit(exitTimeout)
	})
	defer wd.Stop()

	if c.ProfileDir != "" {
		name := filepath.Join(c.ProfileDir, fmt.Sprintf("%s-%s-%d-%s.pprof", c.Mode, c.Scenario, c.Size, *role))
		f, err := os.Create(name)
		if err != nil {
			fmt.Fprintf(stderr, "zcbench %s: %v\n", *role, err)
			return 1
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "zcbench %s: %v\n", *role, err)
			return 1
		}
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
			// and what the child allocated (alloc_space, alloc_objects), beside it
			if af, err := os.Create(strings.TrimSuffix(name, ".pprof") + "-allocs.pprof"); err == nil {
				pprof.Lookup("allocs").WriteTo(af, 0)
				af.Close()
			}
		}()
	}
	out := bufio.NewWriter(stdout)
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		outMu.Lock()
		fmt.Fprintf(out, format, args...)
		out.Flush()
		outMu.Unlock()
	}
	ctx := context.Background()
	var err error
	var meter *Meter
	switch *role {
	case "server":
		meter = newMeter(c, false)
		meter.onIdle = func() { say("%s\n", idleLine) }
		err = m.Server(ctx, c, meter, func(addr string) {
			if c.Scenario == Idle {
				meter.sampleBefore()
			}
			say("READY %s\n", addr)
		})
		if err == nil {
			err = meter.CheckErr()
		}
	case "client":
		meter = newMeter(c, true)
		switch c.Scenario {
		case MultiCore:
			err = loadClient(ctx, c, meter)
		case Idle:
			err = idleClient(ctx, c, meter, os.Stdin)
		case HTTP:
			err = httpClient(ctx, c, meter)
		case HTTPWrk, HTTPSWrk:
			err = wrkClient(ctx, c, meter)
		default:
			err = m.Client(ctx, c, meter)
		}
	default:
		fmt.Fprintf(stderr, "zcbench: unknown role %q\n", *role)
		return 2
	}
	side := meter.finish(*role)
	if err != nil {
		fmt.Fprintf(stderr, "zcbench %s %s/%s: %v\n", *role, c.Mode, c.Scenario, err)
		if errors.Is(err, frame.ErrCorrupt) {
			return exitCorrupt
		}
		return 1
	}
	side.GOMAXPROCS = runtime.GOMAXPROCS(0)
	var set unix.CPUSet
	if unix.SchedGetaffinity(0, &set) == nil {
		for i := 0; i < 1024; i++ {
			if set.IsSet(i) {
				side.CPUs = append(side.CPUs, i)
			}
		}
	}
	b, _ := json.Marshal(side)
	outMu.Lock()
	defer outMu.Unlock()
	fmt.Fprintf(out, "RESULT %s\n", b)
	if err := out.Flush(); err != nil {
		return 1
	}
	return 0
}
