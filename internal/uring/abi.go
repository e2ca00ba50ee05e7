package uring

// Constants and structures of the io_uring ABI, from include/uapi/linux/io_uring.h as of
// Linux 6.18. Everything that also exists in Linux 6.1's header is checked against the system
// header by TestABIAgainstSystemHeader (sizes, offsets and values); newer values are exercised by
// the behaviour tests.

// Setup flags (io_uring_params.flags).
const (
	SetupIOPoll           = 1 << 0
	SetupSQPoll           = 1 << 1
	SetupSQAff            = 1 << 2
	SetupCQSize           = 1 << 3
	SetupClamp            = 1 << 4
	SetupAttachWQ         = 1 << 5
	SetupRDisabled        = 1 << 6
	SetupSubmitAll        = 1 << 7
	SetupCoopTaskrun      = 1 << 8
	SetupTaskrunFlag      = 1 << 9
	SetupSQE128           = 1 << 10
	SetupCQE32            = 1 << 11
	SetupSingleIssuer     = 1 << 12
	SetupDeferTaskrun     = 1 << 13
	SetupNoMmap           = 1 << 14
	SetupRegisteredFdOnly = 1 << 15
	SetupNoSQArray        = 1 << 16
)

// Opcodes (enum io_uring_op).
const (
	OpNop            = 0
	OpReadv          = 1
	OpWritev         = 2
	OpFsync          = 3
	OpReadFixed      = 4
	OpWriteFixed     = 5
	OpPollAdd        = 6
	OpPollRemove     = 7
	OpSyncFileRange  = 8
	OpSendmsg        = 9
	OpRecvmsg        = 10
	OpTimeout        = 11
	OpTimeoutRemove  = 12
	OpAccept         = 13
	OpAsyncCancel    = 14
	OpLinkTimeout    = 15
	OpConnect        = 16
	OpFallocate      = 17
	OpOpenat         = 18
	OpClose          = 19
	OpFilesUpdate    = 20
	OpStatx          = 21
	OpRead           = 22
	OpWrite          = 23
	OpFadvise        = 24
	OpMadvise        = 25
	OpSend           = 26
	OpRecv           = 27
	OpOpenat2        = 28
	OpEpollCtl       = 29
	OpSplice         = 30
	OpProvideBuffers = 31
	OpRemoveBuffers  = 32
	OpTee            = 33
	OpShutdown       = 34
	OpRenameat       = 35
	OpUnlinkat       = 36
	OpMkdirat        = 37
	OpSymlinkat      = 38
	OpLinkat         = 39
	OpMsgRing        = 40
	OpFsetxattr      = 41
	OpSetxattr       = 42
	OpFgetxattr      = 43
	OpGetxattr       = 44
	OpSocket         = 45
	OpUringCmd       = 46
	OpSendZC         = 47
	OpSendmsgZC      = 48
	OpReadMultishot  = 49
	OpWaitid         = 50
	OpFutexWait      = 51
	OpFutexWake      = 52
	OpFutexWaitv     = 53
	OpFixedFdInstall = 54
	OpFtruncate      = 55
	OpBind           = 56
	OpListen         = 57
	OpRecvZC         = 58
	OpEpollWait      = 59
	OpReadvFixed     = 60
	OpWritevFixed    = 61
	OpPipe           = 62
)

// SQE flags (io_uring_sqe.flags).
const (
	SQEFixedFile      = 1 << 0
	SQEIODrain        = 1 << 1
	SQEIOLink         = 1 << 2
	SQEIOHardlink     = 1 << 3
	SQEAsync          = 1 << 4
	SQEBufferSelect   = 1 << 5
	SQECQESkipSuccess = 1 << 6
)

// Send/recv flags, carried in io_uring_sqe.ioprio.
const (
	RecvsendPollFirst = 1 << 0
	RecvMultishot     = 1 << 1
	RecvsendFixedBuf  = 1 << 2
	SendZCReportUsage = 1 << 3
	RecvsendBundle    = 1 << 4
)

// NotifUsageZCCopied is set in a SEND_ZC notification's res when SendZCReportUsage was asked
// for and the kernel copied the data instead of sending the pages (always the case for
// loopback and veth destinations).
const NotifUsageZCCopied = 1 << 31

// Accept flags, carried in io_uring_sqe.ioprio.
const (
	AcceptMultishot = 1 << 0
	AcceptDontwait  = 1 << 1
	AcceptPollFirst = 1 << 2
)

