package uring

// The io_uring ABI's constants and structures are generated from the pinned Linux 7.3 uapi
// headers into zabi_linux.go (types_uring.go names what is taken, mkabi.go writes it: go
// generate ./internal/uring; make uring-abi-check fails when the committed file drifts from
// what the headers give). TestABIAgainstSystemHeader also checks what exists in Linux 6.1's
// header against the system's, and the layout tests check every size and offset.

//go:generate go run mkabi.go

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
