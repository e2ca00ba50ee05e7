package hwq

import (
	"errors"
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/mdlayher/genetlink"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/errs"
	"github.com/zcnet/zcnet/internal/netns"
)

// openClients counts Clients not yet closed (the tests' leak check).
var openClients atomic.Int64

// Options configure Open.
type Options struct {
	// NetNS, when > 0, is an open descriptor of a network namespace (/run/netns/NAME,
	// /proc/PID/ns/net): the Client then sees and changes that namespace's devices. 0 means
	// the caller's namespace. The descriptor is only used during Open.
	NetNS int
}

// family is a generic netlink family as the kernel announced it, with the commands it
// implements (CTRL_ATTR_OPS), so a missing command is a clean refusal instead of a guess.
type family struct {
	id      uint16
	version uint8
	ops     map[uint32]bool
	err     error // why the family is unusable, nil when it is usable
}

func (f *family) has(cmd uint32) bool { return f.err == nil && f.ops[cmd] }

// Client talks to the kernel about NIC hardware queues: the generic netlink families
// "netdev" and "ethtool", and the SIOCETHTOOL ioctl for what ethtool netlink has no
// command for (ntuple rules, RSS contexts on kernels before 6.17). It owns one netlink
// socket and one ioctl socket, both bound to the namespace chosen at Open.
//
// Methods are safe for concurrent use. Close is idempotent; later calls fail with an
// *OpError wrapping os.ErrClosed.
type Client struct {
	mu      sync.Mutex // serializes netlink requests (dumps are Send+Receive pairs)
	gc      *genetlink.Conn
	rt      *rtnetlink.Conn
	ioctlFD int
	netdev  family
	ethtool family
	closed  bool
}

// Open connects to the kernel in the caller's namespace or in opts.NetNS.
func Open(opts Options) (*Client, error) {
	const op = "open"
	ns := -1
	if opts.NetNS > 0 {
		ns = opts.NetNS
	}
	gc, err := genetlink.Dial(&netlink.Config{NetNS: max(ns, 0)})
	if err != nil {
		return nil, opErr(op, "", err)
	}
	// Error messages from the kernel (extended ack) make refusals self-explaining.
	_ = gc.SetOption(netlink.ExtendedAcknowledge, true)
	rt, err := rtnetlink.Dial(&netlink.Config{NetNS: max(ns, 0)})
	if err != nil {
		gc.Close()
		return nil, opErr(op, "", err)
	}
	c := &Client{gc: gc, rt: rt, ioctlFD: -1}
	err = netns.Do(ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			// Kernels without IPv4 still answer SIOCETHTOOL on a generic netlink socket.
			fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_GENERIC)
		}
		if err != nil {
			return os.NewSyscallError("socket", err)
		}
		c.ioctlFD = fd
		return nil
	})
	if err != nil {
		gc.Close()
		rt.Close()
		return nil, opErr(op, "", err)
	}
	openClients.Add(1)
	c.netdev = c.lookupFamily(netdevFamilyName, featNetdev, needNetdev)
	c.ethtool = c.lookupFamily(ethtoolFamilyName, featEthtoolNL, needEthtoolNL)
	if c.netdev.err != nil && !errors.Is(c.netdev.err, ErrNotSupported) {
		c.Close()
		return nil, opErr(op, "", c.netdev.err)
	}
	if c.ethtool.err != nil && !errors.Is(c.ethtool.err, ErrNotSupported) {
		c.Close()
		return nil, opErr(op, "", c.ethtool.err)
	}
	return c, nil
}

// Close releases the sockets.
func (c *Client) Close() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	openClients.Add(-1)
	err := errors.Join(c.gc.Close(), c.rt.Close())
	if c.ioctlFD >= 0 {
		if cerr := unix.Close(c.ioctlFD); err == nil && cerr != nil {
			err = os.NewSyscallError("close", cerr)
		}
		c.ioctlFD = -1
	}
	return err
}

