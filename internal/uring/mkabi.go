//go:build ignore

// mkabi generates zabi_linux.go, the io_uring ABI (constants and structure layouts), from
// the pinned Linux 7.3 uapi headers: `go tool cgo -godefs` evaluates types_uring.go against
// them and mkabi renames the fields to Go names (the table below), keeps the comments of
// types_uring.go and gofmts the result. Run by `go generate ./internal/uring` (writes) and
// by `make uring-abi-check` (-check: regenerate and fail on any difference from the
// committed file).
//
// The headers: $ZCNET_UAPI73 (an include directory), else ../../build/uapi73/usr/include
// (make uapi73).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
)

const (
	input  = "types_uring.go"
	output = "zabi_linux.go"
)

// fieldNames renames the fields cgo names after the C members where the general rule
// (goName) does not give the name the package uses: the first member of a union, or an
// anonymous union cgo turns into bytes. Each entry must match a field cgo produced, so a
// header that renames or drops a member fails the generator instead of passing silently.
var fieldNames = map[string]map[string]string{
	"SQE": {
		"Ioprio":       "IoPrio",
		"Rw_flags":     "OpFlags",
		"Splice_fd_in": "FileIndex",
		// The union of addr3 + __pad2[1] (and optval, cmd[]): 16 bytes.
		"Anon0": "Addr3 uint64; pad2 uint64",
	},
	"CQE":       {"Data": "UserData"},                         // cgo strips user_ as a common prefix
	"Iovec":     {"Base": "Base uint64"},                      // an address the kernel reads, never a Go pointer
	"ZcrxStats": {"Count": "CopyCount", "Bytes": "CopyBytes"}, // cgo strips copy_
	"zcrxCtrl":  {"Zc_export": "Arg [6]uint64"},               // the union of the control operations' arguments (48 bytes)
}

// initialisms are the words goName writes in capitals.
var initialisms = map[string]string{"sq": "SQ", "cq": "CQ", "wq": "WQ", "cpu": "CPU", "id": "ID", "cqes": "CQEs"}

// goName turns cgo's name of a C member (Ring_mask, X__resv2) into the package's (RingMask,
// Resv2).
func goName(n string) string {
	n = strings.TrimLeft(strings.TrimPrefix(n, "X"), "_")
	var b strings.Builder
	for _, w := range strings.Split(n, "_") {
		if w == "" {
			continue
		}
		if s, ok := initialisms[strings.ToLower(w)]; ok {
			b.WriteString(s)
			continue
		}
		b.WriteString(strings.ToUpper(w[:1]) + w[1:])
	}
	return b.String()
}

func main() {
	check := flag.Bool("check", false, "regenerate and compare with "+output+" instead of writing it")
	flag.Parse()
	inc := os.Getenv("ZCNET_UAPI73")
	if inc == "" {
		inc = filepath.Join("..", "..", "build", "uapi73", "usr", "include")
	}
	if _, err := os.Stat(filepath.Join(inc, "linux", "io_uring", "zcrx.h")); err != nil {
		fail("no Linux 7.3 uapi headers at %s (run make uapi73, or set ZCNET_UAPI73): %v", inc, err)
	}
	src, err := generate(inc)
	if err != nil {
		fail("%v", err)
	}
	if *check {
		old, err := os.ReadFile(output)
		if err != nil {
			fail("%v", err)
		}
		if !bytes.Equal(old, src) {
			tmp := filepath.Join(os.TempDir(), "zabi_linux.go.new")
			os.WriteFile(tmp, src, 0o644)
			diff, _ := exec.Command("diff", "-u", output, tmp).CombinedOutput()
			fail("%s differs from what the headers at %s give (run go generate ./internal/uring):\n%s", output, inc, diff)
		}
		return
	}
	if err := os.WriteFile(output, src, 0o644); err != nil {
		fail("%v", err)
	}
}

func fail(f string, a ...any) {
	fmt.Fprintf(os.Stderr, "mkabi: "+f+"\n", a...)
	os.Exit(1)
}

