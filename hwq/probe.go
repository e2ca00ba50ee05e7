package hwq

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// Support is a tri-state answer of a capability probe.
type Support int8

// Answers. Unknown means the probe could not decide (a probe error, or a question only an
// attempt can answer); the Answer's Reason says which.
const (
	Unknown Support = iota
	No
	Yes
)

func (s Support) String() string {
	switch s {
	case No:
		return "no"
	case Yes:
		return "yes"
	}
	return "unknown"
}

// Answer is one capability of a NIC with the reason for it: what the probe saw when the
// answer is yes, why not when it is no, what is missing to decide when it is unknown.
type Answer struct {
	Support Support
	Reason  string
}

func (a Answer) String() string {
	if a.Reason == "" {
		return a.Support.String()
	}
	return a.Support.String() + ": " + a.Reason
}

func yes(format string, args ...any) Answer { return Answer{Yes, fmt.Sprintf(format, args...)} }
func no(format string, args ...any) Answer  { return Answer{No, fmt.Sprintf(format, args...)} }
func unknown(format string, args ...any) Answer {
	return Answer{Unknown, fmt.Sprintf(format, args...)}
}

// cause is the short form of a probe error for a reason: the errno's name when there is
// one ("EOPNOTSUPP"), the whole error otherwise.
func cause(err error) string {
	if errors.Is(err, errNoRSS) {
		return "the driver reports no indirection table"
	}
	var en unix.Errno
	if errors.As(err, &en) {
		if en == unix.EOPNOTSUPP {
			return "EOPNOTSUPP" // ErrnoName says ENOTSUP, the same number
		}
		if n := unix.ErrnoName(en); n != "" {
			return n
		}
	}
	return err.Error()
}

// fromErr answers No for a refusal (ErrNotSupported) and Unknown for any other error.
func fromErr(err error) Answer {
	if errors.Is(err, ErrNotSupported) {
		return no("%v", err)
	}
	return unknown("probe failed: %v", err)
}

// NIC is the capability report of one network device, decided by probing it through
// netdev and ethtool netlink (nothing is changed on the device).
type NIC struct {
	Name     string
	Index    int
	Kind     string // rtnetlink link kind ("veth"); "" for physical NICs and loopback
	Driver   string // ethtool driver name ("veth", "virtio_net", "mlx5_core"); "" if none
	Loopback bool
	MTU      uint32

	RXQueues, TXQueues int       // active queues (netdev queue-get)
	NAPIs              int       // NAPI instances (netdev napi-get)
	Channels           *Channels // ethtool -l, nil when the driver has none
	XDPFeatures        XDPFeatures
	XDPZCMaxSegs       uint32
	PHCIndex           int // PTP hardware clock index, -1 when none

	Queues       Answer // hardware queues: counts and whether they can be changed
	HeaderSplit  Answer // TCP header/data split (ethtool -G tcp-data-split)
	Ntuple       Answer // ntuple filters (ethtool -N)
	RSS          Answer // RSS indirection table (ethtool -x/-X)
	ZCRX         Answer // io_uring zero-copy receive into a hardware RX queue
	Devmem       Answer // devmem TCP (netdev bind-rx of a dmabuf)
	XDPZeroCopy  Answer // AF_XDP zero-copy (xdp-features xsk-zerocopy)
	HWTimestamps Answer // hardware timestamps in both directions (ethtool -T)
	// RawQueue is what a raw queue (OpenRawQueue: AF_XDP) will be on this NIC: zero-copy or
	// copy mode, native or generic XDP. RawMetadata is which XDP RX metadata the driver
	// gives a device-bound program (RX timestamp, RX hash, VLAN tag).
	RawQueue    Answer
	RawMetadata Answer

	// Special is seed 003's "this NIC is special" flag: yes when the NIC can move payload
	// straight between the wire and application memory (zcrx, devmem or AF_XDP zero-copy).
	Special Answer
}

// ProbeNIC probes one device of the caller's namespace.
func ProbeNIC(ifname string) (NIC, error) {
	c, err := Open(Options{})
	if err != nil {
		return NIC{}, err
	}
	defer c.Close()
	return c.Probe(ifname)
}

