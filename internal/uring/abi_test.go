package uring

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/zcnet/zcnet/internal/testutil"
)

// abiChecks maps C expressions evaluated against <linux/io_uring.h> to the Go side's values.
func abiChecks() map[string]uint64 {
	var sqe SQE
	var p Params
	var cqe CQE
	return map[string]uint64{
		"sizeof(struct io_uring_sqe)":                   uint64(unsafe.Sizeof(sqe)),
		"offsetof(struct io_uring_sqe, ioprio)":         uint64(unsafe.Offsetof(sqe.IoPrio)),
		"offsetof(struct io_uring_sqe, fd)":             uint64(unsafe.Offsetof(sqe.Fd)),
		"offsetof(struct io_uring_sqe, off)":            uint64(unsafe.Offsetof(sqe.Off)),
		"offsetof(struct io_uring_sqe, addr)":           uint64(unsafe.Offsetof(sqe.Addr)),
		"offsetof(struct io_uring_sqe, len)":            uint64(unsafe.Offsetof(sqe.Len)),
		"offsetof(struct io_uring_sqe, msg_flags)":      uint64(unsafe.Offsetof(sqe.OpFlags)),
		"offsetof(struct io_uring_sqe, user_data)":      uint64(unsafe.Offsetof(sqe.UserData)),
		"offsetof(struct io_uring_sqe, buf_group)":      uint64(unsafe.Offsetof(sqe.BufIndex)),
		"offsetof(struct io_uring_sqe, personality)":    uint64(unsafe.Offsetof(sqe.Personality)),
		"offsetof(struct io_uring_sqe, file_index)":     uint64(unsafe.Offsetof(sqe.FileIndex)),
		"offsetof(struct io_uring_sqe, addr3)":          uint64(unsafe.Offsetof(sqe.Addr3)),
		"sizeof(struct io_uring_cqe)":                   uint64(unsafe.Sizeof(cqe)),
		"offsetof(struct io_uring_cqe, res)":            uint64(unsafe.Offsetof(cqe.Res)),
		"offsetof(struct io_uring_cqe, flags)":          uint64(unsafe.Offsetof(cqe.Flags)),
		"sizeof(struct io_uring_params)":                uint64(unsafe.Sizeof(p)),
		"offsetof(struct io_uring_params, features)":    uint64(unsafe.Offsetof(p.Features)),
		"offsetof(struct io_uring_params, sq_off)":      uint64(unsafe.Offsetof(p.SQOff)),
		"offsetof(struct io_uring_params, cq_off)":      uint64(unsafe.Offsetof(p.CQOff)),
		"sizeof(struct io_sqring_offsets)":              uint64(unsafe.Sizeof(sqringOffsets{})),
		"sizeof(struct io_cqring_offsets)":              uint64(unsafe.Sizeof(cqringOffsets{})),
		"offsetof(struct io_cqring_offsets, cqes)":      uint64(unsafe.Offsetof(cqringOffsets{}.CQEs)),
		"sizeof(struct io_uring_rsrc_register)":         uint64(unsafe.Sizeof(rsrcRegister{})),
		"offsetof(struct io_uring_rsrc_register, tags)": uint64(unsafe.Offsetof(rsrcRegister{}.Tags)),
		"sizeof(struct io_uring_rsrc_update2)":          uint64(unsafe.Sizeof(rsrcUpdate2{})),
		"offsetof(struct io_uring_rsrc_update2, nr)":    uint64(unsafe.Offsetof(rsrcUpdate2{}.Nr)),
		"sizeof(struct io_uring_rsrc_update)":           uint64(unsafe.Sizeof(rsrcUpdate{})),
		"sizeof(struct io_uring_probe)":                 uint64(unsafe.Sizeof(probeHdr{})),
		"sizeof(struct io_uring_probe_op)":              uint64(unsafe.Sizeof(probeOp{})),
		"sizeof(struct io_uring_buf_reg)":               uint64(unsafe.Sizeof(bufReg{})),
		"offsetof(struct io_uring_buf_reg, bgid)":       uint64(unsafe.Offsetof(bufReg{}.Bgid)),
		"sizeof(struct io_uring_buf)":                   uint64(unsafe.Sizeof(bufEntry{})),
		"offsetof(struct io_uring_buf_ring, tail)":      bufRingTailOffset,
		"sizeof(struct io_uring_getevents_arg)":         uint64(unsafe.Sizeof(geteventsArg{})),
		"offsetof(struct io_uring_getevents_arg, ts)":   uint64(unsafe.Offsetof(geteventsArg{}.Ts)),
		"IORING_SETUP_SQPOLL":                           SetupSQPoll, "IORING_SETUP_SQ_AFF": SetupSQAff,
		"IORING_SETUP_CQSIZE": SetupCQSize, "IORING_SETUP_SUBMIT_ALL": SetupSubmitAll,
		"IORING_SETUP_COOP_TASKRUN": SetupCoopTaskrun, "IORING_SETUP_TASKRUN_FLAG": SetupTaskrunFlag,
		"IORING_SETUP_SQE128": SetupSQE128, "IORING_SETUP_CQE32": SetupCQE32,
		"IORING_SETUP_SINGLE_ISSUER": SetupSingleIssuer, "IORING_SETUP_DEFER_TASKRUN": SetupDeferTaskrun,
		"IORING_OP_NOP": OpNop, "IORING_OP_READ_FIXED": OpReadFixed, "IORING_OP_WRITE_FIXED": OpWriteFixed,
		"IORING_OP_TIMEOUT": OpTimeout, "IORING_OP_ACCEPT": OpAccept, "IORING_OP_ASYNC_CANCEL": OpAsyncCancel,
		"IORING_OP_CONNECT": OpConnect, "IORING_OP_CLOSE": OpClose, "IORING_OP_SEND": OpSend,
		"IORING_OP_RECV": OpRecv, "IORING_OP_SHUTDOWN": OpShutdown, "IORING_OP_MSG_RING": OpMsgRing,
		"IORING_OP_SOCKET": OpSocket, "IORING_OP_URING_CMD": OpUringCmd, "IORING_OP_SEND_ZC": OpSendZC,
		"IORING_OP_SENDMSG_ZC": OpSendmsgZC,
		"IOSQE_FIXED_FILE":     SQEFixedFile, "IOSQE_IO_LINK": SQEIOLink, "IOSQE_BUFFER_SELECT": SQEBufferSelect,
		"IOSQE_CQE_SKIP_SUCCESS":     SQECQESkipSuccess,
		"IORING_RECVSEND_POLL_FIRST": RecvsendPollFirst, "IORING_RECV_MULTISHOT": RecvMultishot,
		"IORING_RECVSEND_FIXED_BUF": RecvsendFixedBuf, "IORING_SEND_ZC_REPORT_USAGE": SendZCReportUsage,
		"IORING_NOTIF_USAGE_ZC_COPIED": NotifUsageZCCopied, "IORING_ACCEPT_MULTISHOT": AcceptMultishot,
		"IORING_TIMEOUT_ETIME_SUCCESS": TimeoutETimeSuccess, "IORING_ASYNC_CANCEL_ANY": CancelAny,
		"IORING_ASYNC_CANCEL_FD": CancelFd, "IORING_ASYNC_CANCEL_ALL": CancelAll,
		"IORING_MSG_DATA": MsgData, "IORING_MSG_RING_CQE_SKIP": MsgRingCQESkip,
		"IORING_CQE_F_BUFFER": CQEFBuffer, "IORING_CQE_F_MORE": CQEFMore, "IORING_CQE_F_NOTIF": CQEFNotif,
		"IORING_CQE_F_SOCK_NONEMPTY": CQEFSockNonempty, "IORING_CQE_BUFFER_SHIFT": CQEBufferShift,
		"IORING_ENTER_GETEVENTS": EnterGetevents, "IORING_ENTER_SQ_WAKEUP": EnterSQWakeup,
		"IORING_ENTER_EXT_ARG": EnterExtArg, "IORING_ENTER_REGISTERED_RING": EnterRegisteredRing,
		"IORING_SQ_NEED_WAKEUP": SQNeedWakeup, "IORING_SQ_CQ_OVERFLOW": SQCQOverflow, "IORING_SQ_TASKRUN": SQTaskrun,
		"IORING_FEAT_SINGLE_MMAP": FeatSingleMmap, "IORING_FEAT_NODROP": FeatNodrop, "IORING_FEAT_EXT_ARG": FeatExtArg,
		"IORING_FEAT_RSRC_TAGS": FeatRsrcTags, "IORING_FEAT_CQE_SKIP": FeatCQESkip,
		"IORING_OFF_CQ_RING": offCQRing, "IORING_OFF_SQES": offSQEs,
		"IORING_REGISTER_PROBE": RegisterProbe, "IORING_REGISTER_FILES2": RegisterFiles2,
		"IORING_REGISTER_FILES_UPDATE2": RegisterFilesUpdate2, "IORING_REGISTER_BUFFERS2": RegisterBuffers2,
		"IORING_REGISTER_BUFFERS_UPDATE": RegisterBuffersUpdate, "IORING_REGISTER_RING_FDS": RegisterRingFds,
		"IORING_UNREGISTER_RING_FDS": UnregisterRingFds, "IORING_REGISTER_PBUF_RING": RegisterPbufRing,
		"IORING_UNREGISTER_PBUF_RING": UnregisterPbufRing, "IORING_REGISTER_FILE_ALLOC_RANGE": RegisterFileAllocRange,
		"IORING_RSRC_REGISTER_SPARSE": RsrcRegisterSparse, "IO_URING_OP_SUPPORTED": opSupported,
	}
}

