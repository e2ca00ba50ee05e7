package zc

import (
	"errors"
	"testing"
)

// Conn.SendFile and the relay's path over the shim backend: the io_uring and plain tests'
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

// TestShimRelaySendData: on the shim backend the relay forwards by SendData (splicing is
// off there until the stream corruption seen with it in the guests is understood:
// spliceCapable): RelaySendData demanded moves every byte by SendData, RelaySplice demanded
// is refused with a *NotSupportedError, and RelayAuto falls back to SendData visibly.
func TestShimRelaySendData(t *testing.T) {
	needShim(t)
	testRelaySendDataDemanded(t, shimForwardCfg(2), 4, 1<<20)
	e := newEngine(t, shimForwardCfg(1))
	a, _ := dialPeer(t, e, HandlerFuncs{})
	b, _ := dialPeer(t, e, HandlerFuncs{})
	var ns *NotSupportedError
	if err := spliceRefusal(a, b); !errors.As(err, &ns) {
		t.Errorf("splice refusal on the shim backend = %v, want a *NotSupportedError", err)
	}
	a.Close()
	b.Close()
}
