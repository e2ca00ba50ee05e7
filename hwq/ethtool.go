package hwq

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"

	"github.com/mdlayher/genetlink"
	"github.com/mdlayher/netlink"
)

// ethtoolReq encodes an ethtool request: the header nest (device by name, flags) and the
// attributes fn adds.
func ethtoolReq(ifname string, flags uint32, fn func(ae *netlink.AttributeEncoder)) ([]byte, error) {
	if ifname == "" || len(ifname) >= 16 {
		return nil, &ValueError{Name: "interface name", Value: ifname, Reason: "want 1..15 bytes"}
	}
	ae := netlink.NewAttributeEncoder()
	ae.Nested(ethtoolAHeader, func(h *netlink.AttributeEncoder) error {
		h.String(ethtoolAHeaderDevName, ifname)
		if flags != 0 {
			h.Uint32(ethtoolAHeaderFlags, flags)
		}
		return nil
	})
	if fn != nil {
		fn(ae)
	}
	return ae.Encode()
}

// ethtoolDo runs one ethtool request (not a dump). what/need name the feature for a
// refusal when the kernel answers EOPNOTSUPP or lacks the command.
func (c *Client) ethtoolDo(op, ifname string, cmd uint8, kind reqKind, flags uint32, what, need string,
	fn func(ae *netlink.AttributeEncoder)) ([]genetlink.Message, error) {
	if c.ethtool.err != nil {
		return nil, opErr(op, ifname, c.ethtool.err)
	}
	if !c.ethtool.has(uint32(cmd)) {
		return nil, opErr(op, ifname, notSupported(what, need))
	}
	b, err := ethtoolReq(ifname, flags, fn)
	if err != nil {
		return nil, opErr(op, ifname, err)
	}
	msgs, err := c.request(&c.ethtool, cmd, b, kind)
	if err != nil {
		return nil, opErr(op, ifname, refuse(err, what, need))
	}
	return msgs, nil
}

// reply returns the attributes of the first reply with the given command.
func reply(msgs []genetlink.Message, cmd uint8) (*netlink.AttributeDecoder, error) {
	for _, m := range msgs {
		if m.Header.Command == cmd {
			return netlink.NewAttributeDecoder(m.Data)
		}
	}
	return nil, fmt.Errorf("no ethtool reply of type %d", cmd)
}

// Channels are a device's queue counts (ethtool -l): RX-only, TX-only, other
// (link interrupts etc.) and combined (RX+TX) channels, current and maximum.
type Channels struct {
	RXMax, TXMax, OtherMax, CombinedMax uint32
	RX, TX, Other, Combined             uint32
}

// RXQueues is the number of RX queues these channels give (RX + Combined).
func (ch Channels) RXQueues() uint32 { return ch.RX + ch.Combined }

// TXQueues is the number of TX queues these channels give (TX + Combined).
func (ch Channels) TXQueues() uint32 { return ch.TX + ch.Combined }

// Channels reads the channel counts (ETHTOOL_MSG_CHANNELS_GET).
func (c *Client) Channels(ifname string) (Channels, error) {
	const op = "channels get"
	msgs, err := c.ethtoolDo(op, ifname, ethtoolMsgChannelsGet, reqGet, 0, featChannels, needChannels, nil)
	if err != nil {
		return Channels{}, err
	}
	ad, err := reply(msgs, ethtoolMsgChannelsGetReply)
	if err != nil {
		return Channels{}, opErr(op, ifname, err)
	}
	var ch Channels
	for ad.Next() {
		switch ad.Type() {
		case ethtoolAChannelsRXMax:
			ch.RXMax = ad.Uint32()
		case ethtoolAChannelsTXMax:
			ch.TXMax = ad.Uint32()
		case ethtoolAChannelsOtherMax:
			ch.OtherMax = ad.Uint32()
		case ethtoolAChannelsCombinedMax:
			ch.CombinedMax = ad.Uint32()
		case ethtoolAChannelsRXCount:
			ch.RX = ad.Uint32()
		case ethtoolAChannelsTXCount:
			ch.TX = ad.Uint32()
		case ethtoolAChannelsOtherCount:
			ch.Other = ad.Uint32()
		case ethtoolAChannelsCombinedCount:
			ch.Combined = ad.Uint32()
		}
	}
	return ch, opErr(op, ifname, ad.Err())
}

// ChannelsUpdate says which channel counts to change (nil fields stay as they are).
type ChannelsUpdate struct {
	RX, TX, Other, Combined *uint32
}

