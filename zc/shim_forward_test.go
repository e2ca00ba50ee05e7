package zc

import "testing"

// Conn.SendFile and the relay's paths over the shim backend: the io_uring and plain tests'
// bodies with Config.Backend = BackendShim, at a scale the VM (qemu without KVM) runs
// quickly. They need /dev/zcshim: make vmtest runs them (TestShim*); elsewhere needShim
// skips them.

func shimForwardCfg(queues int) Config {
	return Config{Backend: BackendShim, Queues: queues, NoPin: true}
}

// TestShimSendFile: SendFile in order with Write and Send, flow control against a slow
// reader (OnWritable after the drain), the caller's file closed at once, a truncated file,
// Engine.Close mid-send, SendFile from the queue goroutine, and the typed errors of misuse
// and of calls after CloseWrite and Close; every byte checked.
func TestShimSendFile(t *testing.T) {
	needShim(t)
	const scale = 4 // a quarter of the io_uring and plain tests' sizes
	t.Run("order", func(t *testing.T) { testSendFileOrder(t, shimForwardCfg(1), scale) })
	t.Run("slow-reader", func(t *testing.T) { testSendFileSlowReader(t, shimForwardCfg(1), scale) })
	t.Run("closed-mid-send", func(t *testing.T) { testSendFileClosedMidSend(t, shimForwardCfg(1), scale) })
	t.Run("truncated", func(t *testing.T) { testSendFileTruncated(t, shimForwardCfg(1), scale) })
	t.Run("engine-close", func(t *testing.T) { testSendFileEngineClose(t, shimForwardCfg(2), scale) })
	t.Run("on-loop", func(t *testing.T) { testSendFileOnLoop(t, shimForwardCfg(1), scale) })
	t.Run("misuse", func(t *testing.T) { testSendFileMisuse(t, shimForwardCfg(1)) })
}

// TestShimRelaySplice: Relay over the shim backend takes the splice path (RelayAuto, and
// RelaySplice demanded), every byte checked both ways across 2 queues, a backend that
// half-closes first, and a graceful Close of either side while the relay's pipe holds
// bytes (they all arrive).
func TestShimRelaySplice(t *testing.T) {
	needShim(t)
	t.Run("bytes", func(t *testing.T) {
		const conns, perConn = 4, 1 << 20
		s := newSpliceEnv(t, shimForwardCfg(2), RelayOptions{Path: RelaySplice, PipeSize: 256 << 10}, streamServe(perConn))
		runSpliceClients(t, s.addr(), conns, perConn)
		s.checkRelays(t, conns, perConn+8, perConn)
	})
	t.Run("auto-half-close-first", func(t *testing.T) { testRelaySpliceHalfCloseFirst(t, shimForwardCfg(2), 2<<20) })
	for _, side := range []string{"destination", "source"} {
		t.Run("close-held-"+side, func(t *testing.T) { testRelaySpliceCloseHeld(t, shimForwardCfg(2), side) })
	}
}

// TestShimRelaySendData: RelaySendData demanded on the shim backend moves every byte by
// SendData (nothing spliced), and nothing refuses the splice path there (RelayAuto takes it).
func TestShimRelaySendData(t *testing.T) {
	needShim(t)
	testRelaySendDataDemanded(t, shimForwardCfg(2), 4, 1<<20)
	e := newEngine(t, shimForwardCfg(1))
	a, _ := dialPeer(t, e, HandlerFuncs{})
	b, _ := dialPeer(t, e, HandlerFuncs{})
	if err := spliceRefusal(a, b); err != nil {
		t.Errorf("the shim backend refuses the splice relay: %v", err)
	}
	a.Close()
	b.Close()
}
