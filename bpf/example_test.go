package bpf_test

import (
	"errors"
	"fmt"
	"log"
	"net/netip"

	"github.com/zcnet/zcnet/bpf"
)

func ExampleFlowKey() {
	// Every connection from 192.0.2.7 to port 8080, whatever its source port.
	k := bpf.FlowKey{
		Remote: netip.MustParseAddrPort("192.0.2.7:0"),
		Local:  netip.MustParseAddrPort("198.51.100.1:8080"),
	}
	fmt.Println(k)
	// Output: 192.0.2.7:0->198.51.100.1:8080
}

// listenerFDs stands for one listening socket per queue, plain IPPROTO_TCP
// with SO_REUSEPORT on one address.
var listenerFDs []int

func ExampleNewSteering() {
	s, err := bpf.NewSteering(listenerFDs, &bpf.Options{Policy: bpf.PolicyCPU})
	switch {
	case errors.Is(err, bpf.ErrPermission), errors.Is(err, bpf.ErrNotSupported):
		log.Printf("no BPF steering, the kernel's reuseport hash decides: %v", err)
		return
	case err != nil:
		log.Fatal(err)
	}
	defer s.Close()
	for cpu := 0; cpu < s.Queues(); cpu++ {
		s.SetCPUQueue(cpu, cpu) // a SYN received on CPU c goes to queue c
	}
	// Pin one peer to queue 0 and stop new connections on the last queue.
	s.SetFlow(bpf.FlowKey{
		Remote: netip.MustParseAddrPort("192.0.2.7:0"),
		Local:  netip.MustParseAddrPort("198.51.100.1:8080"),
	}, 0)
	s.Drain(s.Queues()-1, true)
}
