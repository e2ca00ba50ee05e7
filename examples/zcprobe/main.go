// Command zcprobe prints zcnet's capability report for this machine: what the kernel and
// process can do (io_uring, SEND_ZC, mapped receive, BPF steering, the zcshim module), then
// one section per network device of the current namespace (hwq's per-NIC report: queues,
// header split, ntuple, RSS, zcrx, devmem, AF_XDP zero-copy, hardware timestamps, and
// whether the NIC is "special"), each answer with its reason.
package main

import (
	"fmt"

	"github.com/zcnet/zcnet/zc"
)

func main() {
	fmt.Print(zc.Probe())
}
