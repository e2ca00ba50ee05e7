package hwq

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/errs"
)

// BindOptions tune Bind.
type BindOptions struct {
	// Queue is the RX queue to dedicate to the flow; -1 picks the last RX queue (the
	// kernel's io_uring zcrx documentation carves the last queues out of RSS).
	Queue int
	// RSSContext steers the flow into a new RSS context that holds only the queue
	// (ethtool -X context new), instead of pointing the ntuple rule at the queue itself.
	// Several queues per flow group can later share such a context.
	RSSContext bool
	// KeepHDSThresh leaves hds-thresh alone. By default Bind sets it to 0 where the driver
	// reports one, so every payload byte lands in the data buffers (io_uring zcrx needs it).
	KeepHDSThresh bool
}

// Step is one change Bind made to the device, with the state before and after.
type Step struct {
	What   string // "ntuple feature", "header split", "hds-thresh", "rss carve-out", "rss context", "ntuple rule"
	Before string
	After  string
	undo   func() error
}

func (s Step) String() string { return fmt.Sprintf("%s: %s -> %s", s.What, s.Before, s.After) }

// plan records applied steps so they can be undone in reverse order.
type plan struct {
	steps []Step
}

// apply runs do and, when it succeeds, records the step with its undo.
func (p *plan) apply(what, before, after string, do, undo func() error) error {
	if err := do(); err != nil {
		return fmt.Errorf("%s (%s -> %s): %w", what, before, after, err)
	}
	p.steps = append(p.steps, Step{What: what, Before: before, After: after, undo: undo})
	return nil
}

// rollback undoes every recorded step, last first, and keeps going when one fails; it
// returns the failures joined. Steps are forgotten once tried, so a second rollback does
// nothing.
func (p *plan) rollback() error {
	var errsOut []error
	for i := len(p.steps) - 1; i >= 0; i-- {
		s := p.steps[i]
		if err := s.undo(); err != nil {
			errsOut = append(errsOut, fmt.Errorf("undo %s (back to %s): %w", s.What, s.Before, err))
		}
	}
	p.steps = nil
	return errors.Join(errsOut...)
}

// Binding is a flow bound to a dedicated RX queue. Ifindex and Queue are what io_uring
// zcrx (IORING_REGISTER_ZCRX_IFQ's if_idx and if_rxq) and devmem bind-rx need. Close
// undoes every change Bind made, in reverse order.
type Binding struct {
	Ifname     string
	Ifindex    int
	Queue      uint32 // the dedicated RX queue
	NAPIID     uint32 // its NAPI instance, 0 when netdev does not report one
	Flow       Flow
	RSSContext uint32   // the RSS context created for the flow, 0 when none
	Rule       FlowRule // the ntuple rule steering the flow

	mu     sync.Mutex
	steps  []Step // what was changed, for Steps
	plan   plan
	client *Client
	owned  bool // Close closes client too
	closed bool
}

// Steps returns what Bind changed, in the order it changed it.
func (b *Binding) Steps() []Step {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.steps)
}

// Close undoes the binding: ntuple rule, RSS context, RSS table, hds-thresh, header split,
// ntuple feature, in that order (the reverse of Bind). It tries every step even when one
// fails and returns the failures joined. It is idempotent and nil-safe.
func (b *Binding) Close() error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	err := b.plan.rollback()
	if b.owned {
		err = errors.Join(err, b.client.Close())
	}
	return opErr("unbind", b.Ifname, err)
}

// Bind dedicates an RX queue of ifname to a TCP flow, the way the kernel's io_uring zcrx
// documentation sets a NIC up: header split on (hds-thresh 0), the queue carved out of the
// default RSS table (or an RSS context holding only that queue), and an ntuple rule
// steering the flow's packets to it. It opens its own Client in the caller's namespace;
// the Binding owns it.
func Bind(ifname string, flow Flow, opts BindOptions) (*Binding, error) {
	c, err := Open(Options{})
	if err != nil {
		return nil, err
	}
	b, err := c.Bind(ifname, flow, opts)
	if err != nil {
		c.Close()
		return nil, err
	}
	b.owned = true
	return b, nil
}

