// Package examples holds small programs built on zcnet's public API:
//
//   - zcprobe prints what this machine can do for zcnet (io_uring features, SEND_ZC, recv
//     bundles, mapped receive, BPF steering, the zcshim module);
//   - echo is an echo server on the event-loop API that forwards received buffers without
//     copying them (Conn.SendData) and prints the engine's counters when it stops;
//   - rawmcast receives one multicast group into raw queues (hwq.RawQueue, AF_XDP) and
//     prints per-source rates while the rest of the interface's traffic goes to the kernel;
//   - rawsend sends Ethernet frames it builds in place in a raw queue's registered buffers;
//   - zccap captures a listener's flows (address:port) to a pcapng file for N seconds with
//     the BPF capture programs of bpf/capture.
package examples
