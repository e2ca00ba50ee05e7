package zc

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"regexp"
	"testing"

	"github.com/zcnet/zcnet/bpf"
	"github.com/zcnet/zcnet/internal/uring"
	"github.com/zcnet/zcnet/kmod"
	"github.com/zcnet/zcnet/kmod/shim"
	"github.com/zcnet/zcnet/memreg"
	"github.com/zcnet/zcnet/tcpglue"
)

// One ErrNotSupported: a refusal from any zcnet package matches zc.ErrNotSupported.
func TestOneErrNotSupported(t *testing.T) {
	for name, e := range map[string]error{
		"uring": uring.ErrNotSupported, "memreg": memreg.ErrNotSupported, "tcpglue": tcpglue.ErrNotSupported,
		"bpf": bpf.ErrNotSupported, "kmod": kmod.ErrNotSupported, "shim": shim.ErrNotSupported,
	} {
		if e != ErrNotSupported {
			t.Errorf("%s.ErrNotSupported is not zc.ErrNotSupported", name)
		}
	}
	// Real refusals, where this machine refuses.
	if err := shim.Probe(); err != nil && !errors.Is(err, ErrNotSupported) && !errors.Is(err, shim.ErrABIMismatch) {
		t.Errorf("shim.Probe: %v is neither a refusal nor an ABI mismatch", err)
	}
	if _, err := kmod.Loaded(); err != nil && !errors.Is(err, ErrNotSupported) {
		t.Errorf("kmod.Loaded: %v does not match zc.ErrNotSupported", err)
	}
	if r, err := memreg.New(memreg.Options{BufSize: 4096, Count: 16, HugePages: true, RequireHugePages: true}); err == nil {
		r.Close() // huge pages are reserved here: no refusal to check
	} else {
		if !errors.Is(err, ErrNotSupported) {
			t.Errorf("memreg huge-page refusal %v does not match zc.ErrNotSupported", err)
		}
	}
}

// TestNotSupportedErrorDocFields: NotSupportedError is an alias of an internal type, so go
// doc shows none of its fields under zc; its comment lists them. Every field of the type
// must be in that list (a field added in internal/errs and not here would be invisible to
// a user of zc).
func TestNotSupportedErrorDocFields(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "errors.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var doc string
	for _, d := range f.Decls {
		if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.TYPE {
			for _, s := range g.Specs {
				if s.(*ast.TypeSpec).Name.Name == "NotSupportedError" {
					doc = g.Doc.Text()
				}
			}
		}
	}
	if doc == "" {
		t.Fatal("no doc comment on NotSupportedError in errors.go")
	}
	typ := reflect.TypeFor[NotSupportedError]()
	for i := 0; i < typ.NumField(); i++ {
		fld := typ.Field(i)
		if !fld.IsExported() {
			continue
		}
		if !regexp.MustCompile(`(?m)^\s+` + fld.Name + `\s+` + regexp.QuoteMeta(fld.Type.String()) + `\s`).MatchString(doc) {
			t.Errorf("NotSupportedError's doc does not list its field %s %s:\n%s", fld.Name, fld.Type, doc)
		}
	}
}
