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
	"slices"
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
	// MultiCore: Echo with many connections (Case.Conns: 512, 4096), the server on
	// Case.Queues CPUs of its own and the load generated from the other CPUs by the
	// harness's load generator (the same for every mode: only the server differs).
	MultiCore Scenario = "multicore"
	// HTTP: net/http over the mode's listener (the server differs, the client is always
	// net/http on Go net): Case.Conns keep-alive clients POST a frame of Case.Size bytes
	// and get it back.
	HTTP Scenario = "http"
	// FileSend: one connection; the client sends the file Case.File (frames of
	// Case.Size bytes) with io.Copy from an *os.File, as users of net.Conn do; the server
	// receives like Bulk.
	FileSend Scenario = "filesend"
	// Idle: Case.Conns connections opened by the harness (raw sockets, mode-independent)
	// and left idle; the server's resident memory is sampled before the first and after
	// the last was accepted.
	Idle Scenario = "idle"

	// The services suite (issue 20): the shapes of the programs users write. Each
	// reports the server's CPU per unit of work (Side.CPU over the units the client
	// verified) and a throughput.

	// Relay: Case.Conns clients each send Case.Total bytes (frames of Case.Size) through
	// the server, a TCP relay, to a backend at Case.Backend that the client process runs;
	// the backend sends as many back at the same time. Both ends check every byte.
	Relay Scenario = "relay"
	// RelayHalfClose: Relay where the backend answers first, half-closes (CloseWrite),
	// and only then reads the client's upload to its end: the relay must pass the FIN
	// on and keep forwarding the other way.
	RelayHalfClose Scenario = "relay-hc"
	// FanOut: one publisher connection sends messages of Case.Size bytes; the server
	// forwards each to Case.Conns subscriber connections (a few of them slow readers)
	// and drops a message for a subscriber whose backlog is over a bound.
	FanOut Scenario = "fanout"
	// FileStream: Case.Conns parallel clients each ask for a slice of the page-cache file
	// Case.File (Case.Total bytes in all) and check every byte; a client that gets no
	// byte for StallTimeout fails the case.
	FileStream Scenario = "files"
	// KV: Case.Conns connections pipelining KVDepth GET/SET requests per round trip,
	// values of 16–64 B (Case.Size 64) or a mix up to 100 KiB (Case.Size 100 KiB).
	KV Scenario = "kv"
	// MultiQueue: MultiCore's echo with the server's queues (Case.Queues 2) and the load
	// generator sharing the same CPUs, 64 B request/response.
	MultiQueue Scenario = "mq"
	// HTTPWrk: net/http on the mode's listener, GETs of a Case.Size byte body, with wrk
	// (an outside C load generator) on Case.Conns keep-alive connections.
	HTTPWrk Scenario = "wrk"

	// The TLS scenarios (issue 28), run by the TLS modes only (Go's crypto/tls, zc/ztls
	// with the records in the kernel or in user space).

	// HTTPSWrk: HTTPWrk over TLS: net/http on the mode's TLS listener, wrk GETs over https.
	HTTPSWrk Scenario = "https"
	// FilesTLS: FileStream over TLS: each client asks for its slice of Case.File through
	// a TLS connection and checks every byte.
	FilesTLS Scenario = "files-tls"
	// RelayTLS: Relay with TLS between the clients and the server (a TLS-terminating
	// relay); the backend is plain TCP.
	RelayTLS Scenario = "relay-tls"
)

// Scenarios lists all scenarios in report order.
var Scenarios = []Scenario{Bulk, Echo, PingPong, Stream, MultiCore, HTTP, FileSend, Idle,
	Relay, RelayHalfClose, FanOut, FileStream, KV, MultiQueue, HTTPWrk, HTTPSWrk, FilesTLS, RelayTLS}

// TLSScenarios are the TLS scenarios (issue 28); they run with the services suite.
var TLSScenarios = []Scenario{HTTPSWrk, FilesTLS, RelayTLS}

// ServiceScenarios are the scenarios of the services suite (issue 20).
var ServiceScenarios = []Scenario{Relay, RelayHalfClose, FanOut, FileStream, KV, MultiQueue, HTTPWrk}

// Service reports whether s belongs to the services suite.
func (s Scenario) Service() bool {
	return slices.Contains(ServiceScenarios, s) || slices.Contains(TLSScenarios, s)
}

// OwnModes reports whether s is run only by modes written for it (ServiceMode): the
// services whose server and client are specific to the service (relay, fan-out, file
// streaming, key-value). MultiQueue runs the MultiCore servers, HTTPWrk the HTTP ones.
func (s Scenario) OwnModes() bool {
	return s == Relay || s == RelayHalfClose || s == FanOut || s == FileStream || s == KV ||
		slices.Contains(TLSScenarios, s)
}

// RequestResponse reports whether s is a request/response scenario (Echo, PingPong,
// MultiCore, HTTP) rather than a one-way stream (Bulk, Stream, FileSend) or Idle.
func (s Scenario) RequestResponse() bool {
	return s == Echo || s == PingPong || s == MultiCore || s == HTTP
}

// OneWay reports whether s streams frames from the client to the server.
func (s Scenario) OneWay() bool { return s == Bulk || s == Stream || s == FileSend }

// HarnessClient reports whether the client side of s is the harness's own
// (mode-independent) client rather than the mode's: the multi-core load generator, the
// net/http client and the idle-connection opener. Only the server differs by mode.
func (s Scenario) HarnessClient() bool {
	return s == MultiCore || s == Idle || s == HTTP || s == HTTPWrk || s == HTTPSWrk
}