// TestABIAgainstSystemHeader compiles a C program against the system's <linux/io_uring.h>
// (Debian 12 ships the 6.1 header) and compares every size, offset and constant it knows.
func TestABIAgainstSystemHeader(t *testing.T) {
	if _, err := os.Stat("/usr/include/linux/io_uring.h"); err != nil {
		t.Skip("no /usr/include/linux/io_uring.h (install linux-libc-dev)")
	}
	testutil.CompareWithC(t, []string{"linux/io_uring.h"}, nil, abiChecks())
}

func TestStructSizes(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"SQE", unsafe.Sizeof(SQE{}), 64},
		{"CQE", unsafe.Sizeof(CQE{}), 16},
		{"Params", unsafe.Sizeof(Params{}), 120},
		{"bufEntry", unsafe.Sizeof(bufEntry{}), 16},
		{"bufReg", unsafe.Sizeof(bufReg{}), 40},
		{"geteventsArg", unsafe.Sizeof(geteventsArg{}), 24},
		{"Timespec", unsafe.Sizeof(Timespec{}), 16},
	} {
		if c.got != c.want {
			t.Errorf("sizeof(%s) = %d, want %d", c.name, c.got, c.want)
		}
	}
}

// TestGeneratedUpToDate regenerates zabi_linux.go from the pinned 7.3 headers (mkabi.go
// -check) and fails on any difference from the committed file. make uring-abi-check does the
// same and fails when the headers are missing; here a missing header skips, like
// TestZcrxLayoutAgainst73Header.
func TestGeneratedUpToDate(t *testing.T) {
	inc := uapi73Include()
	if _, err := os.Stat(filepath.Join(inc, "linux", "io_uring", "zcrx.h")); err != nil {
		t.Skipf("no Linux 7.3 uapi headers at %s (run make uapi73): %v", inc, err)
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed")
	}
	abs, err := filepath.Abs(inc)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "run", "mkabi.go", "-check")
	cmd.Env = append(os.Environ(), "ZCNET_UAPI73="+abs)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run mkabi.go -check: %v\n%s", err, out)
	}
}

// TestGeneratedLayout checks the generated structures against the sizes cgo computed from
// the same headers (a hand edit of zabi_linux.go that breaks a layout fails here even
// without the headers) and the provided-buffer ring's tail against bufEntry.
func TestGeneratedLayout(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"SQE", unsafe.Sizeof(SQE{}), sizeofSQE},
		{"CQE", unsafe.Sizeof(CQE{}), sizeofCQE},
		{"Params", unsafe.Sizeof(Params{}), sizeofParams},
		{"io_uring_zcrx_cqe in CQE32.Big", unsafe.Sizeof(CQE32{}.Big), sizeofZcrxCqe},
		{"io_uring_buf_ring.tail", unsafe.Offsetof(bufEntry{}.Resv), bufRingTailOffset},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d", c.name, c.got, c.want)
		}
	}
}
