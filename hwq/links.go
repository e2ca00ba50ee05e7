package hwq

import (
	"os"
	"sort"

	"golang.org/x/sys/unix"
)

// Link is a network device as rtnetlink lists it.
type Link struct {
	Index    int
	Name     string
	Kind     string // IFLA_INFO_KIND: "veth", "bridge", ...; "" for physical NICs and loopback
	MTU      uint32
	Up       bool // IFF_UP
	Loopback bool // IFF_LOOPBACK
}

// Links lists the devices of the Client's namespace (RTM_GETLINK dump), by index.
func (c *Client) Links() ([]Link, error) {
	const op = "links"
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, opErr(op, "", os.ErrClosed)
	}
	msgs, err := c.rt.Link.List()
	c.mu.Unlock()
	if err != nil {
		return nil, opErr(op, "", err)
	}
	out := make([]Link, 0, len(msgs))
	for _, m := range msgs {
		l := Link{Index: int(m.Index), Up: m.Flags&unix.IFF_UP != 0, Loopback: m.Flags&unix.IFF_LOOPBACK != 0}
		if a := m.Attributes; a != nil {
			l.Name, l.MTU = a.Name, a.MTU
			if a.Info != nil {
				l.Kind = a.Info.Kind
			}
		}
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out, nil
}

// link returns one device by name.
func (c *Client) link(ifname string) (Link, error) {
	links, err := c.Links()
	if err != nil {
		return Link{}, err
	}
	for _, l := range links {
		if l.Name == ifname {
			return l, nil
		}
	}
	return Link{}, opErr("link", ifname, os.NewSyscallError("lookup", unix.ENODEV))
}
