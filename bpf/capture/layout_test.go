package capture

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// TestKernelABI checks the Go side of every layout and constant shared
// with the C programs (capture.h, zcnet.h) by compiling a C program that
// prints them.
func TestKernelABI(t *testing.T) {
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not installed")
	}
	var r captureCapRecord
	var s captureCapIfstats
	var k captureFlowKey
	var cfg captureCapConfig
	checks := []struct {
		c   string
		go_ uint64
	}{
		{"sizeof(struct cap_record)", uint64(unsafe.Sizeof(r))},
		{"offsetof(struct cap_record, tstamp)", uint64(unsafe.Offsetof(r.Tstamp))},
		{"offsetof(struct cap_record, hwtstamp)", uint64(unsafe.Offsetof(r.Hwtstamp))},
		{"offsetof(struct cap_record, ifindex)", uint64(unsafe.Offsetof(r.Ifindex))},
		{"offsetof(struct cap_record, len)", uint64(unsafe.Offsetof(r.Len))},
		{"offsetof(struct cap_record, caplen)", uint64(unsafe.Offsetof(r.Caplen))},
		{"offsetof(struct cap_record, queue)", uint64(unsafe.Offsetof(r.Queue))},
		{"offsetof(struct cap_record, drops)", uint64(unsafe.Offsetof(r.Drops))},
		{"offsetof(struct cap_record, cpu)", uint64(unsafe.Offsetof(r.Cpu))},
		{"offsetof(struct cap_record, hook)", uint64(unsafe.Offsetof(r.Hook))},
		{"offsetof(struct cap_record, verdict)", uint64(unsafe.Offsetof(r.Verdict))},
		{"offsetof(struct cap_record, flags)", uint64(unsafe.Offsetof(r.Flags))},
		{"offsetof(struct cap_record, pad)", uint64(unsafe.Offsetof(r.Pad))},
		{"sizeof(struct cap_ifstats)", uint64(unsafe.Sizeof(s))},
		{"offsetof(struct cap_ifstats, pending)", uint64(unsafe.Offsetof(s.Pending))},
		{"sizeof(struct cap_config)", uint64(unsafe.Sizeof(cfg))},
		{"sizeof(struct flow_key)", uint64(unsafe.Sizeof(k))},
		{"offsetof(struct flow_key, remote_port)", uint64(unsafe.Offsetof(k.RemotePort))},
		{"offsetof(struct flow_key, proto)", uint64(unsafe.Offsetof(k.Proto))},
		{"CAP_MAX_SNAP", MaxSnap},
		{"CAP_HOOK_TC_INGRESS", rawHookIngress},
		{"CAP_HOOK_TC_EGRESS", rawHookEgress},
		{"CAP_HOOK_XDP", rawHookXDP},
		{"CAP_F_TRUNCATED", flagTruncated},
		{"CAP_K_EXACT", kindExact},
		{"CAP_K_PEER", kindPeer},
		{"CAP_K_LOCAL", kindLocal},
		{"CAP_K_PORT", kindPort},
	}
	var src strings.Builder
	src.WriteString("#include <stdio.h>\n#include <stddef.h>\n#include \"zcnet.h\"\n#include \"capture.h\"\nint main(void) {\n")
	for _, c := range checks {
		fmt.Fprintf(&src, "\tprintf(\"%%llu\\n\", (unsigned long long)(%s));\n", c.c)
	}
	src.WriteString("\treturn 0;\n}\n")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "abi.c"), []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	cdir, _ := filepath.Abs("../c")
	if out, err := exec.Command(cc, "-I", cdir, "-o", filepath.Join(dir, "abi"), filepath.Join(dir, "abi.c")).CombinedOutput(); err != nil {
		t.Fatalf("compile: %v\n%s", err, out)
	}
	out, err := exec.Command(filepath.Join(dir, "abi")).Output()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(string(out))
	if len(lines) != len(checks) {
		t.Fatalf("%d values for %d checks", len(lines), len(checks))
	}
	for i, c := range checks {
		v, _ := strconv.ParseUint(lines[i], 10, 64)
		if v != c.go_ {
			t.Errorf("%s: C %d, Go %d", c.c, v, c.go_)
		}
	}
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
