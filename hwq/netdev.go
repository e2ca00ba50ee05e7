package hwq

import (
	"encoding/binary"
	"fmt"
	"strings"
	"time"

	"github.com/mdlayher/genetlink"
	"github.com/mdlayher/netlink"
)

// XDPFeatures is the device's xdp-features word (enum netdev_xdp_act).
type XDPFeatures uint64

func (f XDPFeatures) String() string {
	names := []string{"basic", "redirect", "ndo-xmit", "xsk-zerocopy", "hw-offload", "rx-sg", "ndo-xmit-sg"}
	var s []string
	for i, n := range names {
		if f&(1<<i) != 0 {
			s = append(s, n)
		}
	}
	if rest := f &^ xdpFeaturesMask; rest != 0 {
		s = append(s, fmt.Sprintf("%#x", uint64(rest)))
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ",")
}

// Device is what the netdev family says about one network device (dev-get).
type Device struct {
	Ifindex       int
	XDPFeatures   XDPFeatures // XDP actions the driver implements
	XDPZCMaxSegs  uint32      // fragments per packet an AF_XDP zero-copy driver accepts (1 without multi-buffer)
	XDPRxMetadata uint64      // enum netdev_xdp_rx_metadata bits
	XSKFeatures   uint64      // enum netdev_xsk_flags bits
}

// QueueType is RX or TX.
type QueueType uint8

// Queue types (enum netdev_queue_type).
const (
	QueueRX QueueType = netdevQueueTypeRX
	QueueTX QueueType = netdevQueueTypeTX
)

func (t QueueType) String() string {
	switch t {
	case QueueRX:
		return "rx"
	case QueueTX:
		return "tx"
	}
	return fmt.Sprintf("QueueType(%d)", uint8(t))
}

// Queue is one hardware (or virtual device) queue (queue-get).
type Queue struct {
	Ifindex int
	ID      uint32    // index within its type, 0..count-1
	Type    QueueType // rx or tx
	NAPIID  uint32    // the NAPI instance serving it, 0 when none
	DMABuf  uint32    // devmem binding id, 0 when none
	IOUring bool      // an io_uring zcrx memory provider is bound to this RX queue
	XSK     bool      // an AF_XDP socket is bound to this queue
}

// NAPI is one NAPI instance (napi-get): the polling context of one or more queues.
type NAPI struct {
	Ifindex           int
	ID                uint32
	IRQ               int // -1 when none is reported
	PID               int // the NAPI kthread in threaded mode, 0 otherwise
	DeferHardIRQs     uint32
	GROFlushTimeout   time.Duration
	IRQSuspendTimeout time.Duration
	Threaded          bool
}

func (c *Client) netdevReady(op string, cmd uint32, need string) error {
	if c.netdev.err != nil {
		return opErr(op, "", c.netdev.err)
	}
	if !c.netdev.has(cmd) {
		return opErr(op, "", notSupported("netdev "+op, need))
	}
	return nil
}

// Devices lists every network device of the namespace (netdev dev-get dump).
func (c *Client) Devices() ([]Device, error) {
	const op = "dev-get"
	if err := c.netdevReady(op, netdevCmdDevGet, "Linux 6.3+"); err != nil {
		return nil, err
	}
	msgs, err := c.request(&c.netdev, netdevCmdDevGet, nil, reqDump)
	if err != nil {
		return nil, opErr(op, "", err)
	}
	out := make([]Device, 0, len(msgs))
	for _, m := range msgs {
		d, err := parseDevice(m.Data)
		if err != nil {
			return nil, opErr(op, "", err)
		}
		out = append(out, d)
	}
	return out, nil
}

// Device returns one device by interface index (netdev dev-get).
func (c *Client) Device(ifindex int) (Device, error) {
	const op = "dev-get"
	if err := c.netdevReady(op, netdevCmdDevGet, "Linux 6.3+"); err != nil {
		return Device{}, err
	}
	ae := netlink.NewAttributeEncoder()
	ae.Uint32(netdevADevIfindex, uint32(ifindex))
	b, _ := ae.Encode()
	msgs, err := c.request(&c.netdev, netdevCmdDevGet, b, reqGet)
	if err != nil {
		return Device{}, opErr(op, fmt.Sprint(ifindex), err)
	}
	for _, m := range msgs {
		d, err := parseDevice(m.Data)
		if err != nil {
			return Device{}, opErr(op, fmt.Sprint(ifindex), err)
		}
		if d.Ifindex == ifindex {
			return d, nil
		}
	}
	return Device{}, opErr(op, fmt.Sprint(ifindex), fmt.Errorf("no dev-get reply"))
}

