package zc

import (
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

// The shape issue 18 asks of zc, checked on its source: the backends write only their own
// per-connection state. (The net.Conn face is its own package, zc/netconn, since session 12:
// the compiler holds it to zc's public API.)

// checkZC parses package zc's non-test files and type-checks them for the package's own
// names: imports resolve to empty packages (fast; the type errors that makes are about other
// packages' names and are ignored). It fails the test when the check resolved too little to
// see anything.
func checkZC(t *testing.T) (*token.FileSet, []*ast.File, *types.Package, *types.Info) {
	t.Helper()
	fset, files := parseZC(t)
	conf := types.Config{
		Importer: importerFunc(func(path string) (*types.Package, error) {
			return types.NewPackage(path, filepath.Base(path)), nil
		}),
		Error: func(error) {},
	}
	info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}, Uses: map[*ast.Ident]types.Object{}}
	pkg, _ := conf.Check("github.com/zcnet/zcnet/zc", fset, files, info)
	if n := len(info.Uses); n < 10000 {
		t.Fatalf("the type check resolved only %d names: the check would see nothing", n)
	}
	return fset, files, pkg, info
}

// parseZC parses package zc's non-test files.
func parseZC(t *testing.T) (*token.FileSet, []*ast.File) {
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
		files = append(files, f)
	}
	return fset, files
}

type importerFunc func(path string) (*types.Package, error)

func (f importerFunc) Import(path string) (*types.Package, error) { return f(path) }

// TestBackendsWriteOnlyTheirState holds the backends (be_*.go) to "Conn carries no state a
// backend writes": no assignment in a backend goes through a *Conn. A backend's own
// per-connection state is an object of its own (uringConn, epollConn), which Conn.bk holds
// as an opaque interface; everything else a backend changes goes through the core's reports
// (recvStarted, opEnded, socketClosed ...); no backend calls a transition of the connection's
// state machine (Conn.st). And the core never opens Conn.bk: outside the backends it is only
// assigned, once, where a Conn is made.
func TestBackendsWriteOnlyTheirState(t *testing.T) {
	fset, files, pkg, info := checkZC(t)
	connT := pkg.Scope().Lookup("Conn").Type()
	isConn := func(e ast.Expr) bool {
		tv, ok := info.Types[e]
		if !ok {
			return false
		}
		ty := tv.Type
		if p, ok := ty.(*types.Pointer); ok {
			ty = p.Elem()
		}
		return types.Identical(ty, connT)
	}
	// coreOwned: the core's per-connection types a backend must not write (segments, the
	// sender, the close and dial states).
	coreOwned := func(ty types.Type) bool {
		if p, ok := ty.(*types.Pointer); ok {
			ty = p.Elem()
		}
		n, ok := ty.(*types.Named)
		if !ok || n.Obj().Pkg() != pkg {
			return false
		}
		switch n.Obj().Name() {
		case "seg", "sender", "closeState", "connectState":
			return true
		}
		return false
	}
	// allowed reports whether the written expression does not go through a Conn.
	allowed := func(lhs ast.Expr) bool {
		e := lhs
		for {
			switch x := e.(type) {
			case *ast.SelectorExpr:
				if isConn(x.X) {
					return false
				}
				e = x.X
			case *ast.IndexExpr:
				e = x.X
			case *ast.StarExpr:
				e = x.X
			case *ast.ParenExpr:
				e = x.X
			default:
				return true // not through a Conn
			}
		}
	}
	var bad []string
	checked, bkOutside := 0, 0
	for _, f := range files {
		name := filepath.Base(fset.Position(f.Pos()).Filename)
		if !strings.HasPrefix(name, "be_") {
			// The core: Conn.bk only assigned (newConn), never read.
			ast.Inspect(f, func(n ast.Node) bool {
				switch s := n.(type) {
				case *ast.AssignStmt:
					for _, l := range s.Lhs {
						if sel, ok := l.(*ast.SelectorExpr); ok && sel.Sel.Name == "bk" && isConn(sel.X) {
							bkOutside++
						}
					}
					for _, r := range s.Rhs {
						ast.Inspect(r, func(n ast.Node) bool {
							if sel, ok := n.(*ast.SelectorExpr); ok && sel.Sel.Name == "bk" && isConn(sel.X) {
								bad = append(bad, fset.Position(sel.Pos()).String()+" (the core reads Conn.bk)")
							}
							return true
						})
					}
					return false
				case *ast.SelectorExpr:
					if s.Sel.Name == "bk" && isConn(s.X) {
						bad = append(bad, fset.Position(s.Pos()).String()+" (the core reads Conn.bk)")
					}
				}
				return true
			})
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			var lhs []ast.Expr
			switch s := n.(type) {
			case *ast.AssignStmt:
				if s.Tok == token.DEFINE {
					return true
				}
				lhs = s.Lhs
			case *ast.IncDecStmt:
				lhs = []ast.Expr{s.X}
			case *ast.CallExpr:
				// The state machine moves only by the core: a backend calling one of
				// connstate.State's transitions on a Conn's state moves it.
				if sel, ok := s.Fun.(*ast.SelectorExpr); ok {
					if st, ok := sel.X.(*ast.SelectorExpr); ok && st.Sel.Name == "st" && isConn(st.X) {
						switch sel.Sel.Name {
						case "Open", "BeginClose", "Finish", "ShutWrite", "CloseSock":
							bad = append(bad, fset.Position(s.Pos()).String()+" (moves the connection's state)")
						}
					}
				}
			}
			// A write through a pointer the core handed out (a *seg from pendAt) is a
			// write of the core's state too: no field of the core's types may be
			// assigned here.
			for _, l := range lhs {
				if sel, ok := l.(*ast.SelectorExpr); ok && !isConn(sel.X) {
					if tv, ok := info.Types[sel.X]; ok && coreOwned(tv.Type) {
						bad = append(bad, fset.Position(l.Pos()).String()+" (a field of "+tv.Type.String()+")")
					}
				}
			}
			for _, l := range lhs {
				checked++
				if !allowed(l) {
					bad = append(bad, fset.Position(l.Pos()).String())
				}
			}
			return true
		})
	}
	if checked < 50 || bkOutside != 1 {
		t.Fatalf("%d assignments in be_*.go, %d of Conn.bk outside them (want one, in newConn): the check would see nothing", checked, bkOutside)
	}
	if len(bad) > 0 {
		t.Fatalf("backends write the core's state of a Conn:\n%s", strings.Join(bad, "\n"))
	}
}

