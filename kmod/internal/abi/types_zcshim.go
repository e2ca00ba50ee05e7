//go:build ignore

// Input for `go tool cgo -godefs` (see gen.go). The header
// kmod/uapi/zcshim.h is the single source of truth; this file only names
// what the Go side needs.

package abi

/*
#include <zcshim.h>
*/
import "C"

// Ring entries and ioctl arguments.
type (
	Sqe    C.struct_zcshim_sqe
	Cqe    C.struct_zcshim_cqe
	Setup  C.struct_zcshim_setup
	Region C.struct_zcshim_region
	Attach C.struct_zcshim_attach
	ID     C.struct_zcshim_id
	Enter  C.struct_zcshim_enter
	Stats  C.struct_zcshim_stats
)

// Sizes, used by the layout test.
const (
	SizeofSqe    = C.sizeof_struct_zcshim_sqe
	SizeofCqe    = C.sizeof_struct_zcshim_cqe
	SizeofSetup  = C.sizeof_struct_zcshim_setup
	SizeofRegion = C.sizeof_struct_zcshim_region
	SizeofAttach = C.sizeof_struct_zcshim_attach
	SizeofID     = C.sizeof_struct_zcshim_id
	SizeofEnter  = C.sizeof_struct_zcshim_enter
	SizeofStats  = C.sizeof_struct_zcshim_stats
)

// ABI constants.
const (
	ABIVersion = C.ZCSHIM_ABI_VERSION

	MaxEntries   = C.ZCSHIM_MAX_ENTRIES
	MaxRegions   = C.ZCSHIM_MAX_REGIONS
	MaxRegionLen = C.ZCSHIM_MAX_REGION_LEN
	MaxSocks     = C.ZCSHIM_MAX_SOCKS
	RecvMax      = C.ZCSHIM_RECV_MAX

	OpNop  = C.ZCSHIM_OP_NOP
	OpSend = C.ZCSHIM_OP_SEND
	OpRecv = C.ZCSHIM_OP_RECV
	OpLast = C.ZCSHIM_OP_LAST

	CqeFMore   = C.ZCSHIM_CQE_F_MORE
	CqeFNotif  = C.ZCSHIM_CQE_F_NOTIF
	CqeFCopied = C.ZCSHIM_CQE_F_COPIED

	RegReadonly = C.ZCSHIM_REG_READONLY

	EnterGetevents = C.ZCSHIM_ENTER_GETEVENTS

	IocSetup      = C.ZCSHIM_IOC_SETUP
	IocRegister   = C.ZCSHIM_IOC_REGISTER
	IocUnregister = C.ZCSHIM_IOC_UNREGISTER
	IocAttach     = C.ZCSHIM_IOC_ATTACH
	IocDetach     = C.ZCSHIM_IOC_DETACH
	IocEnter      = C.ZCSHIM_IOC_ENTER
	IocStats      = C.ZCSHIM_IOC_STATS
)