// ProbeAll probes every device of the caller's namespace, by interface index.
func ProbeAll() ([]NIC, error) {
	c, err := Open(Options{})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.ProbeAll()
}

// ProbeAll probes every device of the Client's namespace.
func (c *Client) ProbeAll() ([]NIC, error) {
	links, err := c.Links()
	if err != nil {
		return nil, err
	}
	out := make([]NIC, 0, len(links))
	for _, l := range links {
		out = append(out, c.probe(l))
	}
	return out, nil
}

// Probe probes one device: it only reads (netdev dev-get/queue-get/napi-get, ethtool
// channels/rings/features/RSS/tsinfo, drvinfo).
func (c *Client) Probe(ifname string) (NIC, error) {
	l, err := c.link(ifname)
	if err != nil {
		return NIC{}, err
	}
	return c.probe(l), nil
}

func (c *Client) probe(l Link) NIC {
	n := NIC{Name: l.Name, Index: l.Index, Kind: l.Kind, Loopback: l.Loopback, MTU: l.MTU, PHCIndex: -1}
	n.Driver, _ = c.Driver(l.Name)
	what := l.Name
	switch {
	case l.Loopback:
		what = "loopback"
	case n.Driver != "":
		what = n.Driver
	case l.Kind != "":
		what = l.Kind
	}

	// Queues: netdev first (the active queues), then ethtool channels.
	var rxQueues []Queue
	qs, qerr := c.Queues(l.Index)
	for _, q := range qs {
		switch q.Type {
		case QueueRX:
			n.RXQueues++
			rxQueues = append(rxQueues, q)
		case QueueTX:
			n.TXQueues++
		}
	}
	if napis, err := c.NAPIs(l.Index); err == nil {
		n.NAPIs = len(napis)
	}
	ch, cherr := c.Channels(l.Name)
	switch {
	case cherr == nil:
		n.Channels = &ch
		n.Queues = yes("rx %d tx %d (channels rx %d/%d tx %d/%d combined %d/%d)", n.RXQueues, n.TXQueues,
			ch.RX, ch.RXMax, ch.TX, ch.TXMax, ch.Combined, ch.CombinedMax)
	case qerr == nil && n.RXQueues+n.TXQueues == 0:
		n.Queues = no("no queues reported (netdev queue-get lists none; ethtool channels: %s)", cause(cherr))
	case qerr == nil:
		n.Queues = yes("rx %d tx %d (fixed: no ethtool channels, %s)", n.RXQueues, n.TXQueues, cause(cherr))
		if l.Loopback {
			n.Queues = no("loopback has no hardware queues (rx %d tx %d software queues)", n.RXQueues, n.TXQueues)
		}
	default:
		n.Queues = fromErr(qerr)
	}

	// Header split.
	rings, rerr := c.Rings(l.Name)
	switch {
	case rerr != nil:
		n.HeaderSplit = fromErr(rerr)
		if n.HeaderSplit.Support == No {
			n.HeaderSplit.Reason = fmt.Sprintf("%s has no ring parameters, so no tcp-data-split (%s)", what, cause(rerr))
		}
	case rings.TCPDataSplit == DataSplitUnknown:
		n.HeaderSplit = no("%s does not report tcp-data-split", what)
	default:
		s := fmt.Sprintf("tcp-data-split %s", rings.TCPDataSplit)
		if rings.HDSThreshMax > 0 {
			s += fmt.Sprintf(", hds-thresh %d (max %d)", rings.HDSThresh, rings.HDSThreshMax)
		}
		n.HeaderSplit = yes("%s", s)
	}

	// Ntuple filters.
	feats, ferr := c.Features(l.Name)
	switch {
	case ferr != nil:
		n.Ntuple = fromErr(ferr)
	case feats.HW[FeatureNtuple]:
		n.Ntuple = yes("%s is a hardware feature (active: %v)", FeatureNtuple, feats.Active[FeatureNtuple])
	default:
		n.Ntuple = no("%s has no %s hardware feature (ethtool -N is refused)", what, FeatureNtuple)
	}

	// RSS.
	rss, rsserr := c.RSS(l.Name, 0)
	if rsserr == nil {
		n.RSS = yes("indirection table of %d entries over queues %v", len(rss.Indir), rss.Queues())
	} else {
		n.RSS = fromErr(rsserr)
		if n.RSS.Support == No {
			n.RSS.Reason = fmt.Sprintf("%s has no RSS indirection table (%s)", what, cause(rsserr))
		}
	}

	// XDP zero-copy.
	dev, derr := c.Device(l.Index)
	switch {
	case derr != nil:
		n.XDPZeroCopy = fromErr(derr)
	case dev.XDPFeatures&XDPXSKZeroCopy != 0:
		n.XDPFeatures, n.XDPZCMaxSegs = dev.XDPFeatures, dev.XDPZCMaxSegs
		n.XDPZeroCopy = yes("xdp-features %s, xdp-zc-max-segs %d", dev.XDPFeatures, dev.XDPZCMaxSegs)
	default:
		n.XDPFeatures, n.XDPZCMaxSegs = dev.XDPFeatures, dev.XDPZCMaxSegs
		n.XDPZeroCopy = no("xdp-features %s: no xsk-zerocopy (AF_XDP runs in copy mode)", dev.XDPFeatures)
	}

	n.RawQueue, n.RawMetadata = rawQueueAnswer(dev, derr, what, n.Driver)

	// Hardware timestamps.
	ts, tserr := c.TSInfo(l.Name)
	switch {
	case tserr != nil:
		n.HWTimestamps = fromErr(tserr)
	case ts.Hardware():
		n.PHCIndex = ts.PHCIndex
		n.HWTimestamps = yes("tx/rx hardware timestamps, PHC %s", phcName(ts.PHCIndex))
	default:
		n.PHCIndex = ts.PHCIndex
		n.HWTimestamps = no("%s timestamps in software only (SOF_TIMESTAMPING %#x, PHC %s)", what, ts.Timestamping, phcName(ts.PHCIndex))
	}

	// zcrx and devmem: a hardware RX queue bound to application memory. Header split is a
	// hard requirement; whether the driver implements the queue API for unreadable memory
	// only a registration (IORING_REGISTER_ZCRX_IFQ, netdev bind-rx) can tell.
	n.ZCRX, n.Devmem = memoryProvider(n, l, what, rxQueues)

	n.Special = special(n)
	return n
}

