// Package devmem binds a dmabuf to NIC queues for devmem TCP through the generic netlink
// family "netdev" (NETDEV_CMD_BIND_RX, Linux 6.12; NETDEV_CMD_BIND_TX, Linux 6.15): the NIC
// then receives payload straight into the dmabuf (or sends from it) while the kernel's TCP
// stack keeps the headers. The dmabuf usually comes from a memreg region made with
// Options.Dmabuf.
//
// # Lifecycle
//
// The kernel ties a binding to the netlink socket that made it: a Binding owns that socket,
// and Close (closing it) undoes the binding. Close is idempotent.
//
// # Errors
//
// Every error is an *Error. A device that cannot do devmem TCP — one whose driver has no
// queue management operations (lo, veth, virtio_net), or whose DMA device cannot map the
// dmabuf — is refused with ErrNotSupported, naming what it needs and carrying the kernel's
// own explanation (extended ack) when it gave one.
package devmem

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"github.com/mdlayher/genetlink"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/errs"
)

// ErrNotSupported is the one sentinel every zcnet package shares.
var ErrNotSupported = errs.ErrNotSupported

// netdev family uapi (include/uapi/linux/netdev.h, checked by TestUAPI).
const (
	familyName = "netdev"

	cmdBindRX = 13 // NETDEV_CMD_BIND_RX
	cmdBindTX = 15 // NETDEV_CMD_BIND_TX

	attrDevIfindex   = 1 // NETDEV_A_DEV_IFINDEX
	attrDmabufQueues = 2 // NETDEV_A_DMABUF_QUEUES (nested, one per queue)
	attrDmabufFd     = 3 // NETDEV_A_DMABUF_FD
	attrDmabufID     = 4 // NETDEV_A_DMABUF_ID
	attrQueueID      = 1 // NETDEV_A_QUEUE_ID
	attrQueueType    = 3 // NETDEV_A_QUEUE_TYPE
	queueTypeRX      = 0 // NETDEV_QUEUE_TYPE_RX
)

// drivers is what devmem TCP needs, in the words of every refusal.
const drivers = "a NIC driver with devmem TCP support (mlx5, gve, fbnic, bnxt), header split and a flow steered to the bound queues"

// Error is a failed devmem operation.
type Error struct {
	Op      string // "bind-rx", "bind-tx", "open"
	Ifindex int
	Err     error
}

func (e *Error) Error() string {
	return fmt.Sprintf("devmem: %s on ifindex %d: %v", e.Op, e.Ifindex, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

var openBindings atomic.Int64

// OpenBindings returns how many Bindings are open (tests use it for leaks).
func OpenBindings() int64 { return openBindings.Load() }

// Binding is a dmabuf bound to a NIC's queues.
type Binding struct {
	ID      uint32 // the kernel's dmabuf binding id (netdev queue-get shows it per queue)
	Ifindex int
	Queues  []int // RX queues; nil for a TX binding
	TX      bool

	conn   *genetlink.Conn
	closed atomic.Bool
}

// BindRX binds dmabufFd to RX queues of interface ifindex: the NIC's page pool for those
// queues then allocates from the dmabuf.
func BindRX(ifindex int, queues []int, dmabufFd int) (*Binding, error) {
	if len(queues) == 0 {
		return nil, &Error{Op: "bind-rx", Ifindex: ifindex, Err: fmt.Errorf("no queue to bind: %w", unix.EINVAL)}
	}
	return bind("bind-rx", cmdBindRX, ifindex, queues, dmabufFd)
}

// BindTX binds dmabufFd to interface ifindex for transmitting from it (sendmsg with
// SO_DEVMEM_DMABUF and the binding's ID).
func BindTX(ifindex int, dmabufFd int) (*Binding, error) {
	return bind("bind-tx", cmdBindTX, ifindex, nil, dmabufFd)
}

func bind(op string, cmd uint8, ifindex int, queues []int, fd int) (*Binding, error) {
	fail := func(err error) (*Binding, error) { return nil, &Error{Op: op, Ifindex: ifindex, Err: err} }
	if ifindex <= 0 || fd < 0 {
		return fail(fmt.Errorf("ifindex %d, dmabuf fd %d: %w", ifindex, fd, unix.EINVAL))
	}
	for _, q := range queues {
		if q < 0 {
			return fail(fmt.Errorf("queue %d: %w", q, unix.EINVAL))
		}
	}
	conn, err := genetlink.Dial(nil)
	if err != nil {
		return fail(err)
	}
	_ = conn.SetOption(netlink.ExtendedAcknowledge, true)
	fam, err := conn.GetFamily(familyName)
	if err != nil {
		conn.Close()
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENOENT) {
			return fail(errs.NotSupported("generic netlink family netdev", "Linux 6.5 or newer", err))
		}
		return fail(err)
	}
	ae := netlink.NewAttributeEncoder()
	ae.Uint32(attrDevIfindex, uint32(ifindex))
	ae.Uint32(attrDmabufFd, uint32(fd))
	for _, q := range queues {
		ae.Nested(attrDmabufQueues, func(nae *netlink.AttributeEncoder) error {
			nae.Uint32(attrQueueID, uint32(q))
			nae.Uint32(attrQueueType, queueTypeRX)
			return nil
		})
	}
	data, err := ae.Encode()
	if err != nil {
		conn.Close()
		return fail(err)
	}
	msgs, err := conn.Execute(genetlink.Message{Header: genetlink.Header{Command: cmd, Version: fam.Version}, Data: data},
		fam.ID, netlink.Request)
	if err != nil {
		conn.Close()
		return fail(refusal(op, ifindex, err))
	}
	b := &Binding{Ifindex: ifindex, Queues: append([]int(nil), queues...), TX: cmd == cmdBindTX, conn: conn}
	for _, m := range msgs {
		ad, err := netlink.NewAttributeDecoder(m.Data)
		if err != nil {
			continue
		}
		for ad.Next() {
			if ad.Type() == attrDmabufID {
				b.ID = ad.Uint32()
			}
		}
	}
	openBindings.Add(1)
	return b, nil
}

// refusal turns the kernel's answers that mean "this device or kernel cannot" into
// ErrNotSupported with the reason.
func refusal(op string, ifindex int, err error) error {
	why := ""
	var oe *netlink.OpError
	if errors.As(err, &oe) && oe.Message != "" {
		why = " (kernel: " + oe.Message + ")"
	}
	switch {
	case errors.Is(err, unix.EOPNOTSUPP):
		return errs.NotSupported(fmt.Sprintf("devmem TCP %s on ifindex %d%s", op, ifindex, why), drivers, err)
	case errors.Is(err, unix.EPERM):
		return errs.NotSupported("devmem TCP "+op, "CAP_NET_ADMIN", err)
	case errors.Is(err, unix.ENODEV):
		return fmt.Errorf("%w (no such interface in this network namespace)%s", err, why)
	}
	if why != "" {
		return fmt.Errorf("%w%s", err, why)
	}
	return err
}

// Close undoes the binding (the kernel unbinds when the socket that made it closes). Later
// calls return os.ErrClosed.
func (b *Binding) Close() error {
	if b == nil || !b.closed.CompareAndSwap(false, true) {
		return os.ErrClosed
	}
	openBindings.Add(-1)
	return b.conn.Close()
}
