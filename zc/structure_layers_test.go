package zc

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// The layers of zc's root files and the arrows between them (issue 30's "upward arrows").
//
// An arrow A→B is a pair of distinct non-test files of package zc where A uses a name that B
// declares (a type, function, variable, constant, method or struct field of package zc, as
// go/types resolves each identifier of A; imports and other packages' names do not count).
// Each file has a layer, lowest first:
//
//	0 core      Engine, queues, listeners, dials, Conn and its state machine, the send and
//	            receive core, the handler dispatch, config, options and errors, zc's side
//	            of the backends' contract (backend.go), the package doc
//	1 backends  none since issue 30's stage 2: the backends are packages under
//	            zc/internal/be behind zc/internal/becontract, and the compiler keeps their
//	            arrows (TestBackendsStayInTheirPackages); on the base commit be_*.go and
//	            ringpool.go
//	2 features  everything built on the core: Relay, splice, FanOut, Shared, SendFile,
//	            ReadFrom, ReadSelf, mapped and zcrx receive, timers, Debug, steering, TLS,
//	            SendBytes (and, on the base commit, the net.Conn face, Reader, Path, caps)
//
// An arrow is upward when A's layer is below B's: the core naming a backend's or a feature's
// declarations, a backend naming a feature's. Arrows
// within a layer and downward ones are free. TestUpwardArrows prints them and holds their
// count at upwardArrowsBound so it cannot grow; lower the bound when a change removes some.

// upwardArrowsBound is the count of upward arrows at this commit: 0. The last 5 (backend.go's
// adapters and the queue reaching the features a backend serves) go through the core's
// hooks since session 13's floor30b: kernel TLS's facts through Conn.tls (tlsHooks), the
// mapped receive's poll through recv.go's polledRecv, zcrx's ring setup and splice's watch
// epoll as queue parts (hooks.go's ringSetupPart, watchPart). 53 before issue 30's session
// 13 (the core's hooks took 42, the backends' move out of the root 9 more, these 5 the
// rest); bafd2de, the base of issue 30, had 40 by this scan (its own scan, not in the
// repository, said 62 of 217; this one counts 260 arrows there). Issue 30 asks for at most
// half of the base's.
const upwardArrowsBound = 0

// zcLayers gives each non-test file of zc its layer. A file missing here fails the test: a
// new file must say where it stands. The files only bafd2de had are here so the same test
// runs on that commit's source for the comparison.
var zcLayers = map[string]int{
	// core
	"doc.go": 0, "errors.go": 0, "config.go": 0, "options.go": 0, "handler.go": 0, "backend.go": 0,
	"engine.go": 0, "queue.go": 0, "listener.go": 0, "dial.go": 0, "conn.go": 0, "core.go": 0,
	"life.go": 0, "recv.go": 0, "zcpolicy.go": 0,
	"hooks.go": 0,
	"knobs.go": 0, // bafd2de
	// backends only bafd2de (and this branch before stage 2) had in the root
	"be_epoll.go": 1, "be_plain.go": 1, "be_shim.go": 1, "be_uring.go": 1, "ringpool.go": 1,
	// features
	"relay.go": 2, "splice.go": 2, "splice_relay.go": 2, "fanout.go": 2, "shared.go": 2,
	"sendfile.go": 2, "readfrom.go": 2, "readself.go": 2, "mapped.go": 2, "zcrx.go": 2,
	"timer.go": 2, "debug.go": 2, "steer.go": 2, "tls.go": 2, "tls_pump.go": 2, "sendbytes.go": 2,
	// features only bafd2de had in the root
	"netconn.go": 2, "netconn_copy.go": 2, "netconn_direct.go": 2, "reader.go": 2, "path.go": 2,
	"caps.go": 2,
}

var layerNames = []string{"core", "backends", "features"}

// fileArrow is one arrow and the names behind it.
type fileArrow struct {
	from, to string
	names    map[string]bool
}

