package hwq

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zcnet/zcnet/internal/testutil"
)

// uapiCheck compares one Go value with a C expression; names lists the identifiers the
// expression needs from the headers (an older header may lack them).
type uapiCheck struct {
	c     string
	goV   uint64
	names []string
}

func constCheck(name string, v uint64) uapiCheck { return uapiCheck{name, v, []string{name}} }

func uapiChecks() []uapiCheck {
	consts := []struct {
		name string
		v    uint64
	}{
		{"NETDEV_CMD_DEV_GET", netdevCmdDevGet}, {"NETDEV_CMD_QUEUE_GET", netdevCmdQueueGet},
		{"NETDEV_CMD_NAPI_GET", netdevCmdNapiGet},
		{"NETDEV_A_DEV_IFINDEX", netdevADevIfindex}, {"NETDEV_A_DEV_XDP_FEATURES", netdevADevXDPFeatures},
		{"NETDEV_A_DEV_XDP_ZC_MAX_SEGS", netdevADevXDPZCMaxSegs},
		{"NETDEV_A_DEV_XDP_RX_METADATA_FEATURES", netdevADevXDPRxMetadataFeatus},
		{"NETDEV_A_DEV_XSK_FEATURES", netdevADevXSKFeatures},
		{"NETDEV_A_NAPI_IFINDEX", netdevANapiIfindex}, {"NETDEV_A_NAPI_ID", netdevANapiID},
		{"NETDEV_A_NAPI_IRQ", netdevANapiIRQ}, {"NETDEV_A_NAPI_PID", netdevANapiPID},
		{"NETDEV_A_NAPI_DEFER_HARD_IRQS", netdevANapiDeferHardIRQs},
		{"NETDEV_A_NAPI_GRO_FLUSH_TIMEOUT", netdevANapiGROFlushTimeout},
		{"NETDEV_A_NAPI_IRQ_SUSPEND_TIMEOUT", netdevANapiIRQSuspendTimeout},
		{"NETDEV_A_NAPI_THREADED", netdevANapiThreaded},
		{"NETDEV_A_QUEUE_ID", netdevAQueueID}, {"NETDEV_A_QUEUE_IFINDEX", netdevAQueueIfindex},
		{"NETDEV_A_QUEUE_TYPE", netdevAQueueType}, {"NETDEV_A_QUEUE_NAPI_ID", netdevAQueueNapiID},
		{"NETDEV_A_QUEUE_DMABUF", netdevAQueueDMABuf}, {"NETDEV_A_QUEUE_IO_URING", netdevAQueueIOUring},
		{"NETDEV_A_QUEUE_XSK", netdevAQueueXSK},
		{"NETDEV_QUEUE_TYPE_RX", netdevQueueTypeRX}, {"NETDEV_QUEUE_TYPE_TX", netdevQueueTypeTX},
		{"NETDEV_XDP_ACT_BASIC", uint64(XDPBasic)}, {"NETDEV_XDP_ACT_REDIRECT", uint64(XDPRedirect)},
		{"NETDEV_XDP_ACT_NDO_XMIT", uint64(XDPNdoXmit)}, {"NETDEV_XDP_ACT_XSK_ZEROCOPY", uint64(XDPXSKZeroCopy)},
		{"NETDEV_XDP_ACT_HW_OFFLOAD", uint64(XDPHWOffload)}, {"NETDEV_XDP_ACT_RX_SG", uint64(XDPRxSG)},
		{"NETDEV_XDP_ACT_NDO_XMIT_SG", uint64(XDPNdoXmitSG)}, {"NETDEV_XDP_ACT_MASK", uint64(xdpFeaturesMask)},

		{"ETHTOOL_MSG_FEATURES_GET", ethtoolMsgFeaturesGet}, {"ETHTOOL_MSG_FEATURES_SET", ethtoolMsgFeaturesSet},
		{"ETHTOOL_MSG_RINGS_GET", ethtoolMsgRingsGet}, {"ETHTOOL_MSG_RINGS_SET", ethtoolMsgRingsSet},
		{"ETHTOOL_MSG_CHANNELS_GET", ethtoolMsgChannelsGet}, {"ETHTOOL_MSG_CHANNELS_SET", ethtoolMsgChannelsSet},
		{"ETHTOOL_MSG_TSINFO_GET", ethtoolMsgTSInfoGet}, {"ETHTOOL_MSG_RSS_GET", ethtoolMsgRSSGet},
		{"ETHTOOL_MSG_RSS_SET", ethtoolMsgRSSSet}, {"ETHTOOL_MSG_RSS_CREATE_ACT", ethtoolMsgRSSCreateAct},
		{"ETHTOOL_MSG_RSS_DELETE_ACT", ethtoolMsgRSSDeleteAct},
		{"ETHTOOL_MSG_FEATURES_GET_REPLY", ethtoolMsgFeaturesGetReply},
		{"ETHTOOL_MSG_RINGS_GET_REPLY", ethtoolMsgRingsGetReply},
		{"ETHTOOL_MSG_CHANNELS_GET_REPLY", ethtoolMsgChannelsGetReply},
		{"ETHTOOL_MSG_TSINFO_GET_REPLY", ethtoolMsgTSInfoGetReply},
		{"ETHTOOL_MSG_RSS_GET_REPLY", ethtoolMsgRSSGetReply},
		{"ETHTOOL_MSG_RSS_CREATE_ACT_REPLY", ethtoolMsgRSSCreateActReply},
		{"ETHTOOL_A_HEADER_DEV_INDEX", ethtoolAHeaderDevIndex}, {"ETHTOOL_A_HEADER_DEV_NAME", ethtoolAHeaderDevName},
		{"ETHTOOL_A_HEADER_FLAGS", ethtoolAHeaderFlags},
		{"ETHTOOL_A_CHANNELS_HEADER", ethtoolAHeader}, {"ETHTOOL_A_RINGS_HEADER", ethtoolAHeader},
		{"ETHTOOL_A_FEATURES_HEADER", ethtoolAHeader}, {"ETHTOOL_A_TSINFO_HEADER", ethtoolAHeader},
		{"ETHTOOL_A_RSS_HEADER", ethtoolAHeader},
		{"ETHTOOL_FLAG_COMPACT_BITSETS", ethtoolFlagCompactBits}, {"ETHTOOL_FLAG_OMIT_REPLY", ethtoolFlagOmitReply},
		{"ETHTOOL_A_BITSET_NOMASK", ethtoolABitsetNomask}, {"ETHTOOL_A_BITSET_SIZE", ethtoolABitsetSize},
		{"ETHTOOL_A_BITSET_BITS", ethtoolABitsetBits}, {"ETHTOOL_A_BITSET_VALUE", ethtoolABitsetValue},
		{"ETHTOOL_A_BITSET_MASK", ethtoolABitsetMask}, {"ETHTOOL_A_BITSET_BITS_BIT", ethtoolABitsetBitsBit},
		{"ETHTOOL_A_BITSET_BIT_INDEX", ethtoolABitsetBitIndex}, {"ETHTOOL_A_BITSET_BIT_NAME", ethtoolABitsetBitName},
		{"ETHTOOL_A_BITSET_BIT_VALUE", ethtoolABitsetBitValue},
		{"ETHTOOL_A_FEATURES_HW", ethtoolAFeaturesHW}, {"ETHTOOL_A_FEATURES_WANTED", ethtoolAFeaturesWanted},
		{"ETHTOOL_A_FEATURES_ACTIVE", ethtoolAFeaturesActive}, {"ETHTOOL_A_FEATURES_NOCHANGE", ethtoolAFeaturesNochang},
		{"ETHTOOL_A_CHANNELS_RX_MAX", ethtoolAChannelsRXMax}, {"ETHTOOL_A_CHANNELS_TX_MAX", ethtoolAChannelsTXMax},
		{"ETHTOOL_A_CHANNELS_OTHER_MAX", ethtoolAChannelsOtherMax},
		{"ETHTOOL_A_CHANNELS_COMBINED_MAX", ethtoolAChannelsCombinedMax},
		{"ETHTOOL_A_CHANNELS_RX_COUNT", ethtoolAChannelsRXCount}, {"ETHTOOL_A_CHANNELS_TX_COUNT", ethtoolAChannelsTXCount},
		{"ETHTOOL_A_CHANNELS_OTHER_COUNT", ethtoolAChannelsOtherCount},
		{"ETHTOOL_A_CHANNELS_COMBINED_COUNT", ethtoolAChannelsCombinedCount},
		{"ETHTOOL_A_RINGS_RX_MAX", ethtoolARingsRXMax}, {"ETHTOOL_A_RINGS_RX_MINI_MAX", ethtoolARingsRXMiniMax},
		{"ETHTOOL_A_RINGS_RX_JUMBO_MAX", ethtoolARingsRXJumboMax}, {"ETHTOOL_A_RINGS_TX_MAX", ethtoolARingsTXMax},
		{"ETHTOOL_A_RINGS_RX", ethtoolARingsRX}, {"ETHTOOL_A_RINGS_RX_MINI", ethtoolARingsRXMini},
		{"ETHTOOL_A_RINGS_RX_JUMBO", ethtoolARingsRXJumbo}, {"ETHTOOL_A_RINGS_TX", ethtoolARingsTX},
		{"ETHTOOL_A_RINGS_RX_BUF_LEN", ethtoolARingsRXBufLen},
		{"ETHTOOL_A_RINGS_TCP_DATA_SPLIT", ethtoolARingsTCPDataSplit},
		{"ETHTOOL_A_RINGS_CQE_SIZE", ethtoolARingsCQESize}, {"ETHTOOL_A_RINGS_TX_PUSH", ethtoolARingsTXPush},
		{"ETHTOOL_A_RINGS_RX_PUSH", ethtoolARingsRXPush},
		{"ETHTOOL_A_RINGS_TX_PUSH_BUF_LEN", ethtoolARingsTXPushBufLen},
		{"ETHTOOL_A_RINGS_TX_PUSH_BUF_LEN_MAX", ethtoolARingsTXPushBufLenMax},
		{"ETHTOOL_A_RINGS_HDS_THRESH", ethtoolARingsHDSThresh},
		{"ETHTOOL_A_RINGS_HDS_THRESH_MAX", ethtoolARingsHDSThreshMax},
		{"ETHTOOL_TCP_DATA_SPLIT_UNKNOWN", tcpDataSplitUnknown},
		{"ETHTOOL_TCP_DATA_SPLIT_DISABLED", tcpDataSplitDisabled},
		{"ETHTOOL_TCP_DATA_SPLIT_ENABLED", tcpDataSplitEnabled},
		{"ETHTOOL_A_TSINFO_TIMESTAMPING", ethtoolATSInfoTimestamping},
		{"ETHTOOL_A_TSINFO_TX_TYPES", ethtoolATSInfoTXTypes}, {"ETHTOOL_A_TSINFO_RX_FILTERS", ethtoolATSInfoRXFilters},
		{"ETHTOOL_A_TSINFO_PHC_INDEX", ethtoolATSInfoPHCIndex},
		{"ETHTOOL_A_RSS_CONTEXT", ethtoolARSSContext}, {"ETHTOOL_A_RSS_HFUNC", ethtoolARSSHFunc},
		{"ETHTOOL_A_RSS_INDIR", ethtoolARSSIndir}, {"ETHTOOL_A_RSS_HKEY", ethtoolARSSHKey},
		{"ETHTOOL_A_RSS_INPUT_XFRM", ethtoolARSSInputXfrm}, {"ETHTOOL_A_RSS_START_CONTEXT", ethtoolARSSStartContext},

		{"SOF_TIMESTAMPING_TX_HARDWARE", TimestampingTXHardware}, {"SOF_TIMESTAMPING_TX_SOFTWARE", TimestampingTXSoftware},
		{"SOF_TIMESTAMPING_RX_HARDWARE", TimestampingRXHardware}, {"SOF_TIMESTAMPING_RX_SOFTWARE", TimestampingRXSoftware},
		{"SOF_TIMESTAMPING_SOFTWARE", TimestampingSoftware}, {"SOF_TIMESTAMPING_RAW_HARDWARE", TimestampingRawHardware},

		{"SIOCETHTOOL", siocEthtool},
		{"ETHTOOL_GRXRINGS", ethtoolGRXRings}, {"ETHTOOL_GRXCLSRLCNT", ethtoolGRXClsRlCnt},
		{"ETHTOOL_GRXCLSRULE", ethtoolGRXClsRule}, {"ETHTOOL_GRXCLSRLALL", ethtoolGRXClsRlAll},
		{"ETHTOOL_SRXCLSRLDEL", ethtoolSRXClsRlDel}, {"ETHTOOL_SRXCLSRLINS", ethtoolSRXClsRlIns},
		{"ETHTOOL_GRSSH", ethtoolGRSSH}, {"ETHTOOL_SRSSH", ethtoolSRSSH},
		{"ETH_RXFH_CONTEXT_ALLOC", ethRXFHContextAlloc}, {"ETH_RXFH_INDIR_NO_CHANGE", ethRXFHIndirNoChg},
		{"TCP_V4_FLOW", tcpV4Flow}, {"TCP_V6_FLOW", tcpV6Flow}, {"FLOW_EXT", flowExt},
		{"FLOW_MAC_EXT", flowMacExt}, {"FLOW_RSS", flowRSS},
		{"RX_CLS_LOC_SPECIAL", rxClsLocSpecial}, {"RX_CLS_LOC_ANY", rxClsLocAny},
		{"RX_CLS_LOC_FIRST", rxClsLocFirst}, {"RX_CLS_LOC_LAST", rxClsLocLast},

		{"CTRL_CMD_GETFAMILY", ctrlCmdGetFamily}, {"CTRL_ATTR_FAMILY_ID", ctrlAttrFamilyID},
		{"CTRL_ATTR_FAMILY_NAME", ctrlAttrFamilyName}, {"CTRL_ATTR_VERSION", ctrlAttrVersion},
		{"CTRL_ATTR_OPS", ctrlAttrOps}, {"CTRL_ATTR_OP_ID", ctrlAttrOpID},
	}
	var out []uapiCheck
	for _, c := range consts {
		out = append(out, constCheck(c.name, c.v))
	}
	var fs ethtoolRxFlowSpec
	var nfc ethtoolRxnfc
	var rxfh ethtoolRxfh
	layout := []uapiCheck{
		{"sizeof(union ethtool_flow_union)", flowUnionSize, nil},
		{"sizeof(struct ethtool_flow_ext)", uint64(unsafe.Sizeof(ethtoolFlowExt{})), nil},
		{"offsetof(struct ethtool_flow_ext, h_dest)", uint64(unsafe.Offsetof(ethtoolFlowExt{}.HDest)), nil},
		{"offsetof(struct ethtool_flow_ext, vlan_etype)", uint64(unsafe.Offsetof(ethtoolFlowExt{}.VlanEtype)), nil},
		{"offsetof(struct ethtool_flow_ext, vlan_tci)", uint64(unsafe.Offsetof(ethtoolFlowExt{}.VlanTCI)), nil},
		{"offsetof(struct ethtool_flow_ext, data)", uint64(unsafe.Offsetof(ethtoolFlowExt{}.Data)), nil},
		{"sizeof(struct ethtool_rx_flow_spec)", uint64(unsafe.Sizeof(fs)), nil},
		{"offsetof(struct ethtool_rx_flow_spec, h_u)", uint64(unsafe.Offsetof(fs.H)), nil},
		{"offsetof(struct ethtool_rx_flow_spec, h_ext)", uint64(unsafe.Offsetof(fs.HExt)), nil},
		{"offsetof(struct ethtool_rx_flow_spec, m_u)", uint64(unsafe.Offsetof(fs.M)), nil},
		{"offsetof(struct ethtool_rx_flow_spec, m_ext)", uint64(unsafe.Offsetof(fs.MExt)), nil},
		{"offsetof(struct ethtool_rx_flow_spec, ring_cookie)", uint64(unsafe.Offsetof(fs.RingCookie)), nil},
		{"offsetof(struct ethtool_rx_flow_spec, location)", uint64(unsafe.Offsetof(fs.Location)), nil},
		{"sizeof(struct ethtool_rxnfc)", uint64(unsafe.Sizeof(nfc)), nil},
		{"offsetof(struct ethtool_rxnfc, flow_type)", uint64(unsafe.Offsetof(nfc.FlowType)), nil},
		{"offsetof(struct ethtool_rxnfc, data)", uint64(unsafe.Offsetof(nfc.Data)), nil},
		{"offsetof(struct ethtool_rxnfc, fs)", uint64(unsafe.Offsetof(nfc.FS)), nil},
		{"offsetof(struct ethtool_rxnfc, rule_cnt)", uint64(unsafe.Offsetof(nfc.RuleCnt)), nil},
		{"offsetof(struct ethtool_rxnfc, rss_context)", uint64(unsafe.Offsetof(nfc.RuleCnt)), nil},
		{"offsetof(struct ethtool_rxnfc, rule_locs)", rxnfcRuleLocsOff, nil},
		{"sizeof(struct ethtool_rxfh)", uint64(unsafe.Sizeof(rxfh)), nil},
		{"offsetof(struct ethtool_rxfh, rss_context)", uint64(unsafe.Offsetof(rxfh.RSSContext)), nil},
		{"offsetof(struct ethtool_rxfh, indir_size)", uint64(unsafe.Offsetof(rxfh.IndirSize)), nil},
		{"offsetof(struct ethtool_rxfh, key_size)", uint64(unsafe.Offsetof(rxfh.KeySize)), nil},
		{"offsetof(struct ethtool_rxfh, hfunc)", uint64(unsafe.Offsetof(rxfh.HFunc)), nil},
		{"offsetof(struct ethtool_rxfh, rsvd32)", uint64(unsafe.Offsetof(rxfh.Rsvd32)), nil},
		{"offsetof(struct ethtool_rxfh, rss_config)", rxfhConfigOff, nil},
		{"offsetof(struct ethtool_rxfh, input_xfrm)", uint64(unsafe.Offsetof(rxfh.InputXfrm)), []string{"input_xfrm"}},
		{"offsetof(struct ethtool_tcpip4_spec, tos)", 12, nil},
		{"offsetof(struct ethtool_tcpip4_spec, ip4dst)", ip4DstOff, nil},
		{"offsetof(struct ethtool_tcpip4_spec, psrc)", ip4PSrcOff, nil},
		{"offsetof(struct ethtool_tcpip4_spec, pdst)", ip4PDstOff, nil},
		{"offsetof(struct ethtool_tcpip6_spec, ip6dst)", ip6DstOff, nil},
		{"offsetof(struct ethtool_tcpip6_spec, psrc)", ip6PSrcOff, nil},
		{"offsetof(struct ethtool_tcpip6_spec, pdst)", ip6PDstOff, nil},
		{"sizeof(struct ifreq)", uint64(unsafe.Sizeof(ifreqData{})), nil},
		{"offsetof(struct ifreq, ifr_data)", uint64(unsafe.Offsetof(ifreqData{}.Data)), nil},
		// AF_XDP (linux/if_xdp.h): the structs raw queues pass are x/sys/unix's.
		{"sizeof(struct xdp_umem_reg)", uint64(unsafe.Sizeof(unix.XDPUmemReg{})), []string{"tx_metadata_len"}},
		{"sizeof(struct xdp_desc)", uint64(unsafe.Sizeof(unix.XDPDesc{})), nil},
		{"sizeof(struct xdp_statistics)", uint64(sizeofXDPStatistics), []string{"tx_ring_empty_descs"}},
		{"sizeof(struct xdp_mmap_offsets)", uint64(unsafe.Sizeof(unix.XDPMmapOffsets{})), nil},
		{"offsetof(struct xdp_ring_offset, flags)", uint64(unsafe.Offsetof(unix.XDPRingOffset{}.Flags)), nil},
		{"sizeof(struct sockaddr_xdp)", uint64(unsafe.Sizeof(unix.RawSockaddrXDP{})), nil},
		{"XDP_UMEM_REG", unix.XDP_UMEM_REG, nil}, {"XDP_MMAP_OFFSETS", unix.XDP_MMAP_OFFSETS, nil},
		{"XDP_STATISTICS", unix.XDP_STATISTICS, nil}, {"XDP_USE_NEED_WAKEUP", unix.XDP_USE_NEED_WAKEUP, nil},
		{"XDP_ZEROCOPY", unix.XDP_ZEROCOPY, nil}, {"XDP_COPY", unix.XDP_COPY, nil},
		{"XDP_RING_NEED_WAKEUP", unix.XDP_RING_NEED_WAKEUP, nil},
		{"XDP_UMEM_PGOFF_FILL_RING", unix.XDP_UMEM_PGOFF_FILL_RING, nil},
		{"XDP_UMEM_PGOFF_COMPLETION_RING", unix.XDP_UMEM_PGOFF_COMPLETION_RING, nil},
		{"XDP_PGOFF_TX_RING", unix.XDP_PGOFF_TX_RING, nil},
		{"NETDEV_XDP_RX_METADATA_TIMESTAMP", xdpRxMetaTimestamp, []string{"NETDEV_XDP_RX_METADATA_TIMESTAMP"}},
		{"NETDEV_XDP_RX_METADATA_HASH", xdpRxMetaHash, []string{"NETDEV_XDP_RX_METADATA_HASH"}},
		{"NETDEV_XDP_RX_METADATA_VLAN_TAG", xdpRxMetaVLANTag, []string{"NETDEV_XDP_RX_METADATA_VLAN_TAG"}},
	}
	return append(out, layout...)
}

