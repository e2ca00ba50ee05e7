//go:build ignore

// Input for mkabi.go (go generate): `go tool cgo -godefs` reads it against the pinned Linux
// 7.3 uapi headers (make uapi73: build/uapi73/usr/include) and mkabi.go renames the fields
// and writes zabi_linux.go. The headers are the single source of truth; this file only names
// what the Go side needs.

package uring

/*
#include <stddef.h>
#include <linux/io_uring.h>
#include <linux/io_uring/query.h>
#include <linux/time_types.h>
#include <linux/uio.h>

// The provided-buffer ring's tail overlays the resv field of its first entry.
enum { zc_buf_ring_tail_off = offsetof(struct io_uring_buf_ring, tail) };
*/
import "C"

// Structures shared with the kernel.
type (
	// SQE is struct io_uring_sqe. Unions are named after their most common member; the
	// Prep methods know which member each opcode uses: Off (off, addr2, cmd_op), Addr
	// (addr, splice_off_in, level/optname), OpFlags (rw_flags, msg_flags, timeout_flags,
	// accept_flags, cancel_flags, ...), BufIndex (buf_index, buf_group), FileIndex
	// (splice_fd_in, file_index, optlen, addr_len).
	SQE C.struct_io_uring_sqe
	// CQE is struct io_uring_cqe.
	CQE C.struct_io_uring_cqe
	// Params is struct io_uring_params.
	Params        C.struct_io_uring_params
	sqringOffsets C.struct_io_sqring_offsets
	cqringOffsets C.struct_io_cqring_offsets
	rsrcRegister  C.struct_io_uring_rsrc_register
	rsrcUpdate2   C.struct_io_uring_rsrc_update2
	// rsrcUpdate is struct io_uring_rsrc_update, used to register ring fds.
	rsrcUpdate C.struct_io_uring_rsrc_update
	// probeHdr is the fixed part of struct io_uring_probe; probeOp is io_uring_probe_op.
	probeHdr C.struct_io_uring_probe
	probeOp  C.struct_io_uring_probe_op
	bufReg   C.struct_io_uring_buf_reg
	// bufEntry is struct io_uring_buf. The ring's tail overlays Resv of entry 0.
	bufEntry     C.struct_io_uring_buf
	geteventsArg C.struct_io_uring_getevents_arg
	// Timespec is struct __kernel_timespec.
	Timespec C.struct___kernel_timespec
	// Iovec is struct iovec.
	Iovec C.struct_iovec

	zcrxOffsets C.struct_io_uring_zcrx_offsets
	zcrxAreaReg C.struct_io_uring_zcrx_area_reg
	// zcrxIfqReg is struct io_uring_zcrx_ifq_reg. EventDesc was reserved (zero) before
	// Linux 7.2.
	zcrxIfqReg    C.struct_io_uring_zcrx_ifq_reg
	regionDesc    C.struct_io_uring_region_desc
	zcrxEventDesc C.struct_zcrx_event_desc
	// zcrxCtrl is struct zcrx_ctrl: a 48-byte union (Arg) follows the header.
	zcrxCtrl C.struct_zcrx_ctrl
	queryHdr C.struct_io_uring_query_hdr
	// ZcrxQuery is struct io_uring_query_zcrx: what this kernel's zcrx supports
	// (RegisterFlags: ZcrxReg*, AreaFlags: ZcrxArea*, Features: ZcrxFeature*).
	ZcrxQuery C.struct_io_uring_query_zcrx
	// ZcrxStats is struct zcrx_stats: bytes the kernel had to copy into the area instead of
	// receiving them there directly (every byte of a device-less instance that arrived in
	// page fragments; the copies of a socket's linear data are not counted).
	ZcrxStats C.struct_zcrx_stats
	// ZcrxRqe is struct io_uring_zcrx_rqe, a refill ring entry.
	ZcrxRqe C.struct_io_uring_zcrx_rqe
)

// Sizes and offsets the layout tests and the provided-buffer ring use.
const (
	sizeofSQE         = C.sizeof_struct_io_uring_sqe
	sizeofCQE         = C.sizeof_struct_io_uring_cqe
	sizeofParams      = C.sizeof_struct_io_uring_params
	sizeofZcrxCqe     = C.sizeof_struct_io_uring_zcrx_cqe
	bufRingTailOffset = C.zc_buf_ring_tail_off
)