func generate(inc string) ([]byte, error) {
	arch := runtime.GOARCH + "-linux-gnu"
	if runtime.GOARCH == "amd64" {
		arch = "x86_64-linux-gnu"
	}
	obj, err := os.MkdirTemp("", "mkabi")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(obj)
	cmd := exec.Command("go", "tool", "cgo", "-objdir", obj, "-godefs", "--", "-I", inc, "-I", filepath.Join(inc, arch), input)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	defs, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go tool cgo -godefs: %v\n%s", err, stderr.Bytes())
	}

	// cgo's output: the values and struct types, without comments.
	dfs := token.NewFileSet()
	df, err := parser.ParseFile(dfs, "godefs", defs, 0)
	if err != nil {
		return nil, err
	}
	types := map[string]*ast.StructType{}
	values := map[string]ast.Expr{}
	for _, d := range df.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok {
			continue
		}
		for _, s := range g.Specs {
			switch s := s.(type) {
			case *ast.TypeSpec:
				st, ok := s.Type.(*ast.StructType)
				if !ok {
					return nil, fmt.Errorf("%s: cgo gave %T, want a struct", s.Name.Name, s.Type)
				}
				types[s.Name.Name] = st
			case *ast.ValueSpec:
				for i, n := range s.Names {
					values[n.Name] = s.Values[i]
				}
			}
		}
	}

	// The input: names, order and comments.
	ifs := token.NewFileSet()
	in, err := parser.ParseFile(ifs, input, nil, parser.ParseComments)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	out.WriteString("// Code generated by mkabi.go; DO NOT EDIT.\n" +
		"// From types_uring.go and the uapi headers of Linux 7.3 (linux-libc-dev of\n" +
		"// kmod/vm/kernels/7.3.pin).\n" +
		"//\n" +
		"// Not from the headers, kept by hand in zcrx.go: zcrxMaxRQEntries (IO_RQ_MAX_ENTRIES is\n" +
		"// the kernel's own, not uapi) and ZcrxAreaMask (IORING_ZCRX_AREA_MASK is an expression cgo\n" +
		"// does not evaluate; TestZcrxLayoutAgainst73Header compares it with the header).\n\n")
	out.WriteString("package uring\n")
	for _, d := range in.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok == token.IMPORT {
			continue
		}
		out.WriteString("\n")
		writeDoc(&out, g.Doc)
		fmt.Fprintf(&out, "%s (\n", g.Tok)
		for _, s := range g.Specs {
			switch s := s.(type) {
			case *ast.TypeSpec:
				writeDoc(&out, s.Doc)
				st := types[s.Name.Name]
				if st == nil {
					return nil, fmt.Errorf("cgo gave no type %s", s.Name.Name)
				}
				body, err := structBody(s.Name.Name, st, dfs)
				if err != nil {
					return nil, err
				}
				fmt.Fprintf(&out, "%s struct {\n%s}\n", s.Name.Name, body)
			case *ast.ValueSpec:
				writeDoc(&out, s.Doc)
				for _, n := range s.Names {
					v := values[n.Name]
					if v == nil {
						return nil, fmt.Errorf("cgo gave no value for %s", n.Name)
					}
					fmt.Fprintf(&out, "%s = %s", n.Name, node(dfs, v))
					if s.Comment != nil {
						fmt.Fprintf(&out, " // %s", strings.TrimSpace(s.Comment.Text()))
					}
					out.WriteString("\n")
				}
			}
		}
		out.WriteString(")\n")
	}
	return format.Source(out.Bytes())
}

func structBody(name string, st *ast.StructType, fs *token.FileSet) (string, error) {
	renames := fieldNames[name]
	used := map[string]bool{}
	var b strings.Builder
	for _, f := range st.Fields.List {
		typ := node(fs, f.Type)
		for _, n := range f.Names {
			if arr, ok := f.Type.(*ast.ArrayType); ok && isZero(arr.Len) {
				continue // a flexible array member: no Go field (it would pad the struct)
			}
			if r, ok := renames[n.Name]; ok {
				used[n.Name] = true
				if strings.Contains(r, " ") {
					for _, part := range strings.Split(r, ";") {
						b.WriteString("\t" + strings.TrimSpace(part) + "\n")
					}
					continue
				}
				fmt.Fprintf(&b, "\t%s %s\n", r, typ)
				continue
			}
			if strings.HasPrefix(n.Name, "Anon") {
				return "", fmt.Errorf("%s.%s: an anonymous union with no name in mkabi's table", name, n.Name)
			}
			fmt.Fprintf(&b, "\t%s %s\n", goName(n.Name), typ)
		}
	}
	var missing []string
	for k := range renames {
		if !used[k] {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return "", fmt.Errorf("%s: mkabi renames %v, which cgo did not produce (did the header change?)", name, missing)
	}
	return b.String(), nil
}

func isZero(e ast.Expr) bool {
	l, ok := e.(*ast.BasicLit)
	return ok && (l.Value == "0" || l.Value == "0x0")
}

func node(fs *token.FileSet, n ast.Node) string {
	var b bytes.Buffer
	printer.Fprint(&b, fs, n)
	return b.String()
}

func writeDoc(b *bytes.Buffer, g *ast.CommentGroup) {
	if g == nil {
		return
	}
	for _, c := range g.List {
		b.WriteString(c.Text + "\n")
	}
}
