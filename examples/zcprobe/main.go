// Command zcprobe prints zcnet's capability report for this machine: what the kernel and
// process can do (io_uring, SEND_ZC, mapped receive, BPF steering, the zcshim module), then
// one section per network device of the current namespace (hwq's per-NIC report: queues,
// header split, ntuple, RSS, zcrx, devmem, AF_XDP zero-copy, hardware timestamps, and
// whether the NIC is "special"), each answer with its reason, and last whether the kernel
// carries TLS records (zc/ztls: the ciphers it accepts, or what is missing).
//
// Whether zero-copy sends are real (the kernel does not copy them after all, as it does on
// loopback and veth) depends on the path to a peer, so it takes one: run
//
//	zcprobe -zc-sink 10.0.0.2:9999          # on the peer: read and discard
//	zcprobe -zc-tx 10.0.0.2:9999            # here: MSG_ZEROCOPY sends to it
//
// and -zc-tx adds a line "zero-copy TX 10.0.0.1:40000 (eth1) -> 10.0.0.2:9999: real (16 of
// 16 notifications not copied, 1048576 bytes)" (tcpglue.ProbeZeroCopyTX) to the report;
// -zc-from picks the local address (and so the interface), for each pair of interfaces.
package main

import (
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"time"

	"github.com/zcnet/zcnet/tcpglue"
	"github.com/zcnet/zcnet/zc/caps"
)

func main() {
	tx := flag.String("zc-tx", "", "probe zero-copy TX to this `addr:port` (a zcprobe -zc-sink)")
	from := flag.String("zc-from", "", "with -zc-tx: send from this local `addr`")
	sink := flag.String("zc-sink", "", "read and discard connections on this `addr:port` (until killed)")
	size := flag.Int("zc-bytes", 1<<20, "with -zc-tx: bytes to send")
	flag.Parse()
	if *sink != "" {
		if err := runSink(*sink); err != nil {
			fmt.Fprintln(os.Stderr, "zcprobe:", err)
			os.Exit(1)
		}
		return
	}
	fmt.Print(caps.Probe())
	sup, err := tcpglue.ProbeTLS()
	switch {
	case err != nil:
		fmt.Printf("%-14s no: %v\n", "kernel tls", err)
	case sup.Missing() != "":
		fmt.Printf("%-14s partly: the kernel refuses %s\n", "kernel tls", sup.Missing())
	default:
		fmt.Printf("%-14s yes (AES-128-GCM, AES-256-GCM, ChaCha20-Poly1305; TLS 1.2 and 1.3)\n", "kernel tls")
	}
	if *tx != "" {
		r, err := probeTX(*from, *tx, *size)
		if err != nil {
			fmt.Fprintln(os.Stderr, "zcprobe:", err)
			os.Exit(1)
		}
		fmt.Println(r)
	}
}

func probeTX(from, to string, n int) (tcpglue.ZeroCopyTXReport, error) {
	dst, err := tcpglue.Resolve("tcp", to)
	if err != nil {
		return tcpglue.ZeroCopyTXReport{}, err
	}
	var src netip.AddrPort
	if from != "" {
		a, err := netip.ParseAddr(from)
		if err != nil {
			return tcpglue.ZeroCopyTXReport{}, err
		}
		src = netip.AddrPortFrom(a, 0)
	}
	return tcpglue.ProbeZeroCopyTX(src, dst, n, 30*time.Second)
}

func runSink(addr string) error {
	l, err := tcpglue.Listen("tcp", addr, tcpglue.ListenOptions{})
	if err != nil {
		return err
	}
	defer l.Close()
	for {
		s, _, err := l.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer s.Close()
			io.Copy(io.Discard, s)
		}()
	}
}
