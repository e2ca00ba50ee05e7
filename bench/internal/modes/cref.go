package modes

import (
	"context"
	"fmt"
	"os"

	"github.com/zcnet/zcnet/bench/internal/cref"
	"github.com/zcnet/zcnet/bench/internal/harness"
)

// CRef is a C reference server (bench/internal/cref): "c-uring", an io_uring echo server
// written against the raw system calls the way a careful liburing server is, and
// "c-epoll", a plain epoll echo server. They show what a request costs a server written
// in C against the kernel directly: the limit zc's server CPU per request is read
// against (issue 30's goal: ≤ 1.05× c-uring's).
//
// The server is a child process of the server side's zcbench process (so it runs where
// that one was placed: its CPU mask and network namespace are inherited), accepts
// Case.Conns connections, checks every received byte with the frame checks of package
// frame and echoes it. Its own window (first byte to last close) and CPU (getrusage of
// the C process) are the side's figures (Meter.SetExternal). MultiCore: Case.Queues
// threads, each pinned to one CPU of the server's mask. The client checks every echoed
// byte: in Echo and PingPong it is zc's own echo client where zc runs (the client of the
// zc rows, so that the goal compares the two servers under the same load), Go net's
// otherwise; MultiCore and mq use the harness's load generator, as every mode does.
type CRef struct{ Kind cref.Kind }

// Name implements harness.Mode.
func (m CRef) Name() string { return "c-" + string(m.Kind) }

// Supports implements harness.ScenarioSupporter: the request/response echo scenarios.
func (CRef) Supports(s harness.Scenario) bool {
	return s == harness.Echo || s == harness.PingPong || s == harness.MultiCore
}

// Available implements harness.Mode: the server compiles (gcc, the kernel's headers).
func (m CRef) Available() error {
	_, err := cref.Build(m.Kind)
	return err
}

// Server implements harness.Mode.
func (m CRef) Server(ctx context.Context, c harness.Case, meter *harness.Meter, ready func(string)) error {
	threads := max(c.Queues, 1)
	res, err := cref.Serve(ctx, m.Kind, cref.Config{Addr: c.Addr, Conns: c.Conns, Size: c.Size, Threads: threads}, ready, os.Stderr)
	if err != nil {
		return err
	}
	meter.SetExternal(harness.External{Wall: res.Wall, User: res.User, Sys: res.Sys, Frames: res.Frames, Bytes: res.Bytes})
	meter.Note("c-server", res.Setup)
	if res.Threads > 1 {
		meter.Note("steering", fmt.Sprintf("round-robin over %d pinned threads", res.Threads))
	}
	if res.Resets > 0 {
		return fmt.Errorf("%s: %d of %d connections ended in an error (reset or broken pipe)", m.Name(), res.Resets, c.Conns)
	}
	return nil
}

// Client implements harness.Mode: zc's echo client where zc runs, else Go net's; the
// client side's notes say which ("echo-client").
func (CRef) Client(ctx context.Context, c harness.Case, m *harness.Meter) error {
	cl := echoClientMode()
	m.Note("echo-client", cl.Name())
	return cl.Client(ctx, c, m)
}

// echoClientMode is the mode whose client drives the C servers: "zc" when this build has it
// and the machine runs it, else net.
func echoClientMode() harness.Mode {
	for _, x := range registered {
		if x.Name() == "zc" && x.Available() == nil {
			return x
		}
	}
	return Net{}
}

func init() {
	registered = append(registered, CRef{Kind: cref.Uring}, CRef{Kind: cref.Epoll})
}
