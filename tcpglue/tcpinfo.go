package tcpglue

import (
	"encoding/binary"
	"strconv"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TCPState is the kernel's TCP state (tcpi_state).
type TCPState uint8

// TCP states, as in the kernel's include/net/tcp_states.h.
const (
	StateEstablished   TCPState = 1
	StateSynSent       TCPState = 2
	StateSynRecv       TCPState = 3
	StateFinWait1      TCPState = 4
	StateFinWait2      TCPState = 5
	StateTimeWait      TCPState = 6
	StateClose         TCPState = 7
	StateCloseWait     TCPState = 8
	StateLastAck       TCPState = 9
	StateListen        TCPState = 10
	StateClosing       TCPState = 11
	StateNewSynRecv    TCPState = 12
	StateBoundInactive TCPState = 13
)

var stateNames = [...]string{"", "ESTABLISHED", "SYN_SENT", "SYN_RECV", "FIN_WAIT1", "FIN_WAIT2",
	"TIME_WAIT", "CLOSE", "CLOSE_WAIT", "LAST_ACK", "LISTEN", "CLOSING", "NEW_SYN_RECV", "BOUND_INACTIVE"}

func (s TCPState) String() string {
	if int(s) < len(stateNames) && s != 0 {
		return stateNames[s]
	}
	return "TCPState(" + strconv.Itoa(int(s)) + ")"
}

// CAState is the congestion avoidance state (tcpi_ca_state).
type CAState uint8

// Congestion avoidance states (enum tcp_ca_state).
const (
	CAOpen     CAState = 0
	CADisorder CAState = 1
	CACWR      CAState = 2
	CARecovery CAState = 3
	CALoss     CAState = 4
)

func (s CAState) String() string {
	switch s {
	case CAOpen:
		return "Open"
	case CADisorder:
		return "Disorder"
	case CACWR:
		return "CWR"
	case CARecovery:
		return "Recovery"
	case CALoss:
		return "Loss"
	}
	return "CAState(" + strconv.Itoa(int(s)) + ")"
}

// Bits of TCPInfo.Options (TCPI_OPT_*).
const (
	OptTimestamps = 1 << 0
	OptSACK       = 1 << 1
	OptWScale     = 1 << 2
	OptECN        = 1 << 3
	OptECNSeen    = 1 << 4
	OptSYNData    = 1 << 5
	OptUsecTS     = 1 << 6
	OptTFOChild   = 1 << 7
)

// TCPInfo is a decoded snapshot of the kernel's struct tcp_info
// (getsockopt TCP_INFO). Times are converted to time.Duration from the
// kernel's microseconds (RTO, ATO, RTT, RTTVar, RcvRTT, MinRTT, BusyTime,
// RwndLimited, SndbufLimited) or milliseconds (LastDataSent, LastAckSent,
// LastDataRecv, LastAckRecv, TotalRTOTime); rates are bytes per second.
//
// Older kernels return a shorter struct: Len is the number of bytes the
// kernel returned, fields beyond it are zero, and Valid reports whether a
// field was present.
type TCPInfo struct {
	Len int // bytes of struct tcp_info the kernel returned

	State                  TCPState
	CAState                CAState
	Retransmits            uint8 // retransmits of the current segment (tcpi_retransmits)
	Probes                 uint8
	Backoff                uint8
	Options                uint8 // Opt* bits
	SndWScale              uint8
	RcvWScale              uint8
	DeliveryRateAppLimited bool
	FastOpenClientFail     uint8

	RTO    time.Duration
	ATO    time.Duration
	SndMSS uint32
	RcvMSS uint32

	Unacked uint32
	Sacked  uint32
	Lost    uint32
	Retrans uint32
	Fackets uint32

	LastDataSent time.Duration
	LastAckSent  time.Duration
	LastDataRecv time.Duration
	LastAckRecv  time.Duration

	PMTU        uint32
	RcvSSThresh uint32
	RTT         time.Duration
	RTTVar      time.Duration
	SndSSThresh uint32
	SndCwnd     uint32 // congestion window in segments
	AdvMSS      uint32
	Reordering  uint32

	RcvRTT   time.Duration
	RcvSpace uint32

	TotalRetrans uint32 // segments retransmitted over the connection's life

	PacingRate    uint64
	MaxPacingRate uint64
	BytesAcked    uint64
	BytesReceived uint64
	SegsOut       uint32
	SegsIn        uint32

	NotsentBytes uint32
	MinRTT       time.Duration
	DataSegsIn   uint32
	DataSegsOut  uint32

	DeliveryRate uint64

	BusyTime      time.Duration
	RwndLimited   time.Duration
	SndbufLimited time.Duration

	Delivered   uint32
	DeliveredCE uint32

	BytesSent    uint64
	BytesRetrans uint64
	DSACKDups    uint32
	ReordSeen    uint32

	RcvOOOPack uint32
	SndWnd     uint32
	RcvWnd     uint32
	Rehash     uint32

	TotalRTO           uint16
	TotalRTORecoveries uint16
	TotalRTOTime       time.Duration

	ReceivedCE       uint32
	DeliveredE1Bytes uint32
	DeliveredE0Bytes uint32
	DeliveredCEBytes uint32
	ReceivedE1Bytes  uint32
	ReceivedE0Bytes  uint32
	ReceivedCEBytes  uint32
}

// infoField describes one field of struct tcp_info: its C name, its offset
// and size in bytes, and how it lands in TCPInfo. This table is the single
// Go description of the layout; tests check it against <linux/tcp.h> (with
// gcc) and against golang.org/x/sys/unix.TCPInfo.
type infoField struct {
	c    string // C member name; bitfields share their byte
	goN  string // TCPInfo field name
	off  int
	size int // 1, 2, 4 or 8
	bits bool
	set  func(t *TCPInfo, v uint64)
}

func us(v uint64) time.Duration { return time.Duration(v) * time.Microsecond }
func ms(v uint64) time.Duration { return time.Duration(v) * time.Millisecond }

var infoFields = []infoField{
	{"tcpi_state", "State", 0, 1, false, func(t *TCPInfo, v uint64) { t.State = TCPState(v) }},
	{"tcpi_ca_state", "CAState", 1, 1, false, func(t *TCPInfo, v uint64) { t.CAState = CAState(v) }},
	{"tcpi_retransmits", "Retransmits", 2, 1, false, func(t *TCPInfo, v uint64) { t.Retransmits = uint8(v) }},
	{"tcpi_probes", "Probes", 3, 1, false, func(t *TCPInfo, v uint64) { t.Probes = uint8(v) }},
	{"tcpi_backoff", "Backoff", 4, 1, false, func(t *TCPInfo, v uint64) { t.Backoff = uint8(v) }},
	{"tcpi_options", "Options", 5, 1, false, func(t *TCPInfo, v uint64) { t.Options = uint8(v) }},
	{"tcpi_snd_wscale", "SndWScale", 6, 1, true, func(t *TCPInfo, v uint64) { t.SndWScale = uint8(v & 0xf) }},
	{"tcpi_rcv_wscale", "RcvWScale", 6, 1, true, func(t *TCPInfo, v uint64) { t.RcvWScale = uint8(v >> 4 & 0xf) }},
	{"tcpi_delivery_rate_app_limited", "DeliveryRateAppLimited", 7, 1, true, func(t *TCPInfo, v uint64) { t.DeliveryRateAppLimited = v&1 != 0 }},
	{"tcpi_fastopen_client_fail", "FastOpenClientFail", 7, 1, true, func(t *TCPInfo, v uint64) { t.FastOpenClientFail = uint8(v >> 1 & 3) }},

	{"tcpi_rto", "RTO", 8, 4, false, func(t *TCPInfo, v uint64) { t.RTO = us(v) }},
	{"tcpi_ato", "ATO", 12, 4, false, func(t *TCPInfo, v uint64) { t.ATO = us(v) }},
	{"tcpi_snd_mss", "SndMSS", 16, 4, false, func(t *TCPInfo, v uint64) { t.SndMSS = uint32(v) }},
	{"tcpi_rcv_mss", "RcvMSS", 20, 4, false, func(t *TCPInfo, v uint64) { t.RcvMSS = uint32(v) }},

	{"tcpi_unacked", "Unacked", 24, 4, false, func(t *TCPInfo, v uint64) { t.Unacked = uint32(v) }},
	{"tcpi_sacked", "Sacked", 28, 4, false, func(t *TCPInfo, v uint64) { t.Sacked = uint32(v) }},
	{"tcpi_lost", "Lost", 32, 4, false, func(t *TCPInfo, v uint64) { t.Lost = uint32(v) }},
	{"tcpi_retrans", "Retrans", 36, 4, false, func(t *TCPInfo, v uint64) { t.Retrans = uint32(v) }},
	{"tcpi_fackets", "Fackets", 40, 4, false, func(t *TCPInfo, v uint64) { t.Fackets = uint32(v) }},

	{"tcpi_last_data_sent", "LastDataSent", 44, 4, false, func(t *TCPInfo, v uint64) { t.LastDataSent = ms(v) }},
	{"tcpi_last_ack_sent", "LastAckSent", 48, 4, false, func(t *TCPInfo, v uint64) { t.LastAckSent = ms(v) }},
	{"tcpi_last_data_recv", "LastDataRecv", 52, 4, false, func(t *TCPInfo, v uint64) { t.LastDataRecv = ms(v) }},
	{"tcpi_last_ack_recv", "LastAckRecv", 56, 4, false, func(t *TCPInfo, v uint64) { t.LastAckRecv = ms(v) }},

	{"tcpi_pmtu", "PMTU", 60, 4, false, func(t *TCPInfo, v uint64) { t.PMTU = uint32(v) }},
	{"tcpi_rcv_ssthresh", "RcvSSThresh", 64, 4, false, func(t *TCPInfo, v uint64) { t.RcvSSThresh = uint32(v) }},
	{"tcpi_rtt", "RTT", 68, 4, false, func(t *TCPInfo, v uint64) { t.RTT = us(v) }},
	{"tcpi_rttvar", "RTTVar", 72, 4, false, func(t *TCPInfo, v uint64) { t.RTTVar = us(v) }},
	{"tcpi_snd_ssthresh", "SndSSThresh", 76, 4, false, func(t *TCPInfo, v uint64) { t.SndSSThresh = uint32(v) }},
	{"tcpi_snd_cwnd", "SndCwnd", 80, 4, false, func(t *TCPInfo, v uint64) { t.SndCwnd = uint32(v) }},
	{"tcpi_advmss", "AdvMSS", 84, 4, false, func(t *TCPInfo, v uint64) { t.AdvMSS = uint32(v) }},
	{"tcpi_reordering", "Reordering", 88, 4, false, func(t *TCPInfo, v uint64) { t.Reordering = uint32(v) }},

	{"tcpi_rcv_rtt", "RcvRTT", 92, 4, false, func(t *TCPInfo, v uint64) { t.RcvRTT = us(v) }},
	{"tcpi_rcv_space", "RcvSpace", 96, 4, false, func(t *TCPInfo, v uint64) { t.RcvSpace = uint32(v) }},
	{"tcpi_total_retrans", "TotalRetrans", 100, 4, false, func(t *TCPInfo, v uint64) { t.TotalRetrans = uint32(v) }},

	{"tcpi_pacing_rate", "PacingRate", 104, 8, false, func(t *TCPInfo, v uint64) { t.PacingRate = v }},
	{"tcpi_max_pacing_rate", "MaxPacingRate", 112, 8, false, func(t *TCPInfo, v uint64) { t.MaxPacingRate = v }},
	{"tcpi_bytes_acked", "BytesAcked", 120, 8, false, func(t *TCPInfo, v uint64) { t.BytesAcked = v }},
	{"tcpi_bytes_received", "BytesReceived", 128, 8, false, func(t *TCPInfo, v uint64) { t.BytesReceived = v }},
	{"tcpi_segs_out", "SegsOut", 136, 4, false, func(t *TCPInfo, v uint64) { t.SegsOut = uint32(v) }},
	{"tcpi_segs_in", "SegsIn", 140, 4, false, func(t *TCPInfo, v uint64) { t.SegsIn = uint32(v) }},

	{"tcpi_notsent_bytes", "NotsentBytes", 144, 4, false, func(t *TCPInfo, v uint64) { t.NotsentBytes = uint32(v) }},
	{"tcpi_min_rtt", "MinRTT", 148, 4, false, func(t *TCPInfo, v uint64) { t.MinRTT = us(v) }},
	{"tcpi_data_segs_in", "DataSegsIn", 152, 4, false, func(t *TCPInfo, v uint64) { t.DataSegsIn = uint32(v) }},
	{"tcpi_data_segs_out", "DataSegsOut", 156, 4, false, func(t *TCPInfo, v uint64) { t.DataSegsOut = uint32(v) }},

	{"tcpi_delivery_rate", "DeliveryRate", 160, 8, false, func(t *TCPInfo, v uint64) { t.DeliveryRate = v }},

	{"tcpi_busy_time", "BusyTime", 168, 8, false, func(t *TCPInfo, v uint64) { t.BusyTime = us(v) }},
	{"tcpi_rwnd_limited", "RwndLimited", 176, 8, false, func(t *TCPInfo, v uint64) { t.RwndLimited = us(v) }},
	{"tcpi_sndbuf_limited", "SndbufLimited", 184, 8, false, func(t *TCPInfo, v uint64) { t.SndbufLimited = us(v) }},

	{"tcpi_delivered", "Delivered", 192, 4, false, func(t *TCPInfo, v uint64) { t.Delivered = uint32(v) }},
	{"tcpi_delivered_ce", "DeliveredCE", 196, 4, false, func(t *TCPInfo, v uint64) { t.DeliveredCE = uint32(v) }},

	{"tcpi_bytes_sent", "BytesSent", 200, 8, false, func(t *TCPInfo, v uint64) { t.BytesSent = v }},
	{"tcpi_bytes_retrans", "BytesRetrans", 208, 8, false, func(t *TCPInfo, v uint64) { t.BytesRetrans = v }},
	{"tcpi_dsack_dups", "DSACKDups", 216, 4, false, func(t *TCPInfo, v uint64) { t.DSACKDups = uint32(v) }},
	{"tcpi_reord_seen", "ReordSeen", 220, 4, false, func(t *TCPInfo, v uint64) { t.ReordSeen = uint32(v) }},

	{"tcpi_rcv_ooopack", "RcvOOOPack", 224, 4, false, func(t *TCPInfo, v uint64) { t.RcvOOOPack = uint32(v) }},
	{"tcpi_snd_wnd", "SndWnd", 228, 4, false, func(t *TCPInfo, v uint64) { t.SndWnd = uint32(v) }},
	{"tcpi_rcv_wnd", "RcvWnd", 232, 4, false, func(t *TCPInfo, v uint64) { t.RcvWnd = uint32(v) }},
	{"tcpi_rehash", "Rehash", 236, 4, false, func(t *TCPInfo, v uint64) { t.Rehash = uint32(v) }},

	{"tcpi_total_rto", "TotalRTO", 240, 2, false, func(t *TCPInfo, v uint64) { t.TotalRTO = uint16(v) }},
	{"tcpi_total_rto_recoveries", "TotalRTORecoveries", 242, 2, false, func(t *TCPInfo, v uint64) { t.TotalRTORecoveries = uint16(v) }},
	{"tcpi_total_rto_time", "TotalRTOTime", 244, 4, false, func(t *TCPInfo, v uint64) { t.TotalRTOTime = ms(v) }},

	{"tcpi_received_ce", "ReceivedCE", 248, 4, false, func(t *TCPInfo, v uint64) { t.ReceivedCE = uint32(v) }},
	{"tcpi_delivered_e1_bytes", "DeliveredE1Bytes", 252, 4, false, func(t *TCPInfo, v uint64) { t.DeliveredE1Bytes = uint32(v) }},
	{"tcpi_delivered_e0_bytes", "DeliveredE0Bytes", 256, 4, false, func(t *TCPInfo, v uint64) { t.DeliveredE0Bytes = uint32(v) }},
	{"tcpi_delivered_ce_bytes", "DeliveredCEBytes", 260, 4, false, func(t *TCPInfo, v uint64) { t.DeliveredCEBytes = uint32(v) }},
	{"tcpi_received_e1_bytes", "ReceivedE1Bytes", 264, 4, false, func(t *TCPInfo, v uint64) { t.ReceivedE1Bytes = uint32(v) }},
	{"tcpi_received_e0_bytes", "ReceivedE0Bytes", 268, 4, false, func(t *TCPInfo, v uint64) { t.ReceivedE0Bytes = uint32(v) }},
	{"tcpi_received_ce_bytes", "ReceivedCEBytes", 272, 4, false, func(t *TCPInfo, v uint64) { t.ReceivedCEBytes = uint32(v) }},
}

// tcpInfoMax is the size of the largest struct tcp_info this package knows
// (the last field's end, rounded up to 8 as the C struct is). Kernels newer
// than the table may return more; the excess is ignored.
const tcpInfoMax = 280

// ParseTCPInfo decodes a struct tcp_info of any length as returned by
// getsockopt(TCP_INFO). Fields that do not fit entirely in b are left zero and
// reported invalid by Valid. It never fails on short or long input; an empty
// b gives a zero TCPInfo with Len 0.
func ParseTCPInfo(b []byte) TCPInfo {
	t := TCPInfo{Len: len(b)}
	for i := range infoFields {
		f := &infoFields[i]
		if f.off+f.size > len(b) {
			continue
		}
		var v uint64
		switch f.size {
		case 1:
			v = uint64(b[f.off])
		case 2:
			v = uint64(binary.NativeEndian.Uint16(b[f.off:]))
		case 4:
			v = uint64(binary.NativeEndian.Uint32(b[f.off:]))
		case 8:
			v = binary.NativeEndian.Uint64(b[f.off:])
		}
		f.set(&t, v)
	}
	return t
}

// Valid reports whether the named TCPInfo field (its Go name, e.g. "RTT",
// "BytesRetrans", "RcvWnd") was present in what the kernel returned. Unknown
// names and Len are reported false.
func (t *TCPInfo) Valid(field string) bool {
	for i := range infoFields {
		if infoFields[i].goN == field {
			return infoFields[i].off+infoFields[i].size <= t.Len
		}
	}
	return false
}

// ValidFields lists the Go names of the fields present in this snapshot.
func (t *TCPInfo) ValidFields() []string {
	var names []string
	for i := range infoFields {
		if infoFields[i].off+infoFields[i].size <= t.Len {
			names = append(names, infoFields[i].goN)
		}
	}
	return names
}

// TCPInfo takes a TCP_INFO snapshot of the connection.
func (s *Socket) TCPInfo() (TCPInfo, error) {
	const op = "getsockopt TCP_INFO"
	fd, err := s.incref(op)
	if err != nil {
		return TCPInfo{}, err
	}
	defer s.decref()
	var buf [tcpInfoMax]byte
	l := uint32(len(buf))
	if err := getsockopt(fd, unix.IPPROTO_TCP, unix.TCP_INFO, unsafe.Pointer(&buf[0]), &l); err != nil {
		return TCPInfo{}, opErr(op, fd, nil, sysErr("getsockopt", err))
	}
	return ParseTCPInfo(buf[:min(int(l), len(buf))]), nil
}
