package zc

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Issue 30's kernel floor: zc makes no raw system call outside its backends. A call on a
// socket is a method of the tcpglue.Socket that owns the descriptor; a call on a descriptor
// no Socket owns (a pipe, a file, a duplicate) goes through internal/rawfd; threads and CPUs
// through internal/loop; locked-memory limits through internal/memregops. The backends are
// the floor themselves and keep theirs: since issue 30's stage 2 they are packages under
// zc/internal/be (backendImports), so the root holds none of them and may make no raw call.
// No root file is exempt: the last one, readfrom.go (ReadFrom's sendfile, splice through a
// pipe, and its wait for room), calls tcpglue.Socket's SendFile, SpliceFrom and WaitWritable
// and internal/rawfd's Pipe, Splice and Read since session 13.

// rawConversions are unix's (and syscall's) types a call expression converts to: not calls.
var rawConversions = map[string]bool{"Errno": true, "Signal": true}

// rawCalls lists the calls of golang.org/x/sys/unix and syscall functions in f.
func rawCalls(fset *token.FileSet, f *ast.File) []string {
	names := map[string]bool{}
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		if path != "golang.org/x/sys/unix" && path != "syscall" {
			continue
		}
		name := filepath.Base(path)
		if imp.Name != nil {
			name = imp.Name.Name
		}
		names[name] = true
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if x, ok := sel.X.(*ast.Ident); ok && names[x.Name] && !rawConversions[sel.Sel.Name] {
			out = append(out, fset.Position(call.Pos()).String()+": "+x.Name+"."+sel.Sel.Name)
		}
		return true
	})
	return out
}

// TestNoRawCallsOutsideBackends fails on a raw unix or syscall call in any of zc's root files.
// The backends' packages (zc/internal/be/...) may make them; the scan counts theirs, so that
// it sees something.
func TestNoRawCallsOutsideBackends(t *testing.T) {
	fset, files := parseZC(t)
	if len(files) < 20 {
		t.Fatalf("parsed %d files: the scan would see nothing", len(files))
	}
	backends := 0
	for dir := range backendImports {
		names, err := filepath.Glob(filepath.Join(strings.TrimPrefix(dir, "zc/"), "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			f, err := parser.ParseFile(fset, name, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			backends += len(rawCalls(fset, f))
		}
	}
	for _, f := range files {
		for _, c := range rawCalls(fset, f) {
			t.Errorf("raw system call outside the backends: %s (use the tcpglue.Socket that owns the descriptor, or internal/rawfd)", c)
		}
	}
	if backends == 0 {
		t.Error("no raw call found in the backends: the scan sees nothing")
	}
}

// TestRawCallScanFinds: the scan catches a call under any import name and passes over
// conversions and other packages' calls.
func TestRawCallScanFinds(t *testing.T) {
	src := `package zc
import (
	sys "golang.org/x/sys/unix"
	"syscall"
	"os"
)
func f(fd int) error {
	sys.Close(fd)
	_ = sys.Errno(4)
	syscall.Syscall(0, 0, 0, 0)
	return os.Remove("x")
}`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "x.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := rawCalls(fset, f)
	if len(got) != 2 || !strings.HasSuffix(got[0], "sys.Close") || !strings.HasSuffix(got[1], "syscall.Syscall") {
		t.Fatalf("rawCalls = %v, want sys.Close and syscall.Syscall", got)
	}
}