// Bind is the package-level Bind on this Client's namespace; the Client must stay open
// until the Binding is closed.
//
// Before changing anything it checks every requirement and refuses with an *OpError whose
// cause matches ErrNotSupported and names each missing feature ("header split", "ntuple
// filters", "RSS indirection table", "a second RX queue"): a device that cannot be bound is
// left exactly as it was. When a step fails midway, the steps already made are undone in
// reverse order before Bind returns.
func (c *Client) Bind(ifname string, flow Flow, opts BindOptions) (*Binding, error) {
	const op = "bind"
	if _, err := flow.is6(); err != nil {
		return nil, opErr(op, ifname, err)
	}
	if _, err := encodeRule(FlowRule{Flow: flow}); err != nil {
		return nil, opErr(op, ifname, err)
	}
	idx, err := c.ifindex(ifname)
	if err != nil {
		return nil, opErr(op, ifname, err)
	}

	// Preflight: read everything, change nothing, name every missing piece.
	var missing []error
	rings, rerr := c.Rings(ifname)
	switch {
	case rerr != nil && errors.Is(rerr, ErrNotSupported):
		missing = append(missing, errs.NotSupported(featHeaderSplit, needHeaderSplit, rerr))
	case rerr != nil:
		return nil, opErr(op, ifname, rerr)
	case rings.TCPDataSplit == DataSplitUnknown:
		missing = append(missing, notSupported(featHeaderSplit, needHeaderSplit+"; the driver does not report tcp-data-split"))
	}
	feats, ferr := c.Features(ifname)
	switch {
	case ferr != nil && errors.Is(ferr, ErrNotSupported):
		missing = append(missing, errs.NotSupported(featNtuple, needNtuple, ferr))
	case ferr != nil:
		return nil, opErr(op, ifname, ferr)
	case !feats.HW[FeatureNtuple]:
		missing = append(missing, notSupported(featNtuple, needNtuple+"; "+FeatureNtuple+" is not a hardware feature of "+ifname))
	}
	rss, rsserr := c.RSS(ifname, 0)
	switch {
	case rsserr != nil && errors.Is(rsserr, ErrNotSupported):
		missing = append(missing, errs.NotSupported(featRSS, needRSS, rsserr))
	case rsserr != nil:
		return nil, opErr(op, ifname, rsserr)
	}
	nrx := 0
	if ch, err := c.Channels(ifname); err == nil {
		nrx = int(ch.RXQueues())
	} else if qs, qerr := c.Queues(idx); qerr == nil {
		for _, q := range qs {
			if q.Type == QueueRX {
				nrx++
			}
		}
	} else if !errors.Is(err, ErrNotSupported) {
		return nil, opErr(op, ifname, err)
	}
	queue := opts.Queue
	if queue < 0 {
		queue = nrx - 1
	}
	switch {
	case nrx < 2:
		missing = append(missing, notSupported("a second RX queue", fmt.Sprintf("at least 2 RX queues (ethtool -L %s combined 2); %s has %d", ifname, ifname, nrx)))
	case queue >= nrx:
		return nil, opErr(op, ifname, &ValueError{Name: "queue", Value: opts.Queue, Reason: fmt.Sprintf("%s has %d RX queues", ifname, nrx)})
	}
	if len(missing) > 0 {
		return nil, opErr(op, ifname, errors.Join(missing...))
	}

	b := &Binding{Ifname: ifname, Ifindex: idx, Queue: uint32(queue), Flow: flow, client: c}
	if qs, err := c.Queues(idx); err == nil {
		for _, q := range qs {
			if q.Type != QueueRX || q.ID != b.Queue {
				continue
			}
			b.NAPIID = q.NAPIID
			if q.IOUring || q.DMABuf != 0 || q.XSK {
				return nil, opErr(op, ifname, fmt.Errorf("rx queue %d is in use (io_uring %v, dmabuf %d, af_xdp %v): %w",
					q.ID, q.IOUring, q.DMABuf, q.XSK, unix.EBUSY))
			}
		}
	}
	fail := func(err error) (*Binding, error) {
		return nil, opErr(op, ifname, errors.Join(err, b.plan.rollback()))
	}
	p := &b.plan

	// 1. ntuple filters on.
	if !feats.Active[FeatureNtuple] {
		if err := p.apply("ntuple feature", "off", "on",
			func() error { return c.SetFeatures(ifname, map[string]bool{FeatureNtuple: true}) },
			func() error { return c.SetFeatures(ifname, map[string]bool{FeatureNtuple: false}) }); err != nil {
			return fail(err)
		}
	}
	// 2. Header split on.
	if rings.TCPDataSplit != DataSplitEnabled {
		prev := rings.TCPDataSplit
		on := DataSplitEnabled
		if err := p.apply("header split", "tcp-data-split "+prev.String(), "tcp-data-split on",
			func() error { return c.SetRings(ifname, RingsUpdate{TCPDataSplit: &on}) },
			func() error { return c.SetRings(ifname, RingsUpdate{TCPDataSplit: &prev}) }); err != nil {
			return fail(err)
		}
	}
	// 3. hds-thresh 0.
	if !opts.KeepHDSThresh && rings.HDSThreshMax > 0 && rings.HDSThresh != 0 {
		prev, zero := rings.HDSThresh, uint32(0)
		if err := p.apply("hds-thresh", fmt.Sprint(prev), "0",
			func() error { return c.SetRings(ifname, RingsUpdate{HDSThresh: &zero}) },
			func() error { return c.SetRings(ifname, RingsUpdate{HDSThresh: &prev}) }); err != nil {
			return fail(err)
		}
	}
	// 4. Carve the queue out of the default RSS table.
	if slices.Contains(rss.Indir, b.Queue) {
		var others []uint32
		for _, q := range rss.Queues() {
			if q != b.Queue {
				others = append(others, q)
			}
		}
		if len(others) == 0 {
			return fail(fmt.Errorf("rss carve-out: the default RSS table spreads only over queue %d", b.Queue))
		}
		orig := slices.Clone(rss.Indir)
		restore := orig
		before := fmt.Sprintf("queues %v", rss.Queues())
		if slices.Equal(orig, DefaultIndir(len(orig), uint32(nrx))) {
			restore, before = nil, before+" (default)"
		}
		if err := p.apply("rss carve-out", before, fmt.Sprintf("queues %v", others),
			func() error { return c.SetRSSIndir(ifname, 0, EqualIndir(len(orig), others)) },
			func() error { return c.SetRSSIndir(ifname, 0, restore) }); err != nil {
			return fail(err)
		}
	}
	// 5. Optionally a dedicated RSS context.
	rule := FlowRule{Flow: flow, Queue: b.Queue}
	if opts.RSSContext {
		var ctx uint32
		if err := p.apply("rss context", "none", fmt.Sprintf("new context over queue %d", b.Queue),
			func() (err error) {
				ctx, err = c.CreateRSSContext(ifname, EqualIndir(len(rss.Indir), []uint32{b.Queue}))
				return err
			},
			func() error { return c.DeleteRSSContext(ifname, ctx) }); err != nil {
			return fail(err)
		}
		b.RSSContext = ctx
		rule.RSSContext, rule.Queue = ctx, 0
	}
	// 6. The ntuple rule.
	var added FlowRule
	target := fmt.Sprintf("queue %d", b.Queue)
	if b.RSSContext != 0 {
		target = fmt.Sprintf("rss context %d", b.RSSContext)
	}
	if err := p.apply("ntuple rule", "none", fmt.Sprintf("%s -> %s", flow, target),
		func() (err error) {
			added, err = c.AddFlowRule(ifname, rule)
			return err
		},
		func() error { return c.DeleteFlowRule(ifname, added.Location) }); err != nil {
		return fail(err)
	}
	b.Rule = added
	b.steps = slices.Clone(p.steps)
	return b, nil
}

// RuleFor finds the ntuple rule of ifname that matches flow exactly, and reports whether
// there is one: the queue (or RSS context) the NIC steers that flow to.
func (c *Client) RuleFor(ifname string, flow Flow) (FlowRule, bool, error) {
	rules, err := c.FlowRules(ifname)
	if err != nil {
		return FlowRule{}, false, err
	}
	want, err := encodeRule(FlowRule{Flow: flow})
	if err != nil {
		return FlowRule{}, false, opErr("ntuple lookup", ifname, err)
	}
	for _, r := range rules {
		got, err := encodeRule(FlowRule{Flow: r.Flow, IPv6: r.IPv6})
		if err == nil && got.FlowType == want.FlowType && got.H == want.H && got.M == want.M {
			return r, true, nil
		}
	}
	return FlowRule{}, false, nil
}