// TestBackendsStayInTheirFiles holds the backends' walls inside package zc: nothing outside
// be_*.go names a concrete backend type (no type switch or assertion on one: the core asks
// the queue's capabilities, asserted once in setBackend) nor anything else a backend's file
// declares (their state, helpers: the core reaches a backend only through backend.go's
// interfaces; the engine calls their constructors), and no backend names what another
// backend's file declares (their shared vocabulary is backend.go's; the plain and zcshim
// backends share the epoll base of be_epoll.go).
func TestBackendsStayInTheirFiles(t *testing.T) {
	fset, _, pkg, info := checkZC(t)
	file := func(pos token.Pos) string { return filepath.Base(fset.Position(pos).Filename) }
	isBE := func(name string) bool { return strings.HasPrefix(name, "be_") }
	// A concrete backend: a type with the contract's methods.
	concrete := map[types.Object]bool{}
	for _, name := range pkg.Scope().Names() {
		tn, ok := pkg.Scope().Lookup(name).(*types.TypeName)
		if !ok || tn.IsAlias() {
			continue
		}
		if _, isIface := tn.Type().Underlying().(*types.Interface); isIface {
			continue
		}
		ms := types.NewMethodSet(types.NewPointer(tn.Type()))
		if ms.Lookup(pkg, "armRecv") != nil && ms.Lookup(pkg, "name") != nil && ms.Lookup(pkg, "send") != nil {
			concrete[tn] = true
		}
	}
	if len(concrete) < 3 {
		t.Fatalf("found %d concrete backends (want io_uring, plain, zcshim): the check would see nothing", len(concrete))
	}
	// chooses: where the engine picks a backend (engine.go, caps.go) it calls the backends'
	// constructors and availability probes; nothing else of theirs.
	chooses := func(at string, obj types.Object) bool {
		_, fn := obj.(*types.Func)
		return fn && (at == "engine.go" || at == "caps.go")
	}
	var bad []string
	for id, obj := range info.Uses {
		if obj.Pkg() != pkg || !obj.Pos().IsValid() {
			continue
		}
		at, decl := file(id.Pos()), file(obj.Pos())
		switch {
		case !isBE(at) && concrete[obj]:
			bad = append(bad, fset.Position(id.Pos()).String()+": the core names the backend type "+obj.Name())
		case !isBE(at) && isBE(decl) && obj.Parent() == pkg.Scope() && !chooses(at, obj):
			bad = append(bad, fset.Position(id.Pos()).String()+": the core names "+obj.Name()+" of "+decl)
		case isBE(at) && isBE(decl) && at != decl && decl != "be_epoll.go" && obj.Parent() == pkg.Scope():
			bad = append(bad, fset.Position(id.Pos()).String()+": "+at+" names "+obj.Name()+" of "+decl)
		}
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		t.Fatalf("%d names cross a backend's wall:\n%s", len(bad), strings.Join(bad, "\n"))
	}
}