// SetChannels changes channel counts (ETHTOOL_MSG_CHANNELS_SET, the ethtool -L
// equivalent). The kernel refuses counts above the maximum (EINVAL) and, on many drivers,
// a reduction below a queue that is in use (bound to AF_XDP, zcrx, devmem or an RSS
// table/ntuple rule): the error carries the kernel's message.
func (c *Client) SetChannels(ifname string, u ChannelsUpdate) error {
	const op = "channels set"
	_, err := c.ethtoolDo(op, ifname, ethtoolMsgChannelsSet, reqSet, 0, featChannels, needChannels, func(ae *netlink.AttributeEncoder) {
		for _, f := range []struct {
			t uint16
			v *uint32
		}{{ethtoolAChannelsRXCount, u.RX}, {ethtoolAChannelsTXCount, u.TX},
			{ethtoolAChannelsOtherCount, u.Other}, {ethtoolAChannelsCombinedCount, u.Combined}} {
			if f.v != nil {
				ae.Uint32(f.t, *f.v)
			}
		}
	})
	return err
}

// DataSplit is the TCP header/data split setting (enum ethtool_tcp_data_split).
type DataSplit uint8

// Header split states. DataSplitUnknown means the driver does not report it: the device
// cannot split headers, as far as ethtool can tell.
const (
	DataSplitUnknown  DataSplit = tcpDataSplitUnknown
	DataSplitDisabled DataSplit = tcpDataSplitDisabled
	DataSplitEnabled  DataSplit = tcpDataSplitEnabled
)

func (d DataSplit) String() string {
	switch d {
	case DataSplitUnknown:
		return "unknown"
	case DataSplitDisabled:
		return "off"
	case DataSplitEnabled:
		return "on"
	}
	return fmt.Sprintf("DataSplit(%d)", uint8(d))
}

// Rings are a device's ring parameters (ethtool -g), including header split.
type Rings struct {
	RXMax, RXMiniMax, RXJumboMax, TXMax uint32
	RX, RXMini, RXJumbo, TX             uint32
	RXBufLen, CQESize                   uint32
	TXPush, RXPush                      bool
	TXPushBufLen, TXPushBufLenMax       uint32
	// TCPDataSplit is the header split state; DataSplitUnknown when the driver does not
	// report one.
	TCPDataSplit DataSplit
	// HDSThresh is the payload size below which packets are not split; reported (with
	// HDSThreshMax > 0) only by drivers that can split (Linux 6.14+).
	HDSThresh, HDSThreshMax uint32
}

// Rings reads ring parameters (ETHTOOL_MSG_RINGS_GET).
func (c *Client) Rings(ifname string) (Rings, error) {
	const op = "rings get"
	msgs, err := c.ethtoolDo(op, ifname, ethtoolMsgRingsGet, reqGet, 0, featRings, needRings, nil)
	if err != nil {
		return Rings{}, err
	}
	ad, err := reply(msgs, ethtoolMsgRingsGetReply)
	if err != nil {
		return Rings{}, opErr(op, ifname, err)
	}
	var r Rings
	for ad.Next() {
		switch ad.Type() {
		case ethtoolARingsRXMax:
			r.RXMax = ad.Uint32()
		case ethtoolARingsRXMiniMax:
			r.RXMiniMax = ad.Uint32()
		case ethtoolARingsRXJumboMax:
			r.RXJumboMax = ad.Uint32()
		case ethtoolARingsTXMax:
			r.TXMax = ad.Uint32()
		case ethtoolARingsRX:
			r.RX = ad.Uint32()
		case ethtoolARingsRXMini:
			r.RXMini = ad.Uint32()
		case ethtoolARingsRXJumbo:
			r.RXJumbo = ad.Uint32()
		case ethtoolARingsTX:
			r.TX = ad.Uint32()
		case ethtoolARingsRXBufLen:
			r.RXBufLen = ad.Uint32()
		case ethtoolARingsTCPDataSplit:
			r.TCPDataSplit = DataSplit(ad.Uint8())
		case ethtoolARingsCQESize:
			r.CQESize = ad.Uint32()
		case ethtoolARingsTXPush:
			r.TXPush = ad.Uint8() != 0
		case ethtoolARingsRXPush:
			r.RXPush = ad.Uint8() != 0
		case ethtoolARingsTXPushBufLen:
			r.TXPushBufLen = ad.Uint32()
		case ethtoolARingsTXPushBufLenMax:
			r.TXPushBufLenMax = ad.Uint32()
		case ethtoolARingsHDSThresh:
			r.HDSThresh = ad.Uint32()
		case ethtoolARingsHDSThreshMax:
			r.HDSThreshMax = ad.Uint32()
		}
	}
	return r, opErr(op, ifname, ad.Err())
}

// RingsUpdate says which ring parameters to change (nil fields stay as they are).
type RingsUpdate struct {
	RX, TX       *uint32
	TCPDataSplit *DataSplit // DataSplitUnknown hands the choice back to the driver
	HDSThresh    *uint32
}

