package zc

import "sync/atomic"

// zcPolicy is the adaptive zero-copy decision of one connection (loop only, except the
// counters): SEND_ZC for large sends until the kernel says it copied them anyway, then copying
// sends, probing zero-copy again after reprobe sends, doubling the interval after every
// failed probe (up to 64 Ki sends).
type zcPolicy struct {
	path      SendPath
	threshold int
	base      int

	state     zcState
	copySends int
	reprobe   int
	streak    int // consecutive notifications that said "copied" (zcCopiedRun)

	switches, probes atomic.Uint64
	stateView        atomic.Int32 // state, for Stats from other goroutines
}

type zcState int32

const (
	zcFresh zcState = iota // nothing tried yet
	zcProbe                // one zero-copy send is out; copy until its notification decides
	zcOn                   // the kernel really sends our pages: use SEND_ZC
	zcOff                  // the kernel copied: copy, and probe again after reprobe sends
)

func (p *zcPolicy) init(cfg *Config) {
	p.path, p.threshold, p.base, p.reprobe = cfg.SendPath, cfg.ZCThreshold, cfg.ZCReprobe, cfg.ZCReprobe
}

func (p *zcPolicy) set(s zcState) {
	p.state = s
	p.stateView.Store(int32(s))
}

// on reports whether a large send would go zero-copy now (any goroutine).
func (p *zcPolicy) on() bool {
	switch p.path {
	case SendCopy:
		return false
	case SendZeroCopy:
		return true
	}
	return zcState(p.stateView.Load()) != zcOff
}

// use decides the path of one send of n bytes.
func (p *zcPolicy) use(n int) bool {
	switch p.path {
	case SendCopy:
		return false
	case SendZeroCopy:
		return true
	}
	if n < p.threshold {
		return false
	}
	switch p.state {
	case zcOn:
		return true
	case zcProbe:
		return false
	case zcFresh:
		p.set(zcProbe)
		return true
	}
	p.copySends++
	if p.copySends >= p.reprobe {
		p.copySends = 0
		p.set(zcProbe)
		p.probes.Add(1)
		return true
	}
	return false
}

// wouldUse reports whether use(n) would pick zero-copy now, without changing anything.
func (p *zcPolicy) wouldUse(n int) bool {
	switch p.path {
	case SendCopy:
		return false
	case SendZeroCopy:
		return true
	}
	return n >= p.threshold && (p.state == zcOn || p.state == zcFresh || (p.state == zcOff && p.copySends+1 >= p.reprobe))
}

// probing reports whether use(n) would start a zero-copy probe (the first try or a reprobe
// after copying): the moment to ask whether the peer's window suits zero-copy at all.
func (p *zcPolicy) probing(n int) bool {
	return p.path == SendAdaptive && n >= p.threshold &&
		(p.state == zcFresh || (p.state == zcOff && p.copySends+1 >= p.reprobe))
}

// smallWindow keeps the connection on copying sends without a probe because the peer's
// window is too small for zero-copy (zcSegmentsSmall): the next probe, and the next look at
// the window, come after reprobe copying sends.
func (p *zcPolicy) smallWindow() {
	p.set(zcOff)
	p.copySends = 0
}

// Whether the peer's window is too small for zero-copy at all is the backend's question,
// asked before each probe (becontract.ZCSegmentsSmall, smallWindow).

// countCopy counts a buffer of n bytes sent by copy along with the one use decided for (a
// batch): every large buffer counts toward the next probe.
func (p *zcPolicy) countCopy(n int) {
	if p.path == SendAdaptive && p.state == zcOff && n >= p.threshold {
		p.copySends++
	}
}

// zcCopiedRun is how many notifications in a row, none of them "not copied", take a
// connection that is on zero-copy back to copying. A notification that says copied is not
// proof: io_uring links a SEND_ZC whose first bytes join an skb of an earlier send to that
// send's notification (io_uring/notif.c, io_link_skb), and only the head of such a chain
// sees its skbs, so every linked notification carries IORING_NOTIF_USAGE_ZC_COPIED although
// nothing was copied (on a virtio NIC 5-28% of 64 KiB sends, 35-45% of forwarded receive
// buffers: doc/notes/issue-27-zcreal-s11.md). Where the kernel really copies (loopback,
// veth) every notification says so; where it does not, the heads of the chains say "not
// copied" among the linked ones. So only a long run of copied verdicts with no uncopied one
// is evidence: a mix, however many copied it holds, keeps zero-copy on. A probe's single
// verdict still decides (zcProbe): it follows copying sends, whose skbs carry no earlier
// notification to link to.
const zcCopiedRun = 16

// notified applies the kernel's verdict on one zero-copy send; it reports whether the
// connection switched to copying.
func (p *zcPolicy) notified(copied bool) bool {
	if p.path != SendAdaptive {
		return false
	}
	if !copied {
		p.streak = 0
		p.reprobe = p.base
		if p.state == zcProbe {
			p.set(zcOn)
		}
		return false
	}
	p.streak++
	switch {
	case p.state == zcProbe:
		// The probe was copied: back to copying, probing less often each time.
		if p.switches.Load() > 0 {
			p.reprobe = min(p.reprobe*2, 64<<10)
		}
		p.set(zcOff)
		p.switches.Add(1)
		return true
	case p.state == zcOn && p.streak >= zcCopiedRun:
		p.set(zcOff)
		p.copySends = 0
		p.switches.Add(1)
		return true
	}
	return false
}

// abandoned says a zero-copy probe ended without a verdict (the send failed or was
// cancelled): probe again next time.
func (p *zcPolicy) abandoned() {
	if p.state == zcProbe {
		p.set(zcFresh)
	}
}
