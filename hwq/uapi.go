package hwq

// Kernel ABI numbers used by this package. Each block cites the uapi header it comes from;
// uapi_test.go compiles a C program against those headers and compares every value
// (against /usr/include, or the newer headers `make uapi-headers` unpacks under build/).

// include/uapi/linux/netdev.h (generated from Documentation/netlink/specs/netdev.yaml).
const (
	netdevFamilyName = "netdev"

	netdevCmdDevGet   = 1  // NETDEV_CMD_DEV_GET (Linux 6.3)
	netdevCmdQueueGet = 10 // NETDEV_CMD_QUEUE_GET (Linux 6.9)
	netdevCmdNapiGet  = 11 // NETDEV_CMD_NAPI_GET (Linux 6.9)

	netdevADevIfindex             = 1 // NETDEV_A_DEV_IFINDEX u32
	netdevADevXDPFeatures         = 3 // NETDEV_A_DEV_XDP_FEATURES u64
	netdevADevXDPZCMaxSegs        = 4 // NETDEV_A_DEV_XDP_ZC_MAX_SEGS u32
	netdevADevXDPRxMetadataFeatus = 5 // NETDEV_A_DEV_XDP_RX_METADATA_FEATURES u64
	netdevADevXSKFeatures         = 6 // NETDEV_A_DEV_XSK_FEATURES u64

	netdevANapiIfindex           = 1 // NETDEV_A_NAPI_IFINDEX u32
	netdevANapiID                = 2 // NETDEV_A_NAPI_ID u32
	netdevANapiIRQ               = 3 // NETDEV_A_NAPI_IRQ u32
	netdevANapiPID               = 4 // NETDEV_A_NAPI_PID u32
	netdevANapiDeferHardIRQs     = 5 // NETDEV_A_NAPI_DEFER_HARD_IRQS u32
	netdevANapiGROFlushTimeout   = 6 // NETDEV_A_NAPI_GRO_FLUSH_TIMEOUT uint (ns)
	netdevANapiIRQSuspendTimeout = 7 // NETDEV_A_NAPI_IRQ_SUSPEND_TIMEOUT uint (ns)
	netdevANapiThreaded          = 8 // NETDEV_A_NAPI_THREADED u32 (enum netdev_napi_threaded)

	netdevAQueueID      = 1 // NETDEV_A_QUEUE_ID u32
	netdevAQueueIfindex = 2 // NETDEV_A_QUEUE_IFINDEX u32
	netdevAQueueType    = 3 // NETDEV_A_QUEUE_TYPE u32 (enum netdev_queue_type)
	netdevAQueueNapiID  = 4 // NETDEV_A_QUEUE_NAPI_ID u32
	netdevAQueueDMABuf  = 5 // NETDEV_A_QUEUE_DMABUF u32
	netdevAQueueIOUring = 6 // NETDEV_A_QUEUE_IO_URING nest
	netdevAQueueXSK     = 7 // NETDEV_A_QUEUE_XSK nest

	netdevQueueTypeRX = 0 // NETDEV_QUEUE_TYPE_RX
	netdevQueueTypeTX = 1 // NETDEV_QUEUE_TYPE_TX
)

// XDP feature bits, enum netdev_xdp_act in include/uapi/linux/netdev.h.
const (
	XDPBasic        XDPFeatures = 1 << 0 // NETDEV_XDP_ACT_BASIC
	XDPRedirect     XDPFeatures = 1 << 1 // NETDEV_XDP_ACT_REDIRECT
	XDPNdoXmit      XDPFeatures = 1 << 2 // NETDEV_XDP_ACT_NDO_XMIT
	XDPXSKZeroCopy  XDPFeatures = 1 << 3 // NETDEV_XDP_ACT_XSK_ZEROCOPY
	XDPHWOffload    XDPFeatures = 1 << 4 // NETDEV_XDP_ACT_HW_OFFLOAD
	XDPRxSG         XDPFeatures = 1 << 5 // NETDEV_XDP_ACT_RX_SG
	XDPNdoXmitSG    XDPFeatures = 1 << 6 // NETDEV_XDP_ACT_NDO_XMIT_SG
	xdpFeaturesMask XDPFeatures = 127    // NETDEV_XDP_ACT_MASK
)

