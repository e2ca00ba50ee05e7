package capture

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"unsafe"

	"github.com/zcnet/zcnet/internal/testutil"
)

// TestKernelABI checks the Go side of every layout and constant shared
// with the C programs (capture.h, zcnet.h) by compiling a C program that
// prints them.
func TestKernelABI(t *testing.T) {
	var r captureCapRecord
	var s captureCapIfstats
	var k captureFlowKey
	var cfg captureCapConfig
	cdir, _ := filepath.Abs("../c")
	testutil.CompareWithC(t, []string{"zcnet.h", "capture.h"}, []string{"-I", cdir}, map[string]uint64{
		"sizeof(struct cap_record)":              uint64(unsafe.Sizeof(r)),
		"offsetof(struct cap_record, tstamp)":    uint64(unsafe.Offsetof(r.Tstamp)),
		"offsetof(struct cap_record, hwtstamp)":  uint64(unsafe.Offsetof(r.Hwtstamp)),
		"offsetof(struct cap_record, ifindex)":   uint64(unsafe.Offsetof(r.Ifindex)),
		"offsetof(struct cap_record, len)":       uint64(unsafe.Offsetof(r.Len)),
		"offsetof(struct cap_record, caplen)":    uint64(unsafe.Offsetof(r.Caplen)),
		"offsetof(struct cap_record, queue)":     uint64(unsafe.Offsetof(r.Queue)),
		"offsetof(struct cap_record, drops)":     uint64(unsafe.Offsetof(r.Drops)),
		"offsetof(struct cap_record, cpu)":       uint64(unsafe.Offsetof(r.Cpu)),
		"offsetof(struct cap_record, hook)":      uint64(unsafe.Offsetof(r.Hook)),
		"offsetof(struct cap_record, verdict)":   uint64(unsafe.Offsetof(r.Verdict)),
		"offsetof(struct cap_record, flags)":     uint64(unsafe.Offsetof(r.Flags)),
		"offsetof(struct cap_record, pad)":       uint64(unsafe.Offsetof(r.Pad)),
		"sizeof(struct cap_ifstats)":             uint64(unsafe.Sizeof(s)),
		"offsetof(struct cap_ifstats, pending)":  uint64(unsafe.Offsetof(s.Pending)),
		"sizeof(struct cap_config)":              uint64(unsafe.Sizeof(cfg)),
		"sizeof(struct flow_key)":                uint64(unsafe.Sizeof(k)),
		"offsetof(struct flow_key, remote_port)": uint64(unsafe.Offsetof(k.RemotePort)),
		"offsetof(struct flow_key, proto)":       uint64(unsafe.Offsetof(k.Proto)),
		"CAP_MAX_SNAP":                           MaxSnap,
		"CAP_HOOK_TC_INGRESS":                    rawHookIngress,
		"CAP_HOOK_TC_EGRESS":                     rawHookEgress,
		"CAP_HOOK_XDP":                           rawHookXDP,
		"CAP_F_TRUNCATED":                        flagTruncated,
		"CAP_K_EXACT":                            kindExact,
		"CAP_K_PEER":                             kindPeer,
		"CAP_K_LOCAL":                            kindLocal,
		"CAP_K_PORT":                             kindPort,
	})
	if int(unsafe.Sizeof(r)) != recordHeaderSize {
		t.Errorf("recordHeaderSize %d", recordHeaderSize)
	}

	// The record size classes of capture.bpf.c match sizeClasses (used for
	// the minimum ring size).
	b, err := os.ReadFile("../c/capture.bpf.c")
	if err != nil {
		t.Fatal(err)
	}
	for _, macro := range []string{"CAP_SKB_CLASS", "CAP_XDP_CLASS"} {
		var got []int
		for _, m := range regexp.MustCompile(`(?m)^\s*`+macro+`\((\w+)`).FindAllStringSubmatch(string(b), -1) {
			n, err := strconv.Atoi(m[1])
			if m[1] == "CAP_MAX_SNAP" {
				n, err = MaxSnap, nil
			}
			if err != nil {
				continue // the macro's definition
			}
			got = append(got, n)
		}
		if !slices.Equal(got, sizeClasses) {
			t.Errorf("%s classes in capture.bpf.c: %v, sizeClasses %v", macro, got, sizeClasses)
		}
	}
}