// Timeout flags (io_uring_sqe.timeout_flags).
const (
	TimeoutAbs          = 1 << 0
	TimeoutUpdate       = 1 << 1
	TimeoutBoottime     = 1 << 2
	TimeoutRealtime     = 1 << 3
	LinkTimeoutUpdate   = 1 << 4
	TimeoutETimeSuccess = 1 << 5
	TimeoutMultishot    = 1 << 6
)

// Cancel flags (io_uring_sqe.cancel_flags).
const (
	CancelAll      = 1 << 0
	CancelFd       = 1 << 1
	CancelAny      = 1 << 2
	CancelFdFixed  = 1 << 3
	CancelUserdata = 1 << 4
	CancelOp       = 1 << 5
)

// MSG_RING commands (io_uring_sqe.addr) and flags (io_uring_sqe.msg_ring_flags).
const (
	MsgData          = 0
	MsgSendFd        = 1
	MsgRingCQESkip   = 1 << 0
	MsgRingFlagsPass = 1 << 1
)

// CQE flags (io_uring_cqe.flags).
const (
	CQEFBuffer       = 1 << 0
	CQEFMore         = 1 << 1
	CQEFSockNonempty = 1 << 2
	CQEFNotif        = 1 << 3
	CQEFBufMore      = 1 << 4
	CQEBufferShift   = 16
)

// io_uring_enter flags.
const (
	EnterGetevents      = 1 << 0
	EnterSQWakeup       = 1 << 1
	EnterSQWait         = 1 << 2
	EnterExtArg         = 1 << 3
	EnterRegisteredRing = 1 << 4
)

// SQ ring flags (written by the kernel).
const (
	SQNeedWakeup = 1 << 0
	SQCQOverflow = 1 << 1
	SQTaskrun    = 1 << 2
)

// CQ ring flags.
const CQEventfdDisabled = 1 << 0

// Features (io_uring_params.features).
const (
	FeatSingleMmap     = 1 << 0
	FeatNodrop         = 1 << 1
	FeatSubmitStable   = 1 << 2
	FeatRWCurPos       = 1 << 3
	FeatCurPersonality = 1 << 4
	FeatFastPoll       = 1 << 5
	FeatPoll32Bits     = 1 << 6
	FeatSQPollNonfixed = 1 << 7
	FeatExtArg         = 1 << 8
	FeatNativeWorkers  = 1 << 9
	FeatRsrcTags       = 1 << 10
	FeatCQESkip        = 1 << 11
	FeatLinkedFile     = 1 << 12
	FeatRegRegRing     = 1 << 13
	FeatRecvsendBundle = 1 << 14
	FeatMinTimeout     = 1 << 15
	FeatRWAttr         = 1 << 16
	FeatNoIOWait       = 1 << 17
)

// mmap offsets.
const (
	offSQRing = 0
	offCQRing = 0x8000000
	offSQEs   = 0x10000000
)

// io_uring_register opcodes.
const (
	RegisterBuffers        = 0
	UnregisterBuffers      = 1
	RegisterFiles          = 2
	UnregisterFiles        = 3
	RegisterEventfd        = 4
	UnregisterEventfd      = 5
	RegisterFilesUpdate    = 6
	RegisterEventfdAsync   = 7
	RegisterProbe          = 8
	RegisterPersonality    = 9
	UnregisterPersonality  = 10
	RegisterRestrictions   = 11
	RegisterEnableRings    = 12
	RegisterFiles2         = 13
	RegisterFilesUpdate2   = 14
	RegisterBuffers2       = 15
	RegisterBuffersUpdate  = 16
	RegisterIOWQAff        = 17
	UnregisterIOWQAff      = 18
	RegisterIOWQMaxWorkers = 19
	RegisterRingFds        = 20
	UnregisterRingFds      = 21
	RegisterPbufRing       = 22
	UnregisterPbufRing     = 23
	RegisterSyncCancel     = 24
	RegisterFileAllocRange = 25
	RegisterPbufStatus     = 26
	RegisterNapi           = 27
	UnregisterNapi         = 28
	RegisterClock          = 29
	RegisterCloneBuffers   = 30
	RegisterSendMsgRing    = 31
	RegisterZcrxIfq        = 32
)

// Resource registration flags and provided-buffer ring flags.
const (
	RsrcRegisterSparse = 1 << 0
	PbufRingMmap       = 1 << 0
	PbufRingInc        = 1 << 1
	opSupported        = 1 << 0
)