// include/uapi/linux/ethtool_netlink_generated.h (Linux 6.14+; before that the same
// numbers were in ethtool_netlink.h), generated from Documentation/netlink/specs/ethtool.yaml.
const (
	ethtoolFamilyName = "ethtool"

	// Requests (ETHTOOL_MSG_*, user to kernel).
	ethtoolMsgFeaturesGet  = 11 // ETHTOOL_MSG_FEATURES_GET
	ethtoolMsgFeaturesSet  = 12 // ETHTOOL_MSG_FEATURES_SET
	ethtoolMsgRingsGet     = 15 // ETHTOOL_MSG_RINGS_GET
	ethtoolMsgRingsSet     = 16 // ETHTOOL_MSG_RINGS_SET
	ethtoolMsgChannelsGet  = 17 // ETHTOOL_MSG_CHANNELS_GET
	ethtoolMsgChannelsSet  = 18 // ETHTOOL_MSG_CHANNELS_SET
	ethtoolMsgTSInfoGet    = 25 // ETHTOOL_MSG_TSINFO_GET
	ethtoolMsgRSSGet       = 38 // ETHTOOL_MSG_RSS_GET (Linux 6.0)
	ethtoolMsgRSSSet       = 48 // ETHTOOL_MSG_RSS_SET (Linux 6.17)
	ethtoolMsgRSSCreateAct = 49 // ETHTOOL_MSG_RSS_CREATE_ACT (Linux 6.17)
	ethtoolMsgRSSDeleteAct = 50 // ETHTOOL_MSG_RSS_DELETE_ACT (Linux 6.17)

	// Replies (ETHTOOL_MSG_*_REPLY, kernel to user).
	ethtoolMsgFeaturesGetReply  = 11 // ETHTOOL_MSG_FEATURES_GET_REPLY
	ethtoolMsgRingsGetReply     = 16 // ETHTOOL_MSG_RINGS_GET_REPLY
	ethtoolMsgChannelsGetReply  = 18 // ETHTOOL_MSG_CHANNELS_GET_REPLY
	ethtoolMsgTSInfoGetReply    = 26 // ETHTOOL_MSG_TSINFO_GET_REPLY
	ethtoolMsgRSSGetReply       = 38 // ETHTOOL_MSG_RSS_GET_REPLY
	ethtoolMsgRSSCreateActReply = 51 // ETHTOOL_MSG_RSS_CREATE_ACT_REPLY

	// Request header (every message's attribute 1).
	ethtoolAHeader          = 1 // ETHTOOL_A_*_HEADER
	ethtoolAHeaderDevIndex  = 1 // ETHTOOL_A_HEADER_DEV_INDEX u32
	ethtoolAHeaderDevName   = 2 // ETHTOOL_A_HEADER_DEV_NAME string
	ethtoolAHeaderFlags     = 3 // ETHTOOL_A_HEADER_FLAGS u32
	ethtoolFlagCompactBits  = 1 // ETHTOOL_FLAG_COMPACT_BITSETS
	ethtoolFlagOmitReply    = 2 // ETHTOOL_FLAG_OMIT_REPLY
	ethtoolABitsetNomask    = 1 // ETHTOOL_A_BITSET_NOMASK flag
	ethtoolABitsetSize      = 2 // ETHTOOL_A_BITSET_SIZE u32
	ethtoolABitsetBits      = 3 // ETHTOOL_A_BITSET_BITS nest
	ethtoolABitsetValue     = 4 // ETHTOOL_A_BITSET_VALUE binary
	ethtoolABitsetMask      = 5 // ETHTOOL_A_BITSET_MASK binary
	ethtoolABitsetBitsBit   = 1 // ETHTOOL_A_BITSET_BITS_BIT nest
	ethtoolABitsetBitIndex  = 1 // ETHTOOL_A_BITSET_BIT_INDEX u32
	ethtoolABitsetBitName   = 2 // ETHTOOL_A_BITSET_BIT_NAME string
	ethtoolABitsetBitValue  = 3 // ETHTOOL_A_BITSET_BIT_VALUE flag
	ethtoolAFeaturesHW      = 2 // ETHTOOL_A_FEATURES_HW bitset
	ethtoolAFeaturesWanted  = 3 // ETHTOOL_A_FEATURES_WANTED bitset
	ethtoolAFeaturesActive  = 4 // ETHTOOL_A_FEATURES_ACTIVE bitset
	ethtoolAFeaturesNochang = 5 // ETHTOOL_A_FEATURES_NOCHANGE bitset

	ethtoolAChannelsRXMax         = 2 // ETHTOOL_A_CHANNELS_RX_MAX u32
	ethtoolAChannelsTXMax         = 3 // ETHTOOL_A_CHANNELS_TX_MAX u32
	ethtoolAChannelsOtherMax      = 4 // ETHTOOL_A_CHANNELS_OTHER_MAX u32
	ethtoolAChannelsCombinedMax   = 5 // ETHTOOL_A_CHANNELS_COMBINED_MAX u32
	ethtoolAChannelsRXCount       = 6 // ETHTOOL_A_CHANNELS_RX_COUNT u32
	ethtoolAChannelsTXCount       = 7 // ETHTOOL_A_CHANNELS_TX_COUNT u32
	ethtoolAChannelsOtherCount    = 8 // ETHTOOL_A_CHANNELS_OTHER_COUNT u32
	ethtoolAChannelsCombinedCount = 9 // ETHTOOL_A_CHANNELS_COMBINED_COUNT u32

	ethtoolARingsRXMax           = 2  // ETHTOOL_A_RINGS_RX_MAX u32
	ethtoolARingsRXMiniMax       = 3  // ETHTOOL_A_RINGS_RX_MINI_MAX u32
	ethtoolARingsRXJumboMax      = 4  // ETHTOOL_A_RINGS_RX_JUMBO_MAX u32
	ethtoolARingsTXMax           = 5  // ETHTOOL_A_RINGS_TX_MAX u32
	ethtoolARingsRX              = 6  // ETHTOOL_A_RINGS_RX u32
	ethtoolARingsRXMini          = 7  // ETHTOOL_A_RINGS_RX_MINI u32
	ethtoolARingsRXJumbo         = 8  // ETHTOOL_A_RINGS_RX_JUMBO u32
	ethtoolARingsTX              = 9  // ETHTOOL_A_RINGS_TX u32
	ethtoolARingsRXBufLen        = 10 // ETHTOOL_A_RINGS_RX_BUF_LEN u32
	ethtoolARingsTCPDataSplit    = 11 // ETHTOOL_A_RINGS_TCP_DATA_SPLIT u8 (Linux 6.0)
	ethtoolARingsCQESize         = 12 // ETHTOOL_A_RINGS_CQE_SIZE u32
	ethtoolARingsTXPush          = 13 // ETHTOOL_A_RINGS_TX_PUSH u8
	ethtoolARingsRXPush          = 14 // ETHTOOL_A_RINGS_RX_PUSH u8
	ethtoolARingsTXPushBufLen    = 15 // ETHTOOL_A_RINGS_TX_PUSH_BUF_LEN u32
	ethtoolARingsTXPushBufLenMax = 16 // ETHTOOL_A_RINGS_TX_PUSH_BUF_LEN_MAX u32
	ethtoolARingsHDSThresh       = 17 // ETHTOOL_A_RINGS_HDS_THRESH u32 (Linux 6.14)
	ethtoolARingsHDSThreshMax    = 18 // ETHTOOL_A_RINGS_HDS_THRESH_MAX u32 (Linux 6.14)

	// enum ethtool_tcp_data_split.
	tcpDataSplitUnknown  = 0 // ETHTOOL_TCP_DATA_SPLIT_UNKNOWN
	tcpDataSplitDisabled = 1 // ETHTOOL_TCP_DATA_SPLIT_DISABLED
	tcpDataSplitEnabled  = 2 // ETHTOOL_TCP_DATA_SPLIT_ENABLED

	ethtoolATSInfoTimestamping = 2 // ETHTOOL_A_TSINFO_TIMESTAMPING bitset
	ethtoolATSInfoTXTypes      = 3 // ETHTOOL_A_TSINFO_TX_TYPES bitset
	ethtoolATSInfoRXFilters    = 4 // ETHTOOL_A_TSINFO_RX_FILTERS bitset
	ethtoolATSInfoPHCIndex     = 5 // ETHTOOL_A_TSINFO_PHC_INDEX u32

	ethtoolARSSContext      = 2 // ETHTOOL_A_RSS_CONTEXT u32
	ethtoolARSSHFunc        = 3 // ETHTOOL_A_RSS_HFUNC u32
	ethtoolARSSIndir        = 4 // ETHTOOL_A_RSS_INDIR binary (u32 array)
	ethtoolARSSHKey         = 5 // ETHTOOL_A_RSS_HKEY binary
	ethtoolARSSInputXfrm    = 6 // ETHTOOL_A_RSS_INPUT_XFRM u32
	ethtoolARSSStartContext = 7 // ETHTOOL_A_RSS_START_CONTEXT u32
)

