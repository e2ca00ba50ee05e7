package zc

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Issue 9's core tests over the shim backend: the same bodies as the io_uring and plain
// tests, with Config.Backend = BackendShim, at a scale the VM (qemu without KVM) runs in a
// few minutes. They need /dev/zcshim: make vmtest runs them (TestShim*); elsewhere needShim
// skips them. The file sorts before shim_vm_test.go, whose TestShimModuleIdle must run last.

func shimCore() Config { return Config{Backend: BackendShim} }

func TestShimRelay(t *testing.T) {
	needShim(t)
	testRelay(t, BackendShim, envInt(t, "ZC_RELAY_CONNS", 16), envInt(t, "ZC_RELAY_KIB", 256)<<10, 1, "1queue", "2queues", "2queues-tight")
}

// TestShimReadSelfRefused: the module owns its sockets' receive queues, so ReadSelf is a
// *NotSupportedError there (and the net.Conn face receives through the queue instead).
func TestShimReadSelfRefused(t *testing.T) {
	needShim(t)
	e := newEngine(t, shimCore())
	var ns *NotSupportedError
	if _, err := e.Listen("tcp", "127.0.0.1:0", func(*Conn) Handler { return HandlerFuncs{} }, ListenOptions{ReadSelf: true}); !errors.As(err, &ns) {
		t.Fatalf("Listen(ReadSelf) on the shim = %v, want a *NotSupportedError", err)
	}
	ln, err := e.Listen("tcp", "127.0.0.1:0", func(*Conn) Handler { return HandlerFuncs{} })
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := e.Dial(context.Background(), "tcp", ln.Addr().String(), HandlerFuncs{}, DialOptions{ReadSelf: true}); !errors.As(err, &ns) {
		t.Fatalf("Dial(ReadSelf) on the shim = %v, want a *NotSupportedError", err)
	}
}

func TestShimHandlerCannotHang(t *testing.T) {
	needShim(t)
	testHandlerCannotHang(t, shimCore())
}

func TestShimSocketAfterPeerReset(t *testing.T) {
	needShim(t)
	testSocketAfterPeerReset(t, shimCore())
}

func TestShimEngineCloseWithHeldMemory(t *testing.T) {
	needShim(t)
	cfg := shimCore()
	cfg.Queues, cfg.NoPin = 2, true
	testEngineCloseWithHeldMemory(t, cfg)
}

func TestShimCallsAfterClose(t *testing.T) {
	needShim(t)
	testCallsAfterClose(t, shimCore())
}

func TestShimHandlersSerialized(t *testing.T) {
	needShim(t)
	testHandlersSerialized(t, Config{Backend: BackendShim, Queues: 2, NoPin: true})
}

func TestShimQueuedAccounting(t *testing.T) {
	needShim(t)
	testQueuedAccounting(t, shimCore())
}

func TestShimSendmsgManyRetries(t *testing.T) {
	needShim(t)
	for _, dialed := range []bool{true, false} {
		testSendmsgManyRetries(t, BackendShim, dialed)
	}
}

func TestShimMisuse(t *testing.T) {
	needShim(t)
	testMisuse(t, shimCore())
}

func TestShimHandlerPanics(t *testing.T) {
	needShim(t)
	testHandlerPanics(t, Config{Backend: BackendShim, Queues: 1, NoPin: true})
}

func TestShimListenAddrInUse(t *testing.T) {
	needShim(t)
	testListenAddrInUse(t, shimCore())
}

func TestShimDialInFlightEngineClose(t *testing.T) {
	needShim(t)
	testDialInFlightEngineClose(t, Config{Backend: BackendShim, Queues: 2, NoPin: true}, 5)
}

func TestShimNonReaderDoesNotStarve(t *testing.T) {
	needShim(t)
	testNonReaderDoesNotStarve(t, Config{Backend: BackendShim, Queues: 1, NoPin: true})
}

func TestShimNoSpinWhilePaused(t *testing.T) {
	needShim(t)
	testNoSpinWhilePaused(t, Config{Backend: BackendShim, Queues: 1, NoPin: true})
}

func TestShimAcceptBackoffEMFILE(t *testing.T) {
	needShim(t)
	testAcceptBackoffEMFILE(t, BackendShim)
}

func TestShimZeroCopyNotifAccounting(t *testing.T) {
	needShim(t)
	testZeroCopyNotifAccounting(t, Config{Backend: BackendShim, Queues: 2, NoPin: true,
		SendBufs: 16, SendBufSize: 64 << 10, CloseTimeout: 2 * time.Second}, 12)
}

func TestShimKeepAlive(t *testing.T) {
	needShim(t)
	testKeepAlive(t, BackendShim)
}

func TestShimConnChurn(t *testing.T) {
	needShim(t)
	testConnChurn(t, BackendShim, envInt(t, "ZC_CHURN_CONNS", 500))
}

func TestShimEngineCycles(t *testing.T) {
	needShim(t)
	testEngineCycles(t, BackendShim, envInt(t, "ZC_CHURN_CYCLES", 10))
}