// Setup flags (io_uring_params.flags).
const (
	SetupIOPoll           = C.IORING_SETUP_IOPOLL
	SetupSQPoll           = C.IORING_SETUP_SQPOLL
	SetupSQAff            = C.IORING_SETUP_SQ_AFF
	SetupCQSize           = C.IORING_SETUP_CQSIZE
	SetupClamp            = C.IORING_SETUP_CLAMP
	SetupAttachWQ         = C.IORING_SETUP_ATTACH_WQ
	SetupRDisabled        = C.IORING_SETUP_R_DISABLED
	SetupSubmitAll        = C.IORING_SETUP_SUBMIT_ALL
	SetupCoopTaskrun      = C.IORING_SETUP_COOP_TASKRUN
	SetupTaskrunFlag      = C.IORING_SETUP_TASKRUN_FLAG
	SetupSQE128           = C.IORING_SETUP_SQE128
	SetupCQE32            = C.IORING_SETUP_CQE32
	SetupSingleIssuer     = C.IORING_SETUP_SINGLE_ISSUER
	SetupDeferTaskrun     = C.IORING_SETUP_DEFER_TASKRUN
	SetupNoMmap           = C.IORING_SETUP_NO_MMAP
	SetupRegisteredFdOnly = C.IORING_SETUP_REGISTERED_FD_ONLY
	SetupNoSQArray        = C.IORING_SETUP_NO_SQARRAY
	SetupCQEMixed         = C.IORING_SETUP_CQE_MIXED
	SetupSQEMixed         = C.IORING_SETUP_SQE_MIXED
)

// Opcodes (enum io_uring_op).
const (
	OpNop            = C.IORING_OP_NOP
	OpReadv          = C.IORING_OP_READV
	OpWritev         = C.IORING_OP_WRITEV
	OpFsync          = C.IORING_OP_FSYNC
	OpReadFixed      = C.IORING_OP_READ_FIXED
	OpWriteFixed     = C.IORING_OP_WRITE_FIXED
	OpPollAdd        = C.IORING_OP_POLL_ADD
	OpPollRemove     = C.IORING_OP_POLL_REMOVE
	OpSyncFileRange  = C.IORING_OP_SYNC_FILE_RANGE
	OpSendmsg        = C.IORING_OP_SENDMSG
	OpRecvmsg        = C.IORING_OP_RECVMSG
	OpTimeout        = C.IORING_OP_TIMEOUT
	OpTimeoutRemove  = C.IORING_OP_TIMEOUT_REMOVE
	OpAccept         = C.IORING_OP_ACCEPT
	OpAsyncCancel    = C.IORING_OP_ASYNC_CANCEL
	OpLinkTimeout    = C.IORING_OP_LINK_TIMEOUT
	OpConnect        = C.IORING_OP_CONNECT
	OpFallocate      = C.IORING_OP_FALLOCATE
	OpOpenat         = C.IORING_OP_OPENAT
	OpClose          = C.IORING_OP_CLOSE
	OpFilesUpdate    = C.IORING_OP_FILES_UPDATE
	OpStatx          = C.IORING_OP_STATX
	OpRead           = C.IORING_OP_READ
	OpWrite          = C.IORING_OP_WRITE
	OpFadvise        = C.IORING_OP_FADVISE
	OpMadvise        = C.IORING_OP_MADVISE
	OpSend           = C.IORING_OP_SEND
	OpRecv           = C.IORING_OP_RECV
	OpOpenat2        = C.IORING_OP_OPENAT2
	OpEpollCtl       = C.IORING_OP_EPOLL_CTL
	OpSplice         = C.IORING_OP_SPLICE
	OpProvideBuffers = C.IORING_OP_PROVIDE_BUFFERS
	OpRemoveBuffers  = C.IORING_OP_REMOVE_BUFFERS
	OpTee            = C.IORING_OP_TEE
	OpShutdown       = C.IORING_OP_SHUTDOWN
	OpRenameat       = C.IORING_OP_RENAMEAT
	OpUnlinkat       = C.IORING_OP_UNLINKAT
	OpMkdirat        = C.IORING_OP_MKDIRAT
	OpSymlinkat      = C.IORING_OP_SYMLINKAT
	OpLinkat         = C.IORING_OP_LINKAT
	OpMsgRing        = C.IORING_OP_MSG_RING
	OpFsetxattr      = C.IORING_OP_FSETXATTR
	OpSetxattr       = C.IORING_OP_SETXATTR
	OpFgetxattr      = C.IORING_OP_FGETXATTR
	OpGetxattr       = C.IORING_OP_GETXATTR
	OpSocket         = C.IORING_OP_SOCKET
	OpUringCmd       = C.IORING_OP_URING_CMD
	OpSendZC         = C.IORING_OP_SEND_ZC
	OpSendmsgZC      = C.IORING_OP_SENDMSG_ZC
	OpReadMultishot  = C.IORING_OP_READ_MULTISHOT
	OpWaitid         = C.IORING_OP_WAITID
	OpFutexWait      = C.IORING_OP_FUTEX_WAIT
	OpFutexWake      = C.IORING_OP_FUTEX_WAKE
	OpFutexWaitv     = C.IORING_OP_FUTEX_WAITV
	OpFixedFdInstall = C.IORING_OP_FIXED_FD_INSTALL
	OpFtruncate      = C.IORING_OP_FTRUNCATE
	OpBind           = C.IORING_OP_BIND
	OpListen         = C.IORING_OP_LISTEN
	OpRecvZC         = C.IORING_OP_RECV_ZC
	OpEpollWait      = C.IORING_OP_EPOLL_WAIT
	OpReadvFixed     = C.IORING_OP_READV_FIXED
	OpWritevFixed    = C.IORING_OP_WRITEV_FIXED
	OpPipe           = C.IORING_OP_PIPE
)

