// Command zccap captures the TCP flows of a listening socket (address:port)
// to a pcapng file for a while, with zcnet's BPF capture programs:
//
//	zccap -listen 127.0.0.1:9000 -d 10s -w out.pcapng
//	zccap -listen 10.0.0.1:443 -i eth1 -snap 128 -hooks xdp,egress
//
// The interfaces default to the one holding the listener's address (lo
// for loopback); a wildcard address needs -i. It prints each interface's
// timestamping abilities first and the counters at the end. Needs root
// (CAP_BPF and CAP_NET_ADMIN).
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/zcnet/zcnet/bpf/capture"
)

func main() {
	listen := flag.String("listen", "", "the listener's address:port (required)")
	ifs := flag.String("i", "", "interfaces, comma-separated (default: the one holding the listener's address)")
	dur := flag.Duration("d", 10*time.Second, "how long to capture (Ctrl-C stops earlier)")
	out := flag.String("w", "zccap.pcapng", "output file")
	snap := flag.Int("snap", capture.MaxSnap, fmt.Sprintf("bytes kept per packet, 1..%d", capture.MaxSnap))
	ring := flag.Int("ring", 0, "BPF ring buffer size in bytes (power of two; 0 = default)")
	hooks := flag.String("hooks", "ingress,egress", "where to capture: ingress, egress, xdp")
	flag.Parse()
	if err := run(*listen, *ifs, *dur, *out, *snap, *ring, *hooks); err != nil {
		fmt.Fprintln(os.Stderr, "zccap:", err)
		os.Exit(1)
	}
}

func run(listen, ifs string, dur time.Duration, out string, snap, ring int, hookList string) error {
	addr, err := netip.ParseAddrPort(listen)
	if err != nil {
		return fmt.Errorf("-listen %q: %w", listen, err)
	}
	idx, err := interfaces(ifs, addr.Addr())
	if err != nil {
		return err
	}
	var hooks capture.Hook
	for _, h := range strings.Split(hookList, ",") {
		switch strings.TrimSpace(h) {
		case "ingress":
			hooks |= capture.HookIngress
		case "egress":
			hooks |= capture.HookEgress
		case "xdp":
			hooks |= capture.HookXDP
		default:
			return fmt.Errorf("-hooks: unknown hook %q (ingress, egress, xdp)", h)
		}
	}
	for _, i := range idx {
		info, err := capture.ProbeInterface(i)
		if err != nil {
			return err
		}
		fmt.Printf("%s (ifindex %d): timestamps %s\n", info.Name, info.Index, info.Timestamps())
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	c, err := capture.New(f, capture.Options{Interfaces: idx, Hooks: hooks, Snap: snap, RingSize: ring,
		Comment: "zccap -listen " + listen}, capture.Listener(addr))
	if err != nil {
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	fmt.Printf("capturing the flows of %v into %s for %v\n", addr, out, dur)
	select {
	case <-time.After(dur):
	case <-sig:
	}
	if err := c.Close(); err != nil {
		return err
	}
	st, _ := c.Stats()
	fmt.Printf("%d packets written (%d seen, %d lost: ring full, %d truncated to %d bytes)\n",
		st.Written, st.Matched, st.Dropped, st.Truncated, snap)
	return f.Close()
}

// interfaces resolves -i, or finds the interface holding addr.
func interfaces(list string, addr netip.Addr) ([]int, error) {
	var out []int
	if list != "" {
		for _, name := range strings.Split(list, ",") {
			ifi, err := net.InterfaceByName(strings.TrimSpace(name))
			if err != nil {
				return nil, fmt.Errorf("-i: %w", err)
			}
			out = append(out, ifi.Index)
		}
		return out, nil
	}
	if addr.IsUnspecified() {
		return nil, errors.New("the listener's address is a wildcard: name the interfaces with -i")
	}
	all, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	for _, ifi := range all {
		addrs, _ := ifi.Addrs()
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Unmap() == addr.Unmap() {
				return []int{ifi.Index}, nil
			}
		}
	}
	return nil, fmt.Errorf("no interface holds %v: name the interfaces with -i", addr)
}
