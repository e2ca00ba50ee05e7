// Package zcrx is io_uring zero-copy receive (zcrx) as a receive path of one loop.Queue: an
// area of registered memory the kernel receives into, multishot RECV_ZC per socket, and the
// refill ring through which the application hands buffers back.
//
// A Receiver is registered on a queue whose io_uring driver (loop.URing) was set up with
// loop.URingConfig.CQE32 (New): bound to a NIC hardware RX queue (Config.IfIndex/RxQueue,
// what hwq's binding returns), or device-less (Config.NoDev, Linux 7.1+), where the kernel
// copies the payload of any TCP socket into the area — the same data path, used to test it
// without a capable NIC. Each stream is one operation of the queue (loop.Queue.NewOp) for
// its whole life; its completions arrive as loop.Events whose Big[0] is the offset of the
// data in the area. Recv arms a socket; every
// completion reaches the Handler as a borrowed view of the area (bytes) and a Buf whose
// Release gives the buffer back. Release is safe from any goroutine, once per Buf: releases
// reach the queue's goroutine through a lock-free list and are written to the refill ring
// there, in batches (one ZCRX_CTRL_FLUSH_RQ per batch for a device-less instance).
//
// # Flow control and re-arming
//
// The area is the receive window: when the application holds every buffer, a device-less
// request ends with ENOMEM and the socket keeps the unread bytes; the stream waits and is
// re-armed after the next release of any receiver sharing the area (Stats.AreaStalls); when
// no buffer is on the application's side at all (they are in flight to another sharer, or a
// NIC's page pool holds them) it is re-armed at once, then after a pause growing from 1 ms to
// 128 ms. A request that ends because the
// completion queue was full (ENOSPC) is re-armed at once (Stats.ENOSPCRearms); so is one that
// ends without IORING_CQE_F_MORE for any other reason short of EOF or an error. No byte is
// dropped by either.
//
// # Lifecycle
//
// The kernel keeps a zcrx instance, and its pins on the area, until the queue's ring closes;
// Receiver.Close stops the streams (their handlers get ErrClosed) and refuses new ones. The
// area stays mapped while the application holds buffers: it is unmapped after the queue has
// closed and the last Buf was released, whichever comes last, so a handler may keep data past
// Close. Share exports the instance to another queue (ZCRX_CTRL_EXPORT / ZCRX_REG_IMPORT):
// both then receive into the same area.
//
// # Errors
//
// Every error is an *Error (Op, Err). A refusal — a NIC driver without zcrx support (lo,
// veth and virtio_net all are), a kernel older than the mode asked for, no CAP_NET_ADMIN, a
// dmabuf area without a device to map it for — matches ErrNotSupported and says what it
// needs; the caller falls back to the next receive path and says so.
package zcrx