// SQE is struct io_uring_sqe (64 bytes). Unions are named after their most common member; the
// Prep methods know which member each opcode uses.
type SQE struct {
	Opcode      uint8
	Flags       uint8
	IoPrio      uint16
	Fd          int32
	Off         uint64 // off, addr2, cmd_op
	Addr        uint64 // addr, splice_off_in, level/optname
	Len         uint32
	OpFlags     uint32 // rw_flags, msg_flags, timeout_flags, accept_flags, cancel_flags, ...
	UserData    uint64
	BufIndex    uint16 // buf_index or buf_group
	Personality uint16
	FileIndex   int32 // splice_fd_in, file_index, optlen, addr_len (low 16 bits)
	Addr3       uint64
	pad2        uint64
}

// CQE is struct io_uring_cqe (16 bytes).
type CQE struct {
	UserData uint64
	Res      int32
	Flags    uint32
}

// BufferID returns the provided buffer id of a CQE with CQEFBuffer set.
func (c CQE) BufferID() uint16 { return uint16(c.Flags >> CQEBufferShift) }

// More reports whether more CQEs will follow for the same request (multishot, SEND_ZC).
func (c CQE) More() bool { return c.Flags&CQEFMore != 0 }

// Notif reports whether this CQE is a SEND_ZC notification: the kernel released the buffer.
func (c CQE) Notif() bool { return c.Flags&CQEFNotif != 0 }

// HasBuffer reports whether a provided buffer was consumed (CQEFBuffer).
func (c CQE) HasBuffer() bool { return c.Flags&CQEFBuffer != 0 }

// BufMore reports that an incremental provided buffer is only partially consumed.
func (c CQE) BufMore() bool { return c.Flags&CQEFBufMore != 0 }

// ZCCopied reports whether a SEND_ZC notification says the kernel copied the data.
func (c CQE) ZCCopied() bool { return c.Notif() && uint32(c.Res)&NotifUsageZCCopied != 0 }

// sqringOffsets is struct io_sqring_offsets (40 bytes).
type sqringOffsets struct {
	Head, Tail, RingMask, RingEntries, Flags, Dropped, Array, Resv1 uint32
	UserAddr                                                        uint64
}

// cqringOffsets is struct io_cqring_offsets (40 bytes).
type cqringOffsets struct {
	Head, Tail, RingMask, RingEntries, Overflow, CQEs, Flags, Resv1 uint32
	UserAddr                                                        uint64
}

// Params is struct io_uring_params (120 bytes).
type Params struct {
	SQEntries    uint32
	CQEntries    uint32
	Flags        uint32
	SQThreadCPU  uint32
	SQThreadIdle uint32
	Features     uint32
	WQFd         uint32
	resv         [3]uint32
	sqOff        sqringOffsets
	cqOff        cqringOffsets
}

// rsrcRegister is struct io_uring_rsrc_register (32 bytes).
type rsrcRegister struct {
	Nr    uint32
	Flags uint32
	Resv2 uint64
	Data  uint64
	Tags  uint64
}

// rsrcUpdate2 is struct io_uring_rsrc_update2 (32 bytes).
type rsrcUpdate2 struct {
	Offset uint32
	Resv   uint32
	Data   uint64
	Tags   uint64
	Nr     uint32
	Resv2  uint32
}

// rsrcUpdate is struct io_uring_rsrc_update (16 bytes), used to register ring fds.
type rsrcUpdate struct {
	Offset uint32
	Resv   uint32
	Data   uint64
}

// probeHdr is the fixed part of struct io_uring_probe (16 bytes); probeOp is io_uring_probe_op.
type probeHdr struct {
	LastOp uint8
	OpsLen uint8
	Resv   uint16
	Resv2  [3]uint32
}

type probeOp struct {
	Op    uint8
	Resv  uint8
	Flags uint16
	Resv2 uint32
}

// bufReg is struct io_uring_buf_reg (40 bytes).
type bufReg struct {
	RingAddr    uint64
	RingEntries uint32
	Bgid        uint16
	Flags       uint16
	Resv        [3]uint64
}

// bufEntry is struct io_uring_buf (16 bytes). The ring's tail overlays Resv of entry 0.
type bufEntry struct {
	Addr uint64
	Len  uint32
	Bid  uint16
	Resv uint16
}

// geteventsArg is struct io_uring_getevents_arg (24 bytes).
type geteventsArg struct {
	Sigmask     uint64
	SigmaskSz   uint32
	MinWaitUsec uint32
	Ts          uint64
}

// Timespec is struct __kernel_timespec.
type Timespec struct {
	Sec  int64
	Nsec int64
}

// Iovec is struct iovec.
type Iovec struct {
	Base uint64
	Len  uint64
}
