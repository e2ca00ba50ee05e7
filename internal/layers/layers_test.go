// Package layers holds one test: imports point downward only (ARCHITECTURE.md, "Layers").
package layers

import (
	"go/build"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/zcnet/zcnet/"

// forbidden lists, per package prefix (relative to the module), the prefixes it must not
// import: the ring and the loop know nothing of the packages above them (memory regions,
// NICs, sockets, BPF, the connection core); those packages know nothing of the ring, the
// loop or the shim; nothing below zc imports zc.
var forbidden = []struct {
	pkg  string
	deny []string
}{
	{"internal/uring", []string{"internal/loop", "memreg", "hwq", "tcpglue", "bpf", "zc", "internal/zcrx", "kmod"}},
	{"internal/loop", []string{"memreg", "hwq", "tcpglue", "bpf", "zc", "internal/zcrx", "kmod"}},
	{"kmod", []string{"internal/loop", "memreg", "hwq", "tcpglue", "bpf", "zc", "internal/zcrx"}},
	{"memreg", []string{"internal/uring", "internal/loop", "internal/zcrx", "kmod", "hwq", "tcpglue", "bpf", "zc"}},
	{"tcpglue", []string{"internal/uring", "internal/loop", "internal/zcrx", "kmod", "memreg", "hwq", "bpf", "zc"}},
	{"bpf", []string{"internal/uring", "internal/loop", "internal/zcrx", "kmod", "memreg", "zc"}},
	{"hwq", []string{"internal/uring", "internal/loop", "internal/zcrx", "kmod", "zc"}},
	{"internal/zcrx", []string{"zc"}},
	// the handshake-to-kernel-keys code shared by zc and zc/ztls: crypto/tls and tcpglue only
	{"internal/ktls", []string{"internal/uring", "internal/loop", "internal/zcrx", "kmod", "memreg", "hwq", "bpf", "zc"}},
	// the TLS face: crypto/tls, tcpglue's socket options and zc's public API only
	{"zc/ztls", []string{"internal/uring", "internal/loop", "internal/zcrx", "kmod", "memreg", "hwq", "bpf", "zc/internal"}},
	// the net.Conn face and the framed Reader: zc's public API only (issue 30)
	{"zc/netconn", []string{"internal", "kmod", "memreg", "hwq", "bpf", "tcpglue", "zc/internal", "zc/framed", "zc/caps"}},
	{"zc/framed", []string{"internal", "kmod", "memreg", "hwq", "bpf", "tcpglue", "zc/internal", "zc/netconn", "zc/caps"}},
	// the capability report probes the layers below; it needs no engine
	{"zc/caps", []string{"internal/loop", "internal/zcrx", "memreg", "zc/internal", "zc/netconn", "zc/framed", "zc/ztls"}},
	// the connection state machine is a leaf: it imports nothing of the module
	{"zc/internal/connstate", []string{"internal", "memreg", "hwq", "tcpglue", "bpf", "kmod", "zc"}},
}

// under reports whether path (relative to the module) is prefix or a package below it.
func under(path, prefix string) bool { return path == prefix || strings.HasPrefix(path, prefix+"/") }

func TestImportsPointDown(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatal(err)
	}
	checked := 0
	err = filepath.WalkDir(root, func(dir string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, dir)
		if rel == "bench" || strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "build" {
			return filepath.SkipDir // bench is its own module; the rest holds no Go package of ours
		}
		pkg, err := build.ImportDir(dir, 0)
		if err != nil {
			return nil // no Go files here
		}
		rel = filepath.ToSlash(rel)
		for _, f := range forbidden {
			if !under(rel, f.pkg) {
				continue
			}
			checked++
			for _, imp := range pkg.Imports {
				if !strings.HasPrefix(imp, module) {
					continue
				}
				imp = strings.TrimPrefix(imp, module)
				for _, deny := range f.deny {
					if under(imp, deny) && !under(imp, rel) {
						t.Errorf("%s imports %s: imports point downward only (ARCHITECTURE.md)", rel, imp)
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 10 {
		t.Fatalf("checked %d packages: the walk did not find the module's packages", checked)
	}
}