// zcFileArrows scans zc's non-test files and returns every arrow between them.
func zcFileArrows(t *testing.T) ([]*fileArrow, int) {
	t.Helper()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		if f.Name.Name != "zc" {
			continue
		}
		files = append(files, f)
	}
	// Imports resolve to empty packages: zc's own names resolve, which is all the scan needs
	// (the errors about other packages' names are ignored).
	conf := types.Config{
		Importer: layerImporter(func(path string) (*types.Package, error) {
			return types.NewPackage(path, filepath.Base(path)), nil
		}),
		Error: func(error) {},
	}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Selections: map[*ast.SelectorExpr]*types.Selection{}}
	pkg, _ := conf.Check("github.com/zcnet/zcnet/zc", fset, files, info)
	if n := len(info.Uses); n < 10000 {
		t.Fatalf("the type check resolved only %d names: the scan would see nothing", n)
	}
	arrows := map[[2]string]*fileArrow{}
	for id, obj := range info.Uses {
		if obj == nil || obj.Pkg() != pkg || !obj.Pos().IsValid() {
			continue
		}
		if _, ok := obj.(*types.PkgName); ok {
			continue
		}
		from := filepath.Base(fset.Position(id.Pos()).Filename)
		to := filepath.Base(fset.Position(obj.Pos()).Filename)
		if from == to {
			continue
		}
		k := [2]string{from, to}
		a := arrows[k]
		if a == nil {
			a = &fileArrow{from: from, to: to, names: map[string]bool{}}
			arrows[k] = a
		}
		a.names[objName(obj)] = true
	}
	out := make([]*fileArrow, 0, len(arrows))
	for _, a := range arrows {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].from != out[j].from {
			return out[i].from < out[j].from
		}
		return out[i].to < out[j].to
	})
	return out, len(files)
}

// objName names obj as a reader finds it: T.m for a method or a field, else its name.
func objName(obj types.Object) string {
	if v, ok := obj.(*types.Var); ok && v.IsField() {
		return "." + v.Name()
	}
	if f, ok := obj.(*types.Func); ok {
		if sig, ok := f.Type().(*types.Signature); ok && sig.Recv() != nil {
			rt := sig.Recv().Type()
			if p, ok := rt.(*types.Pointer); ok {
				rt = p.Elem()
			}
			if n, ok := rt.(*types.Named); ok {
				return n.Obj().Name() + "." + f.Name()
			}
			return "." + f.Name()
		}
	}
	return obj.Name()
}

type layerImporter func(string) (*types.Package, error)

func (f layerImporter) Import(path string) (*types.Package, error) { return f(path) }

// upwardArrows returns the arrows from a lower layer to a higher one, and fails the test on
// a file without a layer.
func upwardArrows(t *testing.T, arrows []*fileArrow) []*fileArrow {
	t.Helper()
	var up []*fileArrow
	for _, a := range arrows {
		lf, ok1 := zcLayers[a.from]
		lt, ok2 := zcLayers[a.to]
		if !ok1 || !ok2 {
			t.Fatalf("%s or %s has no layer in zcLayers (structure_layers_test.go): give it one", a.from, a.to)
		}
		if lf < lt {
			up = append(up, a)
		}
	}
	return up
}

func sortedNames(m map[string]bool) []string {
	s := make([]string, 0, len(m))
	for n := range m {
		s = append(s, n)
	}
	sort.Strings(s)
	return s
}

// TestUpwardArrows prints the file-level arrows that point up the layers and holds their
// count at upwardArrowsBound. With ZC_ARROWS=all it prints every arrow.
func TestUpwardArrows(t *testing.T) {
	arrows, nfiles := zcFileArrows(t)
	up := upwardArrows(t, arrows)
	pairs := map[string]int{}
	for _, a := range up {
		pairs[layerNames[zcLayers[a.from]]+"→"+layerNames[zcLayers[a.to]]]++
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d arrows between %d files, %d upward:", len(arrows), nfiles, len(up))
	for _, k := range sortedKeys(pairs) {
		fmt.Fprintf(&sb, " %s %d", k, pairs[k])
	}
	sb.WriteString("\n")
	for _, a := range up {
		fmt.Fprintf(&sb, "  %s (%s) → %s (%s): %d names: %s\n", a.from, layerNames[zcLayers[a.from]], a.to,
			layerNames[zcLayers[a.to]], len(a.names), strings.Join(sortedNames(a.names), " "))
	}
	if os.Getenv("ZC_ARROWS") == "all" {
		sb.WriteString("all arrows:\n")
		for _, a := range arrows {
			fmt.Fprintf(&sb, "  %s → %s: %d\n", a.from, a.to, len(a.names))
		}
	}
	t.Log(sb.String())
	if len(up) > upwardArrowsBound {
		t.Fatalf("%d upward arrows between zc's files, over the bound of %d: a lower layer names a higher one's declarations (listed above)", len(up), upwardArrowsBound)
	}
	if len(up) < upwardArrowsBound {
		t.Logf("%d upward arrows, under the bound of %d: lower upwardArrowsBound to %d", len(up), upwardArrowsBound, len(up))
	}
}

func sortedKeys(m map[string]int) []string {
	s := make([]string, 0, len(m))
	for k := range m {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}