// SQE flags (io_uring_sqe.flags).
const (
	SQEFixedFile      = C.IOSQE_FIXED_FILE
	SQEIODrain        = C.IOSQE_IO_DRAIN
	SQEIOLink         = C.IOSQE_IO_LINK
	SQEIOHardlink     = C.IOSQE_IO_HARDLINK
	SQEAsync          = C.IOSQE_ASYNC
	SQEBufferSelect   = C.IOSQE_BUFFER_SELECT
	SQECQESkipSuccess = C.IOSQE_CQE_SKIP_SUCCESS
)

// Send/recv flags, carried in io_uring_sqe.ioprio.
const (
	RecvsendPollFirst = C.IORING_RECVSEND_POLL_FIRST
	RecvMultishot     = C.IORING_RECV_MULTISHOT
	RecvsendFixedBuf  = C.IORING_RECVSEND_FIXED_BUF
	SendZCReportUsage = C.IORING_SEND_ZC_REPORT_USAGE
	RecvsendBundle    = C.IORING_RECVSEND_BUNDLE
)

// NotifUsageZCCopied is set in a SEND_ZC notification's res when SendZCReportUsage was asked
// for and the kernel copied the data instead of sending the pages (always the case for
// loopback and veth destinations).
const NotifUsageZCCopied = C.IORING_NOTIF_USAGE_ZC_COPIED

// Accept flags, carried in io_uring_sqe.ioprio.
const (
	AcceptMultishot = C.IORING_ACCEPT_MULTISHOT
	AcceptDontwait  = C.IORING_ACCEPT_DONTWAIT
	AcceptPollFirst = C.IORING_ACCEPT_POLL_FIRST
)

// Timeout flags (io_uring_sqe.timeout_flags).
const (
	TimeoutAbs          = C.IORING_TIMEOUT_ABS
	TimeoutUpdate       = C.IORING_TIMEOUT_UPDATE
	TimeoutBoottime     = C.IORING_TIMEOUT_BOOTTIME
	TimeoutRealtime     = C.IORING_TIMEOUT_REALTIME
	LinkTimeoutUpdate   = C.IORING_LINK_TIMEOUT_UPDATE
	TimeoutETimeSuccess = C.IORING_TIMEOUT_ETIME_SUCCESS
	TimeoutMultishot    = C.IORING_TIMEOUT_MULTISHOT
)

// Cancel flags (io_uring_sqe.cancel_flags).
const (
	CancelAll      = C.IORING_ASYNC_CANCEL_ALL
	CancelFd       = C.IORING_ASYNC_CANCEL_FD
	CancelAny      = C.IORING_ASYNC_CANCEL_ANY
	CancelFdFixed  = C.IORING_ASYNC_CANCEL_FD_FIXED
	CancelUserdata = C.IORING_ASYNC_CANCEL_USERDATA
	CancelOp       = C.IORING_ASYNC_CANCEL_OP
)