// SetRings changes ring parameters (ETHTOOL_MSG_RINGS_SET, ethtool -G). A driver that
// cannot split headers refuses TCPDataSplit with an error matching ErrNotSupported that
// names "header split"; likewise HDSThresh.
func (c *Client) SetRings(ifname string, u RingsUpdate) error {
	const op = "rings set"
	what, need := featRings, needRings
	switch {
	case u.TCPDataSplit != nil:
		what, need = featHeaderSplit, needHeaderSplit
	case u.HDSThresh != nil:
		what, need = featHDSThresh, needHDSThresh
	}
	if u.TCPDataSplit != nil && *u.TCPDataSplit > DataSplitEnabled {
		return opErr(op, ifname, &ValueError{Name: "tcp-data-split", Value: *u.TCPDataSplit, Reason: "want DataSplitUnknown, DataSplitDisabled or DataSplitEnabled"})
	}
	_, err := c.ethtoolDo(op, ifname, ethtoolMsgRingsSet, reqSet, 0, what, need, func(ae *netlink.AttributeEncoder) {
		if u.RX != nil {
			ae.Uint32(ethtoolARingsRX, *u.RX)
		}
		if u.TX != nil {
			ae.Uint32(ethtoolARingsTX, *u.TX)
		}
		if u.TCPDataSplit != nil {
			ae.Uint8(ethtoolARingsTCPDataSplit, uint8(*u.TCPDataSplit))
		}
		if u.HDSThresh != nil {
			ae.Uint32(ethtoolARingsHDSThresh, *u.HDSThresh)
		}
	})
	return err
}

// Features are a device's netdev feature flags by their ethtool names ("rx-gro",
// "rx-ntuple-filter", ...): HW lists what the device can change, Wanted what was asked
// for, Active what is on, NoChange what cannot be changed.
type Features struct {
	HW, Wanted, Active, NoChange map[string]bool
}

// Feature names this package uses (the kernel's netdev_features_strings).
const (
	FeatureNtuple = "rx-ntuple-filter" // NETIF_F_NTUPLE: ntuple filters (ethtool -N)
	FeatureGRO    = "rx-gro"           // NETIF_F_GRO (veth: NAPI on)
	FeatureHash   = "rx-hashing"       // NETIF_F_RXHASH
)

// Features reads the feature flags (ETHTOOL_MSG_FEATURES_GET).
func (c *Client) Features(ifname string) (Features, error) {
	const op = "features get"
	msgs, err := c.ethtoolDo(op, ifname, ethtoolMsgFeaturesGet, reqGet, 0, featFeatures, needFeatures, nil)
	if err != nil {
		return Features{}, err
	}
	ad, err := reply(msgs, ethtoolMsgFeaturesGetReply)
	if err != nil {
		return Features{}, opErr(op, ifname, err)
	}
	f := Features{HW: map[string]bool{}, Wanted: map[string]bool{}, Active: map[string]bool{}, NoChange: map[string]bool{}}
	for ad.Next() {
		var dst map[string]bool
		switch ad.Type() {
		case ethtoolAFeaturesHW:
			dst = f.HW
		case ethtoolAFeaturesWanted:
			dst = f.Wanted
		case ethtoolAFeaturesActive:
			dst = f.Active
		case ethtoolAFeaturesNochang:
			dst = f.NoChange
		default:
			continue
		}
		ad.Nested(func(nad *netlink.AttributeDecoder) error {
			bits, err := parseNamedBitset(nad)
			maps.Copy(dst, bits)
			return err
		})
	}
	return f, opErr(op, ifname, ad.Err())
}

// SetFeatures turns the named features on or off (ETHTOOL_MSG_FEATURES_SET, ethtool -K)
// and checks that the device applied them: a feature the device cannot change is refused
// with an error matching ErrNotSupported.
func (c *Client) SetFeatures(ifname string, want map[string]bool) error {
	const op = "features set"
	cur, err := c.Features(ifname)
	if err != nil {
		return err
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if cur.Active[name] == want[name] {
			continue
		}
		if !cur.HW[name] || cur.NoChange[name] {
			return opErr(op, ifname, notSupported("feature "+name, "a driver that can change it (ethtool -k lists it as not fixed)"))
		}
	}
	_, err = c.ethtoolDo(op, ifname, ethtoolMsgFeaturesSet, reqSet, ethtoolFlagOmitReply, featFeatures, needFeatures, func(ae *netlink.AttributeEncoder) {
		ae.Nested(ethtoolAFeaturesWanted, func(bs *netlink.AttributeEncoder) error {
			bs.Nested(ethtoolABitsetBits, func(bits *netlink.AttributeEncoder) error {
				for _, name := range slices.Sorted(maps.Keys(want)) {
					bits.Nested(ethtoolABitsetBitsBit, func(bit *netlink.AttributeEncoder) error {
						bit.String(ethtoolABitsetBitName, name)
						if want[name] {
							bit.Flag(ethtoolABitsetBitValue, true)
						}
						return nil
					})
				}
				return nil
			})
			return nil
		})
	})
	if err != nil {
		return err
	}
	after, err := c.Features(ifname)
	if err != nil {
		return err
	}
	for name, on := range want {
		if after.Active[name] != on {
			return opErr(op, ifname, fmt.Errorf("feature %s is %v after asking for %v (the driver or a dependent feature overrode it)", name, after.Active[name], on))
		}
	}
	return nil
}

