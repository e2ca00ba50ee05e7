package bpf

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
)

// Probe reports whether this process can use the steering programs: nil,
// or an *OpError matching ErrPermission (not privileged enough) or
// ErrNotSupported (the kernel lacks a program type, map type or helper).
// Like cilium/ebpf's features package, only nil and those two are
// conclusive; other errors mean the probe itself failed. A caller that
// gets an error should fall back to plain SO_REUSEPORT hashing and say so.
func Probe() error {
	for _, pt := range []ebpf.ProgramType{ebpf.SkReuseport, ebpf.SockOps, ebpf.XDP, ebpf.SchedCLS} {
		if err := features.HaveProgramType(pt); err != nil {
			return opErr(fmt.Sprintf("probe program type %s", pt), err)
		}
	}
	for _, mt := range []ebpf.MapType{ebpf.ReusePortSockArray, ebpf.CPUMap, ebpf.LPMTrie, ebpf.LRUHash, ebpf.PerCPUArray} {
		if err := features.HaveMapType(mt); err != nil {
			return opErr(fmt.Sprintf("probe map type %s", mt), err)
		}
	}
	if err := features.HaveProgramHelper(ebpf.SkReuseport, asm.FnSkSelectReuseport); err != nil {
		return opErr("probe helper bpf_sk_select_reuseport", err)
	}
	if err := features.HaveProgramHelper(ebpf.SockOps, asm.FnSetsockopt); err != nil {
		return opErr("probe helper bpf_setsockopt", err)
	}
	return nil
}