// include/uapi/linux/net_tstamp.h: enum SOF_TIMESTAMPING_* (bits of TSInfo.Timestamping).
const (
	TimestampingTXHardware  = 1 << 0 // SOF_TIMESTAMPING_TX_HARDWARE
	TimestampingTXSoftware  = 1 << 1 // SOF_TIMESTAMPING_TX_SOFTWARE
	TimestampingRXHardware  = 1 << 2 // SOF_TIMESTAMPING_RX_HARDWARE
	TimestampingRXSoftware  = 1 << 3 // SOF_TIMESTAMPING_RX_SOFTWARE
	TimestampingSoftware    = 1 << 4 // SOF_TIMESTAMPING_SOFTWARE
	TimestampingRawHardware = 1 << 6 // SOF_TIMESTAMPING_RAW_HARDWARE
)

// include/uapi/linux/ethtool.h: the SIOCETHTOOL ioctl commands and flow types the ntuple
// and RSS-context paths use (ethtool netlink has no ntuple command yet).
const (
	siocEthtool = 0x8946 // SIOCETHTOOL, include/uapi/linux/sockios.h

	ethtoolGRXRings     = 0x2d       // ETHTOOL_GRXRINGS
	ethtoolGRXClsRlCnt  = 0x2e       // ETHTOOL_GRXCLSRLCNT
	ethtoolGRXClsRule   = 0x2f       // ETHTOOL_GRXCLSRULE
	ethtoolGRXClsRlAll  = 0x30       // ETHTOOL_GRXCLSRLALL
	ethtoolSRXClsRlDel  = 0x31       // ETHTOOL_SRXCLSRLDEL
	ethtoolSRXClsRlIns  = 0x32       // ETHTOOL_SRXCLSRLINS
	ethtoolGRSSH        = 0x46       // ETHTOOL_GRSSH
	ethtoolSRSSH        = 0x47       // ETHTOOL_SRSSH
	ethRXFHContextAlloc = 0xffffffff // ETH_RXFH_CONTEXT_ALLOC
	ethRXFHIndirNoChg   = 0xffffffff // ETH_RXFH_INDIR_NO_CHANGE

	tcpV4Flow       = 0x01       // TCP_V4_FLOW
	tcpV6Flow       = 0x05       // TCP_V6_FLOW
	flowExt         = 0x80000000 // FLOW_EXT
	flowMacExt      = 0x40000000 // FLOW_MAC_EXT
	flowRSS         = 0x20000000 // FLOW_RSS
	rxClsLocSpecial = 0x80000000 // RX_CLS_LOC_SPECIAL
	rxClsLocAny     = 0xffffffff // RX_CLS_LOC_ANY
	rxClsLocFirst   = 0xfffffffe // RX_CLS_LOC_FIRST
	rxClsLocLast    = 0xfffffffd // RX_CLS_LOC_LAST
)
