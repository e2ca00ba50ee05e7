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
	for name, file := range map[string]string{"echo": "example_echo_test.go", "relay": "example_relay_test.go",
		"fanout": "example_fanout_test.go", "publish": "example_fanout_test.go",
		"sendfile": "example_sendfile_test.go", "reader": "example_reader_test.go"} {
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
