package zc_test

import (
	"os"
	"strings"
	"testing"
)

// TestReadmeExamples: README.md's code blocks between <!-- NAME:begin --> and
// <!-- NAME:end --> are, line for line (whitespace aside), the code between // NAME:begin
// and // NAME:end in the example that runs them.
func TestReadmeExamples(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := map[string]string{"echo": "example_echo_test.go", "relay": "example_relay_test.go",
		"fanout": "example_fanout_test.go", "publish": "example_fanout_test.go",
		"sendfile": "example_sendfile_test.go", "reader": "framed/example_test.go",
		"new": "example_send_test.go", "send": "example_send_test.go", "netlisten": "netconn/example_test.go",
		"readself": "example_readself_test.go", "sendbytes": "example_sendbytes_test.go",
		"tls": "example_tls_test.go"}
	for name, file := range blocks {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		ex := codeBetween(t, string(src), "// "+name+":begin", "// "+name+":end")
		doc := codeBetween(t, string(readme), "<!-- "+name+":begin -->", "<!-- "+name+":end -->")
		if ex != doc {
			t.Errorf("README.md's %s differs from %s's:\nREADME:\n%s\n\nexample:\n%s", name, file, doc, ex)
		}
	}
	// Every Go block of the README is one of those: none that no test runs.
	s := string(readme)
	for off := 0; ; {
		i := strings.Index(s[off:], "```go")
		if i < 0 {
			break
		}
		at := off + i
		covered := false
		for name := range blocks {
			b, e := strings.Index(s, "<!-- "+name+":begin -->"), strings.Index(s, "<!-- "+name+":end -->")
			if b >= 0 && b < at && at < e {
				covered = true
			}
		}
		if !covered {
			line := strings.Count(s[:at], "\n") + 1
			t.Errorf("README.md:%d: a Go block outside every <!-- NAME:begin/end --> pair: no test runs it", line)
		}
		off = at + len("```go")
	}
}

// codeBetween returns the lines between the markers with their whitespace normalized,
// without blank lines and code fences.
func codeBetween(t *testing.T, s, begin, end string) string {
	t.Helper()
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("markers %q..%q not found", begin, end)
	}
	var out []string
	for _, l := range strings.Split(s[i+len(begin):j], "\n") {
		l = strings.Join(strings.Fields(l), " ")
		if l != "" && !strings.HasPrefix(l, "```") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
