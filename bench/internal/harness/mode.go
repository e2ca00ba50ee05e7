// Package harness runs one zcbench case as a pair of child processes (server and
// client), measures each side exactly, and defines the Mode interface that every
// way of moving bytes (Go net, raw syscalls, zc) implements.
//
// A Mode only writes the loops of its own API; the harness provides the frames to send
// (Meter.NewSource), checks every received byte (Meter.NewVerifier), keeps time and
// CPU (getrusage of the whole process over the measured window) and says when to stop
// (Meter.Stopped). The payload check makes a fast wrong answer fail the run.
package harness

import (
	"context"
	"fmt"
	"time"

	"github.com/zcnet/zcnet/bench/internal/frame"
)

// Scenario is what one case does on its connections.
type Scenario string

// The scenarios of zcbench.
const (
	// Bulk: one connection, the client sends frames of Case.Size bytes as fast as it
	// can; the server receives with reads of up to Case.RecvBuf bytes.
	Bulk Scenario = "bulk"
	// Stream: as Bulk, with small frames; counted in messages per second.
	Stream Scenario = "stream"
	// Echo: Case.Conns connections; on each the client sends one request of Case.Size
	// bytes, waits for the server to send the same bytes back, and repeats.
	Echo Scenario = "echo"
	// PingPong: Echo with one connection; the figure is the round-trip latency.
	PingPong Scenario = "pingpong"
)

// Scenarios lists all scenarios in report order.
var Scenarios = []Scenario{Bulk, Echo, PingPong, Stream}

// RequestResponse reports whether s is a request/response scenario (Echo, PingPong)
// rather than a one-way stream (Bulk, Stream).
func (s Scenario) RequestResponse() bool { return s == Echo || s == PingPong }

// Case is one run of one mode, as each side sees it.
type Case struct {
	Scenario Scenario `json:"scenario"`
	Mode     string   `json:"mode"`
	// Size is the bytes per write (Bulk, Stream) or per request and response (Echo,
	// PingPong); every write is one frame (package frame).
	Size int `json:"size"`
	// Conns is the number of connections.
	Conns int `json:"conns"`
	// RecvBuf is the most a stream receiver asks for per read (Bulk, Stream). Every
	// mode uses the same value.
	RecvBuf int `json:"recv_buf"`
	// Duration is how long the client drives traffic once it has started.
	Duration time.Duration `json:"duration"`
	// Addr is host:port: where the server listens (port 0: any) or where the client
	// dials.
	Addr string `json:"addr"`
	// CorruptSeq >= 0 makes the client send that frame of each connection with a
	// wrong checksum (checks the checker); -1 normally.
	CorruptSeq int64 `json:"corrupt_seq"`
	// ProfileDir, when set, makes each side write a CPU profile there
	// (<mode>-<scenario>-<size>-<role>.pprof; a later repetition overwrites).
	ProfileDir string `json:"profile_dir,omitempty"`
}

// Validate reports a Case that cannot run.
func (c Case) Validate() error {
	switch c.Scenario {
	case Bulk, Stream, Echo, PingPong:
	default:
		return fmt.Errorf("unknown scenario %q", c.Scenario)
	}
	if c.Size < frame.MinSize {
		return fmt.Errorf("size %d below the minimum frame of %d bytes", c.Size, frame.MinSize)
	}
	if c.Conns < 1 {
		return fmt.Errorf("conns %d < 1", c.Conns)
	}
	if !c.Scenario.RequestResponse() && c.Conns != 1 {
		return fmt.Errorf("%s runs on one connection, not %d", c.Scenario, c.Conns)
	}
	if c.RecvBuf < 1 {
		return fmt.Errorf("recv_buf %d < 1", c.RecvBuf)
	}
	if c.Duration <= 0 {
		return fmt.Errorf("duration %v <= 0", c.Duration)
	}
	return nil
}

// Mode is one way of moving bytes over TCP, benchmarked as a server/client pair. Each
// side runs in its own process; a Mode value is used for one side of one case.
//
// Rules every mode follows, so that the modes stay comparable:
//   - plain TCP sockets (IPPROTO_TCP, never MPTCP), TCP_NODELAY on, default socket
//     buffer sizes;
//   - the client sends only frames from Meter.NewSource (Fill a buffer once, Stamp it
//     before each send, call Source.Sent when the kernel has taken the whole frame);
//   - the server passes every received byte, in order, to its connection's
//     Meter.NewVerifier and returns the Verifier's error;
//   - Echo/PingPong servers send back exactly the bytes of each request;
//   - Bulk/Stream receivers read with buffers of Case.RecvBuf bytes;
//   - a side whose teardown is costly (closing an engine) calls Meter.Stop when its
//     traffic is over, so that the teardown is not measured.
type Mode interface {
	// Name is the mode's name on the command line and in results: "net", "zc-copy".
	Name() string
	// Available returns nil when the mode can run on this machine, or why not.
	Available() error
	// Server listens on c.Addr, calls ready once with the bound host:port, accepts
	// c.Conns connections and serves each as c.Scenario says until its peer closes;
	// it returns when all are done.
	//   Bulk/Stream: read into RecvBuf-sized buffers, Feed the verifier, until EOF;
	//   then Verifier.Close.
	//   Echo/PingPong: read a whole request of c.Size bytes, Feed it, send it back;
	//   until EOF at a request boundary.
	Server(ctx context.Context, c Case, m *Meter, ready func(addr string)) error
	// Client dials c.Conns connections to c.Addr, calls m.Start, drives c.Scenario on
	// each until m.Stopped (checked after each frame: every connection sends at least
	// one), then closes the connections and returns.
	//   Bulk/Stream: send frames back to back.
	//   Echo/PingPong: per connection one request in flight: Stamp, note the time, send,
	//   receive the c.Size byte response into the connection's Verifier, record the
	//   round trip in the connection's latency Recorder.
	Client(ctx context.Context, c Case, m *Meter) error
}

// ScenarioSupporter is implemented by modes that run only some scenarios.
type ScenarioSupporter interface {
	Supports(s Scenario) bool
}

// Supports reports whether m runs scenario s.
func Supports(m Mode, s Scenario) bool {
	if ss, ok := m.(ScenarioSupporter); ok {
		return ss.Supports(s)
	}
	return true
}