// MSG_RING commands (io_uring_sqe.addr) and flags (io_uring_sqe.msg_ring_flags).
const (
	MsgData          = C.IORING_MSG_DATA
	MsgSendFd        = C.IORING_MSG_SEND_FD
	MsgRingCQESkip   = C.IORING_MSG_RING_CQE_SKIP
	MsgRingFlagsPass = C.IORING_MSG_RING_FLAGS_PASS
)

// CQE flags (io_uring_cqe.flags).
const (
	CQEFBuffer       = C.IORING_CQE_F_BUFFER
	CQEFMore         = C.IORING_CQE_F_MORE
	CQEFSockNonempty = C.IORING_CQE_F_SOCK_NONEMPTY
	CQEFNotif        = C.IORING_CQE_F_NOTIF
	CQEFBufMore      = C.IORING_CQE_F_BUF_MORE
	CQEFSkip         = C.IORING_CQE_F_SKIP
	CQEF32           = C.IORING_CQE_F_32
	CQEBufferShift   = C.IORING_CQE_BUFFER_SHIFT
)

// io_uring_enter flags.
const (
	EnterGetevents      = C.IORING_ENTER_GETEVENTS
	EnterSQWakeup       = C.IORING_ENTER_SQ_WAKEUP
	EnterSQWait         = C.IORING_ENTER_SQ_WAIT
	EnterExtArg         = C.IORING_ENTER_EXT_ARG
	EnterRegisteredRing = C.IORING_ENTER_REGISTERED_RING
)

// SQ ring flags (written by the kernel).
const (
	SQNeedWakeup = C.IORING_SQ_NEED_WAKEUP
	SQCQOverflow = C.IORING_SQ_CQ_OVERFLOW
	SQTaskrun    = C.IORING_SQ_TASKRUN
)

// CQ ring flags.
const CQEventfdDisabled = C.IORING_CQ_EVENTFD_DISABLED

// Features (io_uring_params.features).
const (
	FeatSingleMmap     = C.IORING_FEAT_SINGLE_MMAP
	FeatNodrop         = C.IORING_FEAT_NODROP
	FeatSubmitStable   = C.IORING_FEAT_SUBMIT_STABLE
	FeatRWCurPos       = C.IORING_FEAT_RW_CUR_POS
	FeatCurPersonality = C.IORING_FEAT_CUR_PERSONALITY
	FeatFastPoll       = C.IORING_FEAT_FAST_POLL
	FeatPoll32Bits     = C.IORING_FEAT_POLL_32BITS
	FeatSQPollNonfixed = C.IORING_FEAT_SQPOLL_NONFIXED
	FeatExtArg         = C.IORING_FEAT_EXT_ARG
	FeatNativeWorkers  = C.IORING_FEAT_NATIVE_WORKERS
	FeatRsrcTags       = C.IORING_FEAT_RSRC_TAGS
	FeatCQESkip        = C.IORING_FEAT_CQE_SKIP
	FeatLinkedFile     = C.IORING_FEAT_LINKED_FILE
	FeatRegRegRing     = C.IORING_FEAT_REG_REG_RING
	FeatRecvsendBundle = C.IORING_FEAT_RECVSEND_BUNDLE
	FeatMinTimeout     = C.IORING_FEAT_MIN_TIMEOUT
	FeatRWAttr         = C.IORING_FEAT_RW_ATTR
	FeatNoIOWait       = C.IORING_FEAT_NO_IOWAIT
)

// mmap offsets.
const (
	offSQRing = C.IORING_OFF_SQ_RING
	offCQRing = C.IORING_OFF_CQ_RING
	offSQEs   = C.IORING_OFF_SQES
)