// Queues lists the RX and TX queues of one device (netdev queue-get dump filtered by
// ifindex; Linux 6.9+). Queues are listed as the kernel reports them: real_num_rx_queues
// and real_num_tx_queues, the active ones.
func (c *Client) Queues(ifindex int) ([]Queue, error) {
	const op = "queue-get"
	if err := c.netdevReady(op, netdevCmdQueueGet, "Linux 6.9+"); err != nil {
		return nil, err
	}
	ae := netlink.NewAttributeEncoder()
	ae.Uint32(netdevAQueueIfindex, uint32(ifindex))
	b, _ := ae.Encode()
	msgs, err := c.request(&c.netdev, netdevCmdQueueGet, b, reqDump)
	if err != nil {
		return nil, opErr(op, fmt.Sprint(ifindex), err)
	}
	out := make([]Queue, 0, len(msgs))
	for _, m := range msgs {
		q, err := parseQueue(m)
		if err != nil {
			return nil, opErr(op, fmt.Sprint(ifindex), err)
		}
		out = append(out, q)
	}
	return out, nil
}

// NAPIs lists the NAPI instances of one device (netdev napi-get dump; Linux 6.9+). Devices
// without NAPI (loopback; veth without GRO or XDP) have none.
func (c *Client) NAPIs(ifindex int) ([]NAPI, error) {
	const op = "napi-get"
	if err := c.netdevReady(op, netdevCmdNapiGet, "Linux 6.9+"); err != nil {
		return nil, err
	}
	ae := netlink.NewAttributeEncoder()
	ae.Uint32(netdevANapiIfindex, uint32(ifindex))
	b, _ := ae.Encode()
	msgs, err := c.request(&c.netdev, netdevCmdNapiGet, b, reqDump)
	if err != nil {
		return nil, opErr(op, fmt.Sprint(ifindex), err)
	}
	out := make([]NAPI, 0, len(msgs))
	for _, m := range msgs {
		n, err := parseNAPI(m.Data)
		if err != nil {
			return nil, opErr(op, fmt.Sprint(ifindex), err)
		}
		out = append(out, n)
	}
	return out, nil
}

// nlUint decodes an unsigned netlink integer of any width the kernel may use (the "uint"
// type of netlink specs is 4 or 8 bytes).
func nlUint(b []byte) (uint64, error) {
	switch len(b) {
	case 1:
		return uint64(b[0]), nil
	case 2:
		return uint64(binary.NativeEndian.Uint16(b)), nil
	case 4:
		return uint64(binary.NativeEndian.Uint32(b)), nil
	case 8:
		return binary.NativeEndian.Uint64(b), nil
	}
	return 0, fmt.Errorf("netlink integer attribute of %d bytes", len(b))
}

// uintAttr decodes the decoder's current attribute with nlUint.
func uintAttr(ad *netlink.AttributeDecoder) uint64 {
	var v uint64
	ad.Do(func(b []byte) error {
		var err error
		v, err = nlUint(b)
		return err
	})
	return v
}

func parseDevice(b []byte) (Device, error) {
	var d Device
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return d, err
	}
	for ad.Next() {
		switch ad.Type() {
		case netdevADevIfindex:
			d.Ifindex = int(uintAttr(ad))
		case netdevADevXDPFeatures:
			d.XDPFeatures = XDPFeatures(uintAttr(ad))
		case netdevADevXDPZCMaxSegs:
			d.XDPZCMaxSegs = uint32(uintAttr(ad))
		case netdevADevXDPRxMetadataFeatus:
			d.XDPRxMetadata = uintAttr(ad)
		case netdevADevXSKFeatures:
			d.XSKFeatures = uintAttr(ad)
		}
	}
	return d, ad.Err()
}

func parseQueue(m genetlink.Message) (Queue, error) {
	var q Queue
	ad, err := netlink.NewAttributeDecoder(m.Data)
	if err != nil {
		return q, err
	}
	for ad.Next() {
		switch ad.Type() {
		case netdevAQueueID:
			q.ID = uint32(uintAttr(ad))
		case netdevAQueueIfindex:
			q.Ifindex = int(uintAttr(ad))
		case netdevAQueueType:
			q.Type = QueueType(uintAttr(ad))
		case netdevAQueueNapiID:
			q.NAPIID = uint32(uintAttr(ad))
		case netdevAQueueDMABuf:
			q.DMABuf = uint32(uintAttr(ad))
		case netdevAQueueIOUring:
			q.IOUring = true
		case netdevAQueueXSK:
			q.XSK = true
		}
	}
	return q, ad.Err()
}

func parseNAPI(b []byte) (NAPI, error) {
	n := NAPI{IRQ: -1}
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return n, err
	}
	for ad.Next() {
		switch ad.Type() {
		case netdevANapiIfindex:
			n.Ifindex = int(uintAttr(ad))
		case netdevANapiID:
			n.ID = uint32(uintAttr(ad))
		case netdevANapiIRQ:
			n.IRQ = int(int32(uintAttr(ad)))
		case netdevANapiPID:
			n.PID = int(uintAttr(ad))
		case netdevANapiDeferHardIRQs:
			n.DeferHardIRQs = uint32(uintAttr(ad))
		case netdevANapiGROFlushTimeout:
			n.GROFlushTimeout = time.Duration(uintAttr(ad))
		case netdevANapiIRQSuspendTimeout:
			n.IRQSuspendTimeout = time.Duration(uintAttr(ad))
		case netdevANapiThreaded:
			n.Threaded = uintAttr(ad) != 0
		}
	}
	return n, ad.Err()
}
