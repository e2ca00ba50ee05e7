package capture_test

import (
	"fmt"
	"log"
	"net/netip"
	"os"
	"time"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/bpf/capture"
)

func ExampleNew() {
	f, err := os.Create("listener.pcapng")
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	// Every flow of the listener on 10.0.0.1:9000, on interface 2, both
	// directions, whole packets.
	c, err := capture.New(f, capture.Options{Interfaces: []int{2}, Snap: capture.MaxSnap},
		capture.Listener(netip.MustParseAddrPort("10.0.0.1:9000")))
	if err != nil {
		log.Fatal(err) // *capture.OpError: ErrPermission, ErrNotFound (no such listener), ...
	}
	time.Sleep(10 * time.Second)
	if err := c.Close(); err != nil {
		log.Fatal(err)
	}
	st, _ := c.Stats()
	fmt.Printf("%d packets written, %d lost (ring full), %d truncated\n", st.Written, st.Dropped, st.Truncated)
}

func ExampleSelector() {
	srv := netip.MustParseAddrPort("10.0.0.1:9000")
	peer := netip.MustParseAddrPort("10.0.0.2:41000")
	fmt.Println(capture.Listener(srv))
	fmt.Println(capture.Listener(netip.MustParseAddrPort("0.0.0.0:9000")))
	fmt.Println(capture.Flow(bpf.FlowKey{Remote: peer, Local: srv}))
	// Output:
	// listener 10.0.0.1:9000
	// listener 0.0.0.0:9000
	// flow 10.0.0.2:41000->10.0.0.1:9000
}