// uapiInclude returns the include directory to test against: $ZCNET_UAPI_INCLUDE, the
// newer headers `make uapi-headers` unpacks under build/, or /usr/include.
func uapiInclude() string {
	if d := os.Getenv("ZCNET_UAPI_INCLUDE"); d != "" {
		return d
	}
	if d, _ := filepath.Abs("../build/uapi/usr/include"); d != "" {
		if _, err := os.Stat(filepath.Join(d, "linux", "netdev.h")); err == nil {
			return d
		}
	}
	return "/usr/include"
}

var uapiHeaders = []string{"linux/netdev.h", "linux/ethtool.h", "linux/ethtool_netlink.h",
	"linux/ethtool_netlink_generated.h", "linux/net_tstamp.h", "linux/sockios.h", "linux/genetlink.h", "net/if.h",
	"linux/if_xdp.h"}

// TestUAPIAgainstHeaders compiles a C program against the kernel's uapi headers and
// compares every constant, size and offset this package hard-codes. Identifiers a header
// on this machine does not have yet (Debian 12 ships 6.1 headers: no netdev.h) are listed
// and skipped; with ZCNET_UAPI_STRICT=1 (make uapi-check, with 7.x headers) every one must
// be there.
func TestUAPIAgainstHeaders(t *testing.T) {
	inc := uapiInclude()
	strict := os.Getenv("ZCNET_UAPI_STRICT") == "1"
	var text bytes.Buffer
	var includes []string
	for _, h := range uapiHeaders {
		p := filepath.Join(inc, h)
		if h == "net/if.h" {
			p = "/usr/include/net/if.h"
		}
		b, err := os.ReadFile(p)
		if err != nil {
			if strict && h != "linux/ethtool_netlink_generated.h" {
				t.Fatalf("strict: %v", err)
			}
			t.Logf("no %s in %s", h, inc)
			continue
		}
		text.Write(b)
		includes = append(includes, h)
	}
	present := func(name string) bool {
		return regexp.MustCompile(`\b` + regexp.QuoteMeta(name) + `\b`).Match(text.Bytes())
	}
	checks := map[string]uint64{}
	var missing []uapiCheck
	for _, c := range uapiChecks() {
		ok := true
		for _, n := range c.names {
			ok = ok && present(n)
		}
		if ok {
			checks[c.c] = c.goV
		} else {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		var names []string
		for _, m := range missing {
			names = append(names, m.c)
		}
		if strict {
			t.Fatalf("strict: headers in %s lack %s", inc, strings.Join(names, " "))
		}
		t.Logf("headers in %s lack (not checked): %s", inc, strings.Join(names, " "))
	}
	headers := []string{"sys/socket.h"}
	for _, h := range includes {
		if h == "linux/ethtool_netlink_generated.h" || h == "net/if.h" {
			continue // included by ethtool_netlink.h; net/if.h conflicts with linux/if.h
		}
		headers = append(headers, h)
	}
	var cflags []string
	if inc != "/usr/include" {
		cflags = []string{"-I", inc}
	}
	testutil.CompareWithC(t, append(headers, "linux/if.h"), cflags, checks)
	t.Logf("%d values checked against %s", len(checks), inc)
}