// io_uring_register opcodes.
const (
	RegisterBuffers        = C.IORING_REGISTER_BUFFERS
	UnregisterBuffers      = C.IORING_UNREGISTER_BUFFERS
	RegisterFiles          = C.IORING_REGISTER_FILES
	UnregisterFiles        = C.IORING_UNREGISTER_FILES
	RegisterEventfd        = C.IORING_REGISTER_EVENTFD
	UnregisterEventfd      = C.IORING_UNREGISTER_EVENTFD
	RegisterFilesUpdate    = C.IORING_REGISTER_FILES_UPDATE
	RegisterEventfdAsync   = C.IORING_REGISTER_EVENTFD_ASYNC
	RegisterProbe          = C.IORING_REGISTER_PROBE
	RegisterPersonality    = C.IORING_REGISTER_PERSONALITY
	UnregisterPersonality  = C.IORING_UNREGISTER_PERSONALITY
	RegisterRestrictions   = C.IORING_REGISTER_RESTRICTIONS
	RegisterEnableRings    = C.IORING_REGISTER_ENABLE_RINGS
	RegisterFiles2         = C.IORING_REGISTER_FILES2
	RegisterFilesUpdate2   = C.IORING_REGISTER_FILES_UPDATE2
	RegisterBuffers2       = C.IORING_REGISTER_BUFFERS2
	RegisterBuffersUpdate  = C.IORING_REGISTER_BUFFERS_UPDATE
	RegisterIOWQAff        = C.IORING_REGISTER_IOWQ_AFF
	UnregisterIOWQAff      = C.IORING_UNREGISTER_IOWQ_AFF
	RegisterIOWQMaxWorkers = C.IORING_REGISTER_IOWQ_MAX_WORKERS
	RegisterRingFds        = C.IORING_REGISTER_RING_FDS
	UnregisterRingFds      = C.IORING_UNREGISTER_RING_FDS
	RegisterPbufRing       = C.IORING_REGISTER_PBUF_RING
	UnregisterPbufRing     = C.IORING_UNREGISTER_PBUF_RING
	RegisterSyncCancel     = C.IORING_REGISTER_SYNC_CANCEL
	RegisterFileAllocRange = C.IORING_REGISTER_FILE_ALLOC_RANGE
	RegisterPbufStatus     = C.IORING_REGISTER_PBUF_STATUS
	RegisterNapi           = C.IORING_REGISTER_NAPI
	UnregisterNapi         = C.IORING_UNREGISTER_NAPI
	RegisterClock          = C.IORING_REGISTER_CLOCK
	RegisterCloneBuffers   = C.IORING_REGISTER_CLONE_BUFFERS
	RegisterSendMsgRing    = C.IORING_REGISTER_SEND_MSG_RING
	RegisterZcrxIfq        = C.IORING_REGISTER_ZCRX_IFQ
	RegisterResizeRings    = C.IORING_REGISTER_RESIZE_RINGS
	RegisterMemRegion      = C.IORING_REGISTER_MEM_REGION
	RegisterQuery          = C.IORING_REGISTER_QUERY     // Linux 6.18
	RegisterZcrxCtrl       = C.IORING_REGISTER_ZCRX_CTRL // Linux 7.0
)

// Resource registration flags and provided-buffer ring flags.
const (
	RsrcRegisterSparse = C.IORING_RSRC_REGISTER_SPARSE
	PbufRingMmap       = C.IOU_PBUF_RING_MMAP
	PbufRingInc        = C.IOU_PBUF_RING_INC
	opSupported        = C.IO_URING_OP_SUPPORTED
	memRegionTypeUser  = C.IORING_MEM_REGION_TYPE_USER
)

// zcrx (include/uapi/linux/io_uring/zcrx.h) and the query (io_uring/query.h).
const (
	// ZcrxAreaShift: the bits of a zcrx CQE's offset from this one up name the area.
	ZcrxAreaShift = C.IORING_ZCRX_AREA_SHIFT

	ZcrxAreaDmabuf = C.IORING_ZCRX_AREA_DMABUF // io_uring_zcrx_area_reg.flags: dmabuf_fd names the memory

	ZcrxRegImport = C.ZCRX_REG_IMPORT // io_uring_zcrx_ifq_reg.flags: import an exported instance (if_idx = its fd)
	ZcrxRegNodev  = C.ZCRX_REG_NODEV  // device-less instance: every byte is copied (Linux 7.1+)

	ZcrxFeatureRxPageSize = C.ZCRX_FEATURE_RX_PAGE_SIZE
	ZcrxFeatureEvent      = C.ZCRX_FEATURE_EVENT

	ZcrxEventAllocFail = C.ZCRX_EVENT_ALLOC_FAIL
	ZcrxEventCopy      = C.ZCRX_EVENT_COPY

	zcrxEventDescFlagStats = C.ZCRX_EVENT_DESC_FLAG_STATS

	zcrxCtrlFlushRQ  = C.ZCRX_CTRL_FLUSH_RQ
	zcrxCtrlExport   = C.ZCRX_CTRL_EXPORT
	zcrxCtrlArmEvent = C.ZCRX_CTRL_ARM_EVENT
	zcrxCtrlAddArea  = C.ZCRX_CTRL_ADD_AREA

	queryOpZcrx = C.IO_URING_QUERY_ZCRX
)
