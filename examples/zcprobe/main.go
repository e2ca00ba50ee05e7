// Command zcprobe prints zcnet's capability report for this machine: what the kernel and
// process can do (io_uring, SEND_ZC, mapped receive, BPF steering, the zcshim module), then
// one section per network device of the current namespace (hwq's per-NIC report: queues,
// header split, ntuple, RSS, zcrx, devmem, AF_XDP zero-copy, hardware timestamps, and
// whether the NIC is "special"), each answer with its reason, and last whether the kernel
// carries TLS records (zc/ztls: the ciphers it accepts, or what is missing).
package main

import (
	"fmt"

	"github.com/zcnet/zcnet/tcpglue"
	"github.com/zcnet/zcnet/zc"
)

func main() {
	fmt.Print(zc.Probe())
	sup, err := tcpglue.ProbeTLS()
	switch {
	case err != nil:
		fmt.Printf("%-14s no: %v\n", "kernel tls", err)
	case sup.Missing() != "":
		fmt.Printf("%-14s partly: the kernel refuses %s\n", "kernel tls", sup.Missing())
	default:
		fmt.Printf("%-14s yes (AES-128-GCM, AES-256-GCM, ChaCha20-Poly1305; TLS 1.2 and 1.3)\n", "kernel tls")
	}
}