// StallTimeout is how long a FileStream client may go without a byte before the case
// fails.
var StallTimeout = 5 * time.Second

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
	// CorruptSeq >= 0 makes the client send that frame of each connection with one
	// payload byte flipped under the intact payload's checksum (checks that the checker
	// hashes the payload); -1 normally.
	CorruptSeq int64 `json:"corrupt_seq"`
	// ProfileDir, when set, makes each side write a CPU profile there
	// (<mode>-<scenario>-<size>-<role>.pprof; a later repetition overwrites).
	ProfileDir string `json:"profile_dir,omitempty"`
	// File is the frame file of FileSend (frames of Size bytes, sequence 0, 1, ...).
	File string `json:"file,omitempty"`
	// Queues is how many CPUs the server has (MultiCore: one queue or poller per CPU);
	// 0 elsewhere (the server has one CPU).
	Queues int `json:"queues,omitempty"`
	// Total is, for Relay, the bytes each connection carries each way; for FileStream,
	// the bytes all clients receive together.
	Total int64 `json:"total,omitempty"`
	// Backend is where a Relay server dials its backend (the client process listens
	// there).
	Backend string `json:"backend,omitempty"`
	// Limit, when set, is how long the case may take in all (size-bound cases: Relay,
	// FileStream); otherwise Duration plus 30 s.
	Limit time.Duration `json:"limit,omitempty"`
}

// Deadline is how long the case may take before the parent gives up on it.
func (c Case) Deadline() time.Duration {
	if c.Limit > 0 {
		return c.Limit
	}
	return c.Duration + 30*time.Second
}

// Validate reports a Case that cannot run.
func (c Case) Validate() error {
	switch c.Scenario {
	case Bulk, Stream, Echo, PingPong, MultiCore, HTTP, FileSend, Idle,
		Relay, RelayHalfClose, FanOut, FileStream, KV, HTTPWrk, HTTPSWrk, FilesTLS, RelayTLS:
	default:
		return fmt.Errorf("unknown scenario %q", c.Scenario)
	}
	if c.Size < frame.MinSize {
		return fmt.Errorf("size %d below the minimum frame of %d bytes", c.Size, frame.MinSize)
	}
	if c.Conns < 1 {
		return fmt.Errorf("conns %d < 1", c.Conns)
	}
	if c.Scenario.OneWay() && c.Conns != 1 {
		return fmt.Errorf("%s runs on one connection, not %d", c.Scenario, c.Conns)
	}
	if (c.Scenario == Relay || c.Scenario == RelayHalfClose || c.Scenario == RelayTLS) && (c.Backend == "" || c.Total < 1) {
		return fmt.Errorf("%s needs a backend address and a size", c.Scenario)
	}
	if (c.Scenario == FileStream || c.Scenario == FilesTLS) && (c.File == "" || c.Total < 1) {
		return fmt.Errorf("%s needs a file and a size", c.Scenario)
	}
	if c.Scenario == FileSend && c.File == "" {
		return fmt.Errorf("%s needs a file", c.Scenario)
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
//   - Echo/PingPong/MultiCore servers send back exactly the bytes of each request
//     (and serve Idle: connections that never send);
//   - HTTP servers run ServeHTTP (net/http) on the mode's net.Listener;
//   - Bulk/Stream/FileSend receivers read with buffers of Case.RecvBuf bytes;
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
	//   Echo/PingPong/MultiCore/Idle: read a whole request of c.Size bytes, Feed it,
	//   send it back; until EOF at a request boundary. One Verifier per accepted
	//   connection (Idle counts them).
	//   HTTP: ServeHTTP(c, m, listener, ready) with the mode's net.Listener.
	Server(ctx context.Context, c Case, m *Meter, ready func(addr string)) error
	// Client dials c.Conns connections to c.Addr, calls m.Start, drives c.Scenario on
	// each until m.Stopped (checked after each frame: every connection sends at least
	// one), then closes the connections and returns.
	//   Bulk/Stream: send frames back to back.
	//   Echo/PingPong: per connection one request in flight: Stamp, note the time, send,
	//   receive the c.Size byte response into the connection's Verifier, record the
	//   round trip in the connection's latency Recorder.
	//   FileSend: io.Copy(conn, file) of c.File, then Meter.SentFrames.
	//   MultiCore, Idle, HTTP: never called (the harness's own clients run them).
	Client(ctx context.Context, c Case, m *Meter) error
}

// FDCounter is implemented by modes whose server holds more than one descriptor per
// connection (zc-net: the socket and its duplicate in Go's poller).
type FDCounter interface {
	FDsPerConn() int
}

// FDsPerConn is how many descriptors m's server holds per connection.
func FDsPerConn(m Mode) int {
	if f, ok := m.(FDCounter); ok {
		return f.FDsPerConn()
	}
	return 1
}

// ScenarioSupporter is implemented by modes that run only some scenarios.
type ScenarioSupporter interface {
	Supports(s Scenario) bool
}

// ServiceMode is a mode written for one or more services scenarios (Scenario.OwnModes):
// only such modes run them, and they run nothing else.
type ServiceMode interface {
	Mode
	ScenarioSupporter
	ServiceMode()
}

// Supports reports whether m runs scenario s.
func Supports(m Mode, s Scenario) bool {
	if _, svc := m.(ServiceMode); svc != s.OwnModes() {
		return false
	}
	if ss, ok := m.(ScenarioSupporter); ok {
		return ss.Supports(s)
	}
	return true
}
