package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A go test -json stream: one allowed skip, one skip nobody allowed, a pass and a failure.
const stream = `{"Action":"start","Package":"p/a"}
{"Action":"run","Package":"p/a","Test":"TestKernel"}
{"Action":"output","Package":"p/a","Test":"TestKernel","Output":"=== RUN   TestKernel\n"}
{"Action":"output","Package":"p/a","Test":"TestKernel","Output":"    a_test.go:9: not supported here (kernel 6.18.0): zcrx (Linux 7.1+)\n"}
{"Action":"output","Package":"p/a","Test":"TestKernel","Output":"--- SKIP: TestKernel (0.00s)\n"}
{"Action":"skip","Package":"p/a","Test":"TestKernel"}
{"Action":"run","Package":"p/a","Test":"TestProbe/sub"}
{"Action":"output","Package":"p/a","Test":"TestProbe/sub","Output":"    a_test.go:20: BPF steering unavailable\n"}
{"Action":"skip","Package":"p/a","Test":"TestProbe/sub"}
{"Action":"output","Package":"p/a","Test":"TestOK","Output":"    a_test.go:30: chatter\n"}
{"Action":"pass","Package":"p/a","Test":"TestOK"}
{"Action":"output","Package":"p/a","Test":"TestBad","Output":"    a_test.go:40: boom\n"}
{"Action":"fail","Package":"p/a","Test":"TestBad"}
{"Action":"output","Package":"p/a","Output":"FAIL\tp/a\t0.1s\n"}
{"Action":"fail","Package":"p/a"}
`

func TestCollect(t *testing.T) {
	skips, err := collect(strings.NewReader(stream))
	if err != nil {
		t.Fatal(err)
	}
	if len(skips) != 2 || skips[0].Test != "TestKernel" || skips[1].Test != "TestProbe/sub" {
		t.Fatalf("skips %+v", skips)
	}
	if !strings.Contains(skips[0].Reason, "Linux 7.1+") || strings.Contains(skips[0].Reason, "--- SKIP") {
		t.Errorf("reason %q", skips[0].Reason)
	}
}

func TestCheck(t *testing.T) {
	skips, _ := collect(strings.NewReader(stream))
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "allow.txt")
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	rules, err := readAllow(write("# comment\np/a TestKernel # zcrx needs 7.1\np/b TestGone # stale\n"))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if check(&out, skips, rules, "allow.txt") {
		t.Errorf("a skip missing from the list passed:\n%s", out.String())
	}
	for _, want := range []string{"NOT ALLOWED p/a TestProbe/sub: a_test.go:20: BPF steering unavailable", "allowed  p/a TestKernel", "allow.txt:3", "2 skipped, 1 allowed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	rules, _ = readAllow(write("p/a TestKernel # zcrx needs 7.1\np/a TestProbe/* # reason\n"))
	out.Reset()
	if !check(&out, skips, rules, "allow.txt") {
		t.Errorf("every skip allowed, check failed:\n%s", out.String())
	}
	// A pattern's * does not reach into subtests of another depth, and the package counts.
	rules, _ = readAllow(write("p/a TestKernel # r\np/b TestProbe/sub # other package\np/a Test* # top level only\n"))
	out.Reset()
	if check(&out, skips, rules, "allow.txt") {
		t.Errorf("a subtest matched a top-level pattern or another package's entry:\n%s", out.String())
	}
	for _, bad := range []string{"p/a TestKernel\n", "p/a TestKernel #   \n", "p/a # reason\n", "p/a Test[ # reason\n"} {
		if _, err := readAllow(write(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestEcho(t *testing.T) {
	var out, rec bytes.Buffer
	failed, err := echoRun(strings.NewReader(stream+"# build error line\n"), &out, &rec)
	if err != nil || !failed {
		t.Fatalf("failed %v err %v", failed, err)
	}
	s := out.String()
	if !strings.Contains(s, "boom") || !strings.Contains(s, "FAIL\tp/a") || strings.Contains(s, "chatter") || !strings.Contains(s, "# build error line") {
		t.Errorf("echo:\n%s", s)
	}
	if rec.String() != stream+"# build error line\n" {
		t.Error("the record differs from the input")
	}
	failed, _ = echoRun(strings.NewReader(`{"Action":"pass","Package":"p/a","Test":"T"}`+"\n"), &out, &rec)
	if failed {
		t.Error("a passing stream failed")
	}
}