// parseNamedBitset decodes an ethtool bitset in its verbose form (a list of bits with
// names) into the names of the bits that are set. With NOMASK, every listed bit is set;
// otherwise a bit is set when it carries the VALUE flag.
func parseNamedBitset(ad *netlink.AttributeDecoder) (map[string]bool, error) {
	out := map[string]bool{}
	nomask := false
	type bit struct {
		name string
		set  bool
	}
	var bits []bit
	for ad.Next() {
		switch ad.Type() {
		case ethtoolABitsetNomask:
			nomask = true
		case ethtoolABitsetBits:
			ad.Nested(func(bd *netlink.AttributeDecoder) error {
				for bd.Next() {
					if bd.Type() != ethtoolABitsetBitsBit {
						continue
					}
					bd.Nested(func(b *netlink.AttributeDecoder) error {
						var x bit
						for b.Next() {
							switch b.Type() {
							case ethtoolABitsetBitName:
								x.name = b.String()
							case ethtoolABitsetBitValue:
								x.set = true
							}
						}
						bits = append(bits, x)
						return nil
					})
				}
				return nil
			})
		}
	}
	for _, b := range bits {
		if b.name != "" && (nomask || b.set) {
			out[b.name] = true
		}
	}
	return out, ad.Err()
}

// parseCompactBitset decodes an ethtool bitset in compact form (ETHTOOL_FLAG_COMPACT_BITSETS):
// the value words as one integer (the bitsets read here have at most 64 bits).
func parseCompactBitset(ad *netlink.AttributeDecoder) (uint64, error) {
	var v uint64
	for ad.Next() {
		if ad.Type() == ethtoolABitsetValue {
			b := ad.Bytes()
			for i := 0; i+4 <= len(b) && i < 8; i += 4 {
				v |= uint64(binary.NativeEndian.Uint32(b[i:])) << (8 * i)
			}
		}
	}
	return v, ad.Err()
}

// TSInfo is a device's timestamping capability (ethtool -T).
type TSInfo struct {
	Timestamping uint64 // SOF_TIMESTAMPING_* bits (Timestamping* constants)
	TXTypes      uint64 // 1 << HWTSTAMP_TX_* values
	RXFilters    uint64 // 1 << HWTSTAMP_FILTER_* values
	PHCIndex     int    // the PTP hardware clock /dev/ptpN, -1 when none
}

// Hardware reports whether the device timestamps packets in hardware in both directions.
func (t TSInfo) Hardware() bool {
	const need = TimestampingTXHardware | TimestampingRXHardware | TimestampingRawHardware
	return t.Timestamping&need == need
}

// TSInfo reads the timestamping capability (ETHTOOL_MSG_TSINFO_GET).
func (c *Client) TSInfo(ifname string) (TSInfo, error) {
	const op = "tsinfo get"
	msgs, err := c.ethtoolDo(op, ifname, ethtoolMsgTSInfoGet, reqGet, ethtoolFlagCompactBits, featTSInfo, needTSInfo, nil)
	if err != nil {
		return TSInfo{}, err
	}
	ad, err := reply(msgs, ethtoolMsgTSInfoGetReply)
	if err != nil {
		return TSInfo{}, opErr(op, ifname, err)
	}
	t := TSInfo{PHCIndex: -1}
	for ad.Next() {
		var dst *uint64
		switch ad.Type() {
		case ethtoolATSInfoTimestamping:
			dst = &t.Timestamping
		case ethtoolATSInfoTXTypes:
			dst = &t.TXTypes
		case ethtoolATSInfoRXFilters:
			dst = &t.RXFilters
		case ethtoolATSInfoPHCIndex:
			t.PHCIndex = int(int32(ad.Uint32()))
			continue
		default:
			continue
		}
		ad.Nested(func(nad *netlink.AttributeDecoder) error {
			v, err := parseCompactBitset(nad)
			*dst = v
			return err
		})
	}
	return t, opErr(op, ifname, ad.Err())
}
