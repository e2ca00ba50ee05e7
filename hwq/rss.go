package hwq

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"github.com/mdlayher/netlink"
)

// RSS is one RSS context of a device (ethtool -x): context 0 is the default one.
type RSS struct {
	Context   uint32
	HFunc     uint32   // ETH_RSS_HASH_* bit of the active hash function
	Indir     []uint32 // indirection table: entry i holds the RX queue for hash bucket i
	Key       []byte
	InputXfrm uint32
}

// Queues returns the distinct queues the indirection table spreads over, in ascending order.
func (r RSS) Queues() []uint32 {
	seen := map[uint32]bool{}
	var out []uint32
	for _, q := range r.Indir {
		if !seen[q] {
			seen[q] = true
			out = append(out, q)
		}
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// EqualIndir returns an indirection table of size entries spreading evenly over queues
// (ethtool -X equal / weight): entry i gets queues[i % len(queues)].
func EqualIndir(size int, queues []uint32) []uint32 {
	if size <= 0 || len(queues) == 0 {
		return nil
	}
	t := make([]uint32, size)
	for i := range t {
		t[i] = queues[i%len(queues)]
	}
	return t
}

// DefaultIndir is the kernel's default table for n RX rings (ethtool_rxfh_indir_default:
// entry i is i % n).
func DefaultIndir(size int, n uint32) []uint32 {
	if n == 0 {
		return nil
	}
	q := make([]uint32, n)
	for i := range q {
		q[i] = uint32(i)
	}
	return EqualIndir(size, q)
}

// RSS reads one RSS context (ETHTOOL_MSG_RSS_GET, Linux 6.0+; context 0 is the default).
func (c *Client) RSS(ifname string, context uint32) (RSS, error) {
	const op = "rss get"
	what, need := featRSS, needRSS
	if context != 0 {
		what, need = featRSSContext, needRSSContext
	}
	msgs, err := c.ethtoolDo(op, ifname, ethtoolMsgRSSGet, reqGet, 0, what, need, func(ae *netlink.AttributeEncoder) {
		if context != 0 {
			ae.Uint32(ethtoolARSSContext, context)
		}
	})
	if err != nil {
		return RSS{}, err
	}
	ad, err := reply(msgs, ethtoolMsgRSSGetReply)
	if err != nil {
		return RSS{}, opErr(op, ifname, err)
	}
	r := RSS{Context: context}
	for ad.Next() {
		switch ad.Type() {
		case ethtoolARSSContext:
			r.Context = ad.Uint32()
		case ethtoolARSSHFunc:
			r.HFunc = ad.Uint32()
		case ethtoolARSSIndir:
			b := ad.Bytes()
			r.Indir = make([]uint32, len(b)/4)
			for i := range r.Indir {
				r.Indir[i] = binary.NativeEndian.Uint32(b[4*i:])
			}
		case ethtoolARSSHKey:
			r.Key = append([]byte(nil), ad.Bytes()...)
		case ethtoolARSSInputXfrm:
			r.InputXfrm = ad.Uint32()
		}
	}
	if err := ad.Err(); err != nil {
		return RSS{}, opErr(op, ifname, err)
	}
	if len(r.Indir) == 0 {
		return r, opErr(op, ifname, refuseNoTable(what, need))
	}
	return r, nil
}

func refuseNoTable(what, need string) error {
	return fmt.Errorf("%w (%w)", notSupported(what, need), errNoRSS)
}

func indirBytes(indir []uint32) []byte {
	b := make([]byte, 4*len(indir))
	for i, q := range indir {
		binary.NativeEndian.PutUint32(b[4*i:], q)
	}
	return b
}

// SetRSSIndir replaces the indirection table of an RSS context (ethtool -X; netlink
// ETHTOOL_MSG_RSS_SET on Linux 6.17+, the ETHTOOL_SRSSH ioctl before). A nil table
// resets the default context to the kernel's default spread. The table must have the
// device's size (RSS(...).Indir's length).
func (c *Client) SetRSSIndir(ifname string, context uint32, indir []uint32) error {
	const op = "rss set"
	what, need := featRSS, needRSS
	if context != 0 {
		what, need = featRSSContext, needRSSContext
	}
	if c.ethtool.has(ethtoolMsgRSSSet) {
		_, err := c.ethtoolDo(op, ifname, ethtoolMsgRSSSet, reqSet, 0, what, need, func(ae *netlink.AttributeEncoder) {
			if context != 0 {
				ae.Uint32(ethtoolARSSContext, context)
			}
			// A zero-length table resets to the default spread.
			ae.Bytes(ethtoolARSSIndir, indirBytes(indir))
		})
		return err
	}
	_, err := c.rxfhIoctl(ifname, context, indir)
	return opErr(op, ifname, refuse(err, what, need))
}

// CreateRSSContext creates an additional RSS context spreading over indir (ethtool -X
// context new; netlink ETHTOOL_MSG_RSS_CREATE_ACT on Linux 6.17+, the ETHTOOL_SRSSH ioctl
// with ETH_RXFH_CONTEXT_ALLOC before) and returns its number.
func (c *Client) CreateRSSContext(ifname string, indir []uint32) (uint32, error) {
	const op = "rss context create"
	if len(indir) == 0 {
		return 0, opErr(op, ifname, &ValueError{Name: "indirection table", Value: indir, Reason: "empty"})
	}
	if c.ethtool.has(ethtoolMsgRSSCreateAct) {
		msgs, err := c.ethtoolDo(op, ifname, ethtoolMsgRSSCreateAct, reqGet, 0, featRSSContext, needRSSContext, func(ae *netlink.AttributeEncoder) {
			ae.Bytes(ethtoolARSSIndir, indirBytes(indir))
		})
		if err != nil {
			return 0, err
		}
		ad, err := reply(msgs, ethtoolMsgRSSCreateActReply)
		if err != nil {
			return 0, opErr(op, ifname, err)
		}
		var ctx uint32
		for ad.Next() {
			if ad.Type() == ethtoolARSSContext {
				ctx = ad.Uint32()
			}
		}
		if ctx == 0 {
			return 0, opErr(op, ifname, fmt.Errorf("kernel returned no context number"))
		}
		return ctx, opErr(op, ifname, ad.Err())
	}
	ctx, err := c.rxfhIoctl(ifname, ethRXFHContextAlloc, indir)
	return ctx, opErr(op, ifname, refuse(err, featRSSContext, needRSSContext))
}

// DeleteRSSContext removes an additional RSS context (ethtool -X context N delete).
func (c *Client) DeleteRSSContext(ifname string, context uint32) error {
	const op = "rss context delete"
	if context == 0 {
		return opErr(op, ifname, &ValueError{Name: "RSS context", Value: 0, Reason: "the default context cannot be deleted"})
	}
	if c.ethtool.has(ethtoolMsgRSSDeleteAct) {
		_, err := c.ethtoolDo(op, ifname, ethtoolMsgRSSDeleteAct, reqSet, 0, featRSSContext, needRSSContext, func(ae *netlink.AttributeEncoder) {
			ae.Uint32(ethtoolARSSContext, context)
		})
		return err
	}
	// ETHTOOL_SRSSH with indir_size 0 on a non-default context deletes it.
	_, err := c.rxfhIoctl(ifname, context, nil)
	return opErr(op, ifname, refuse(err, featRSSContext, needRSSContext))
}

// rxfhIoctl is ETHTOOL_SRSSH with an indirection table (or none: reset/delete) and no key
// or hash function change; it returns the context the kernel wrote back.
func (c *Client) rxfhIoctl(ifname string, context uint32, indir []uint32) (uint32, error) {
	words := (rxfhConfigOff + 4*len(indir) + 7) / 8
	buf := make([]uint64, words)
	h := (*ethtoolRxfh)(unsafe.Pointer(&buf[0]))
	h.Cmd = ethtoolSRSSH
	h.RSSContext = context
	h.IndirSize = uint32(len(indir))
	copy(unsafe.Slice((*uint32)(unsafe.Add(unsafe.Pointer(&buf[0]), rxfhConfigOff)), len(indir)), indir)
	if err := c.ethtoolIoctl(ifname, unsafe.Pointer(&buf[0])); err != nil {
		return 0, err
	}
	return h.RSSContext, nil
}
