package abi

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

const header = "../../uapi/zcshim.h"

// needTool fails (not skips) when a build tool is missing on a machine
// that should have it: the ABI test is the guard against drift.
func needTool(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Fatalf("%s not found: install it (the ABI test compiles the C header)", name)
	}
}

var goTypes = map[string]any{
	"zcshim_sqe":    Sqe{},
	"zcshim_cqe":    Cqe{},
	"zcshim_setup":  Setup{},
	"zcshim_region": Region{},
	"zcshim_attach": Attach{},
	"zcshim_id":     ID{},
	"zcshim_enter":  Enter{},
	"zcshim_stats":  Stats{},
}

var goConsts = map[string]uint64{
	"ZCSHIM_ABI_VERSION":     ABIVersion,
	"ZCSHIM_MAX_ENTRIES":     MaxEntries,
	"ZCSHIM_MAX_REGIONS":     MaxRegions,
	"ZCSHIM_MAX_REGION_LEN":  MaxRegionLen,
	"ZCSHIM_MAX_SOCKS":       MaxSocks,
	"ZCSHIM_RECV_MAX":        RecvMax,
	"ZCSHIM_OP_NOP":          OpNop,
	"ZCSHIM_OP_SEND":         OpSend,
	"ZCSHIM_OP_RECV":         OpRecv,
	"ZCSHIM_OP_LAST":         OpLast,
	"ZCSHIM_CQE_F_MORE":      CqeFMore,
	"ZCSHIM_CQE_F_NOTIF":     CqeFNotif,
	"ZCSHIM_CQE_F_COPIED":    CqeFCopied,
	"ZCSHIM_REG_READONLY":    RegReadonly,
	"ZCSHIM_ENTER_GETEVENTS": EnterGetevents,
	"ZCSHIM_IOC_SETUP":       IocSetup,
	"ZCSHIM_IOC_REGISTER":    IocRegister,
	"ZCSHIM_IOC_UNREGISTER":  IocUnregister,
	"ZCSHIM_IOC_ATTACH":      IocAttach,
	"ZCSHIM_IOC_DETACH":      IocDetach,
	"ZCSHIM_IOC_ENTER":       IocEnter,
	"ZCSHIM_IOC_STATS":       IocStats,
}

// headerStructs parses the field names of every struct zcshim_* in the
// header, in declaration order.
func headerStructs(t *testing.T) map[string][]string {
	t.Helper()
	src, err := os.ReadFile(header)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	body := regexp.MustCompile(`(?s)struct (zcshim_\w+) \{(.*?)\n\};`)
	field := regexp.MustCompile(`^\s*__[us]\d+\s+(\w+)(\[\d+\])?;`)
	for _, m := range body.FindAllStringSubmatch(string(src), -1) {
		for _, line := range strings.Split(m[2], "\n") {
			if f := field.FindStringSubmatch(line); f != nil {
				out[m[1]] = append(out[m[1]], f[1])
			}
		}
	}
	return out
}

// TestLayout compiles a C program against the header and compares every
// struct size, field offset, field size and constant with the Go side.
func TestLayout(t *testing.T) {
	needTool(t, "gcc")
	structs := headerStructs(t)
	if len(structs) != len(goTypes) {
		t.Fatalf("header has %d structs, Go has %d: regenerate (go generate ./kmod/internal/abi) and update goTypes", len(structs), len(goTypes))
	}
	var c strings.Builder
	c.WriteString("#include <stdio.h>\n#include <stddef.h>\n#include <zcshim.h>\nint main(void){\n")
	for name, fields := range structs {
		fmt.Fprintf(&c, "printf(\"S %s %%zu\\n\", sizeof(struct %s));\n", name, name)
		for i, f := range fields {
			fmt.Fprintf(&c, "printf(\"F %s %d %%zu %%zu\\n\", offsetof(struct %s, %s), sizeof(((struct %s*)0)->%s));\n", name, i, name, f, name, f)
		}
	}
	for name := range goConsts {
		fmt.Fprintf(&c, "printf(\"C %s %%llu\\n\", (unsigned long long)(%s));\n", name, name)
	}
	c.WriteString("return 0;}\n")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "l.c"), []byte(c.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	inc, _ := filepath.Abs("../../uapi")
	bin := filepath.Join(dir, "l")
	if out, err := exec.Command("gcc", "-Wall", "-Werror", "-I", inc, "-o", bin, filepath.Join(dir, "l.c")).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		w := strings.Fields(line)
		num := func(s string) uint64 {
			v, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				t.Fatalf("bad line %q", line)
			}
			return v
		}
		switch w[0] {
		case "S":
			gt := reflect.TypeOf(goTypes[w[1]])
			if gt == nil {
				t.Errorf("struct %s has no Go type", w[1])
				continue
			}
			if uint64(gt.Size()) != num(w[2]) {
				t.Errorf("sizeof(struct %s) = %s in C, %d in Go", w[1], w[2], gt.Size())
			}
			if gt.NumField() != len(structs[w[1]]) {
				t.Errorf("struct %s: %d fields in C, %d in Go", w[1], len(structs[w[1]]), gt.NumField())
			}
		case "F":
			gt := reflect.TypeOf(goTypes[w[1]])
			i := int(num(w[2]))
			if gt == nil || i >= gt.NumField() {
				continue // reported above
			}
			f := gt.Field(i)
			if uint64(f.Offset) != num(w[3]) || uint64(f.Type.Size()) != num(w[4]) {
				t.Errorf("%s.%s: C offset %s size %s, Go %s offset %d size %d", w[1], structs[w[1]][i], w[3], w[4], f.Name, f.Offset, f.Type.Size())
			}
		case "C":
			if goConsts[w[1]] != num(w[2]) {
				t.Errorf("%s = %s in C, %#x in Go", w[1], w[2], goConsts[w[1]])
			}
		}
		checked++
	}
	t.Logf("checked %d sizes, offsets and constants", checked)
}

// TestGeneratedUpToDate regenerates the Go ABI from the header and fails
// if the checked-in file differs.
func TestGeneratedUpToDate(t *testing.T) {
	needTool(t, "gcc")
	dir := t.TempDir()
	cmd := exec.Command("go", "tool", "cgo", "-objdir", dir, "-godefs", "--", "-I../../uapi", "types_zcshim.go")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("cgo -godefs: %v", err)
	}
	gf := exec.Command("gofmt")
	gf.Stdin = bytes.NewReader(out)
	want, err := gf.Output()
	if err != nil {
		t.Fatalf("gofmt: %v", err)
	}
	have, err := os.ReadFile("zabi_linux.go")
	if err != nil {
		t.Fatal(err)
	}
	// The build constraint is added by go:generate; the command line recorded in the header
	// comment differs (-objdir).
	strip := func(b []byte) string {
		var keep []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "//go:build ") || strings.HasPrefix(l, "// cgo ") {
				continue
			}
			keep = append(keep, l)
		}
		return strings.TrimLeft(strings.Join(keep, "\n"), "\n")
	}
	if strip(have) != strip(want) {
		t.Fatal("zabi_linux.go is stale: run go generate ./kmod/internal/abi")
	}
}
