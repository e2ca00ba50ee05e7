package testutil

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// CompareWithC compares values the Go side hard-codes with C: checks maps a C expression
// (a sizeof, an offsetof, a constant) to the Go value for it. It compiles a C program that
// includes <stdio.h>, <stddef.h> and then headers (in order, each as <h>) and prints every
// expression as an unsigned long long, and fails the test for each one whose value differs.
// cflags go to gcc before the source (-I directories). It skips the test when gcc is not
// installed, and fails it when the program does not build or run: the caller looks for the
// headers it needs first.
func CompareWithC(t testing.TB, headers, cflags []string, checks map[string]uint64) {
	t.Helper()
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not installed")
	}
	var src strings.Builder
	for _, h := range append([]string{"stdio.h", "stddef.h"}, headers...) {
		fmt.Fprintf(&src, "#include <%s>\n", h)
	}
	src.WriteString("int main(void) {\n")
	exprs := slices.Sorted(maps.Keys(checks))
	for _, e := range exprs {
		fmt.Fprintf(&src, "\tprintf(\"%%llu\\n\", (unsigned long long)(%s));\n", e)
	}
	src.WriteString("\treturn 0;\n}\n")
	dir := t.TempDir()
	cfile, bin := filepath.Join(dir, "abi.c"), filepath.Join(dir, "abi")
	if err := os.WriteFile(cfile, []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append(append([]string{}, cflags...), "-o", bin, cfile)
	if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	vals := strings.Fields(string(out))
	if len(vals) != len(exprs) {
		t.Fatalf("got %d values for %d checks", len(vals), len(exprs))
	}
	for i, e := range exprs {
		v, err := strconv.ParseUint(vals[i], 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", e, err)
		}
		if v != checks[e] {
			t.Errorf("%s: C says %d, Go says %d", e, v, checks[e])
		}
	}
}