// XDP RX metadata bits (enum netdev_xdp_rx_metadata, include/uapi/linux/netdev.h).
const (
	xdpRxMetaTimestamp = 1 << 0
	xdpRxMetaHash      = 1 << 1
	xdpRxMetaVLANTag   = 1 << 2
)

// afXDP reports whether this kernel has AF_XDP sockets (CONFIG_XDP_SOCKETS), by opening one.
func afXDP() error {
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	unix.Close(fd)
	return nil
}

// rawQueueAnswer says what OpenRawQueue will get on a device, from its xdp-features and
// xdp-rx-metadata-features (netdev dev-get): by reading only.
func rawQueueAnswer(dev Device, derr error, what, driver string) (raw, meta Answer) {
	if err := afXDP(); err != nil {
		why := fmt.Sprintf("no AF_XDP sockets in this kernel (socket: %s; needs CONFIG_XDP_SOCKETS=y)", cause(err))
		return no("%s", why), no("%s", why)
	}
	if derr != nil {
		return fromErr(derr), fromErr(derr)
	}
	mode := "copy mode (no xsk-zerocopy: frames are copied between the NIC's buffers and the region)"
	if dev.XDPFeatures&XDPXSKZeroCopy != 0 {
		mode = "zero-copy (the NIC DMAs into the region)"
	}
	xdp := "generic XDP (no native XDP in " + what + ": every frame becomes an skb first)"
	if dev.XDPFeatures&XDPBasic != 0 && dev.XDPFeatures&XDPRedirect != 0 {
		xdp = "native XDP"
		if driver == "veth" {
			// bpf.NewRawSteering's XDPAuto: see bpf.NativeXDPCostError.
			xdp = "generic XDP by default (native XDP on veth turns off the peer's TSO/GSO and slows the kernel's own TCP through the pair to about 0.25-0.3x; ask for it with bpf.XDPDriver)"
		}
	}
	raw = yes("%s, %s", mode, xdp)
	var m []string
	for _, b := range []struct {
		bit  uint64
		name string
	}{{xdpRxMetaTimestamp, "rx timestamp"}, {xdpRxMetaHash, "rx hash"}, {xdpRxMetaVLANTag, "vlan tag"}} {
		if dev.XDPRxMetadata&b.bit != 0 {
			m = append(m, b.name)
		}
	}
	if len(m) == 0 {
		return raw, no("%s gives XDP programs no RX metadata (xdp-rx-metadata-features none)", what)
	}
	return raw, yes("%s (XDP RX metadata kfuncs, native mode)", strings.Join(m, ", "))
}