// Controller (generic netlink's own family) attributes, include/uapi/linux/genetlink.h.
const (
	ctrlCmdGetFamily   = 3 // CTRL_CMD_GETFAMILY
	ctrlAttrFamilyID   = 1 // CTRL_ATTR_FAMILY_ID u16
	ctrlAttrFamilyName = 2 // CTRL_ATTR_FAMILY_NAME string
	ctrlAttrVersion    = 3 // CTRL_ATTR_VERSION u32
	ctrlAttrOps        = 6 // CTRL_ATTR_OPS nest of nests
	ctrlAttrOpID       = 1 // CTRL_ATTR_OP_ID u32
)

func (c *Client) lookupFamily(name, what, need string) family {
	ae := netlink.NewAttributeEncoder()
	ae.String(ctrlAttrFamilyName, name)
	b, err := ae.Encode()
	if err != nil {
		return family{err: err}
	}
	msgs, err := c.gc.Execute(genetlink.Message{
		Header: genetlink.Header{Command: ctrlCmdGetFamily, Version: 1},
		Data:   b,
	}, unix.GENL_ID_CTRL, netlink.Request)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, os.ErrNotExist) {
			return family{err: errs.NotSupported(what, need, err)}
		}
		return family{err: err}
	}
	if len(msgs) != 1 {
		return family{err: errors.New("genetlink: unexpected number of replies to CTRL_CMD_GETFAMILY")}
	}
	f := family{ops: map[uint32]bool{}}
	ad, err := netlink.NewAttributeDecoder(msgs[0].Data)
	if err != nil {
		return family{err: err}
	}
	for ad.Next() {
		switch ad.Type() {
		case ctrlAttrFamilyID:
			f.id = ad.Uint16()
		case ctrlAttrVersion:
			f.version = uint8(ad.Uint32())
		case ctrlAttrOps:
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				for nad.Next() {
					nad.Nested(func(od *netlink.AttributeDecoder) error {
						for od.Next() {
							if od.Type() == ctrlAttrOpID {
								f.ops[od.Uint32()] = true
							}
						}
						return nil
					})
				}
				return nil
			})
		}
	}
	if err := ad.Err(); err != nil {
		return family{err: err}
	}
	return f
}

// reqKind says what answer a request gets.
type reqKind int

const (
	reqGet  reqKind = iota // one reply message (or an error)
	reqSet                 // no reply: ask for an acknowledgement (or an error)
	reqDump                // a multi-part reply ending with NLMSG_DONE
)

// request sends one generic netlink request and returns the replies. A get is not flagged
// NLM_F_ACK: the kernel would send the reply and then an acknowledgement, and the
// acknowledgement would be left in the socket for the next request. A dump reads the
// multi-part answer until NLMSG_DONE and is retried (up to three times) when the kernel
// marked it as interrupted (NLM_F_DUMP_INTR: the set changed while it was dumped).
func (c *Client) request(f *family, cmd uint8, attrs []byte, kind reqKind) ([]genetlink.Message, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, os.ErrClosed
	}
	flags := netlink.Request
	switch kind {
	case reqDump:
		flags |= netlink.Dump
	case reqSet:
		flags |= netlink.Acknowledge
	}
	msg := genetlink.Message{Header: genetlink.Header{Command: cmd, Version: f.version}, Data: attrs}
	for try := 0; ; try++ {
		if kind != reqDump {
			return c.gc.Execute(msg, f.id, flags)
		}
		req, err := c.gc.Send(msg, f.id, flags)
		if err != nil {
			return nil, err
		}
		// Receive reads the multi-part answer until NLMSG_DONE.
		gms, nms, err := c.gc.Receive()
		if err != nil {
			return nil, err
		}
		if err := netlink.Validate(req, nms); err != nil {
			return nil, err
		}
		interrupted := false
		for i := range nms {
			if nms[i].Header.Flags&netlink.DumpInterrupted != 0 {
				interrupted = true
			}
		}
		out := gms
		if !interrupted || try == 2 {
			return out, nil
		}
	}
}

// ioctl runs fn with the ioctl socket, holding the lock so Close cannot close it in
// between.
func (c *Client) ioctl(fn func(fd int) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return os.ErrClosed
	}
	err := fn(c.ioctlFD)
	runtime.KeepAlive(c)
	return err
}
