// Package guestzc holds the tests that need a network where zero-copy is real: the
// virtio-net NIC pair of make vmtest's 7.3 guest (kmod/vm/vmtest.sh, NET=pair in the pin),
// one NIC in the root network namespace and the other moved into a namespace of its own
// (testutil.NewNICPair), so that TCP between them leaves through a virtio TX queue and the
// kernel does not copy MSG_ZEROCOPY or io_uring SEND_ZC payloads as it does on loopback and
// veth.
//
// The tests prove that first (a notification without SO_EE_CODE_ZEROCOPY_COPIED /
// IORING_NOTIF_USAGE_ZC_COPIED; the harness log shows "MEASURE zc-real" lines), then run
// zc's public API across the pair on the io_uring backend with every byte checked: an
// adaptive connection that stays on zero-copy, buffers lent until their notifications,
// closes and resets with zero-copy sends in flight, Relay, FanOut and Data.Retain, and
// zcprobe's zero-copy TX probe. Outside such a guest (ZCVM_NET is not "pair") every test
// skips; inside it a missing pair fails. Figures from the guest (TCG) are for the record:
// nothing here asserts a time.
package guestzc