func phcName(i int) string {
	if i < 0 {
		return "none"
	}
	return fmt.Sprintf("/dev/ptp%d", i)
}

func memoryProvider(n NIC, l Link, what string, rxq []Queue) (zcrx, devmem Answer) {
	for _, q := range rxq {
		if q.IOUring {
			zcrx = yes("rx queue %d has an io_uring zcrx memory provider bound", q.ID)
		}
		if q.DMABuf != 0 {
			devmem = yes("rx queue %d has dmabuf binding %d", q.ID, q.DMABuf)
		}
	}
	var why string
	switch {
	case l.Loopback:
		why = "loopback has no hardware RX queue"
	case n.HeaderSplit.Support == No:
		why = "needs header split: " + n.HeaderSplit.Reason
	case n.HeaderSplit.Support == Unknown:
		why = ""
	}
	if why != "" {
		if zcrx.Support != Yes {
			zcrx = no("%s", why)
		}
		if devmem.Support != Yes {
			devmem = no("%s", why)
		}
		return zcrx, devmem
	}
	steer := ""
	if n.Ntuple.Support != Yes {
		steer = "; without ntuple filters no flow can be steered to the queue"
	}
	if zcrx.Support != Yes {
		zcrx = unknown("header split present; only IORING_REGISTER_ZCRX_IFQ can tell whether %s accepts a memory provider%s", what, steer)
	}
	if devmem.Support != Yes {
		devmem = unknown("header split present; only netdev bind-rx with a dmabuf can tell whether %s accepts a memory provider%s", what, steer)
	}
	return zcrx, devmem
}

func special(n NIC) Answer {
	var yesr, unk, nos []string
	for _, c := range []struct {
		name string
		a    Answer
	}{{"zcrx", n.ZCRX}, {"devmem", n.Devmem}, {"af_xdp zero-copy", n.XDPZeroCopy}} {
		switch c.a.Support {
		case Yes:
			yesr = append(yesr, c.name)
		case Unknown:
			unk = append(unk, c.name)
		default:
			nos = append(nos, c.name)
		}
	}
	switch {
	case len(yesr) > 0:
		return yes("%s", strings.Join(yesr, ", "))
	case len(unk) > 0:
		return unknown("%s undecided by probing", strings.Join(unk, ", "))
	}
	return no("none of %s", strings.Join(nos, ", "))
}

// String is a human-readable report of the NIC, one line per capability.
func (n NIC) String() string {
	var b strings.Builder
	kind := n.Driver
	if kind == "" {
		kind = n.Kind
	}
	if n.Loopback {
		kind = "loopback"
	}
	fmt.Fprintf(&b, "%s (index %d, %s, mtu %d)\n", n.Name, n.Index, kind, n.MTU)
	for _, l := range []struct {
		name string
		a    Answer
	}{{"queues", n.Queues}, {"header split", n.HeaderSplit}, {"ntuple", n.Ntuple}, {"rss", n.RSS},
		{"zcrx", n.ZCRX}, {"devmem", n.Devmem}, {"xdp zero-copy", n.XDPZeroCopy},
		{"hw timestamps", n.HWTimestamps}, {"raw queue", n.RawQueue}, {"raw metadata", n.RawMetadata},
		{"special", n.Special}} {
		fmt.Fprintf(&b, "  %-14s %s\n", l.name, l.a)
	}
	return b.String()
}