// TestSegmentKindNotNilChecks: what a send segment sends from is its kind (seg.kind), not
// which of its pointers is nil: no comparison of seg.file or seg.ext with nil in zc.
func TestSegmentKindNotNilChecks(t *testing.T) {
	fset, files, pkg, info := checkZC(t)
	segT := pkg.Scope().Lookup("seg").Type()
	isSeg := func(e ast.Expr) bool {
		tv, ok := info.Types[e]
		if !ok {
			return false
		}
		ty := tv.Type
		if p, ok := ty.(*types.Pointer); ok {
			ty = p.Elem()
		}
		return types.Identical(ty, segT)
	}
	isNil := func(e ast.Expr) bool { id, ok := e.(*ast.Ident); return ok && id.Name == "nil" }
	var bad []string
	kinds := 0
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.BinaryExpr:
				if x.Op != token.EQL && x.Op != token.NEQ {
					return true
				}
				for _, pair := range [][2]ast.Expr{{x.X, x.Y}, {x.Y, x.X}} {
					sel, ok := pair[0].(*ast.SelectorExpr)
					if ok && isNil(pair[1]) && (sel.Sel.Name == "file" || sel.Sel.Name == "ext") && isSeg(sel.X) {
						bad = append(bad, fset.Position(x.Pos()).String())
					}
				}
			case *ast.SelectorExpr:
				if x.Sel.Name == "kind" && isSeg(x.X) {
					kinds++
				}
			}
			return true
		})
	}
	if len(bad) > 0 {
		t.Fatalf("segments told apart by nil checks:\n%s", strings.Join(bad, "\n"))
	}
	if kinds < 5 {
		t.Fatalf("%d uses of seg.kind: the check would see nothing", kinds)
	}
}

// TestRootAPIBound holds the zc root to issue 30's bound: at most 150 exported declarations
// and methods (fields not counted), as doc/api.txt lists them (make lint keeps that file
// equal to the source). Features built on the public API live in their own packages
// (zc/netconn, zc/framed, zc/caps), not in the root.
func TestRootAPIBound(t *testing.T) {
	b, err := os.ReadFile("../doc/api.txt")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(l, "github.com/zcnet/zcnet/zc: ")
		if ok && !strings.HasPrefix(rest, "field ") && !strings.HasPrefix(rest, "embedded ") {
			n++
		}
	}
	if n < 50 {
		t.Fatalf("doc/api.txt lists %d declarations of zc: the count reads nothing", n)
	}
	if n > 150 {
		t.Fatalf("zc exports %d declarations and methods, over issue 30's bound of 150: move, merge or unexport (and say why in the notes)", n)
	}
}
