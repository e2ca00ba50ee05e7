// Command apigolden lists the exported API of the library's public packages, one declaration
// a line, so that a change of it shows in a diff and is deliberate (make lint, issue 30):
//
//	go run ./internal/testutil/apigolden -check doc/api.txt   # fail on any difference
//	go run ./internal/testutil/apigolden -write doc/api.txt   # accept the current API
//
// A line is "package: kind name signature": funcs with their signatures, types with their
// kind, the exported fields of structs and the methods of interfaces, methods of exported
// types (pointer receivers written (*T)), constants and variables by name. It reads the
// packages' Go files with go/parser (test files and other build tags' files excluded by
// go/build's context for linux/amd64), so it needs nothing beyond the standard library.
// -counts prints the number of exported identifiers per package: declarations plus methods
// and fields, then declarations and methods alone (the figure issue 30 bounds for zc: at most
// 150).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// public are the library's packages whose API is a promise: everything in the module but
// internal/, examples/, commands and kmod's VM tools.
func public() ([]string, error) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{.Dir}} {{.Name}}", "./...").Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w", err)
	}
	var pkgs []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[2] == "main" || strings.Contains(f[0], "/internal") ||
			strings.Contains(f[0], "/examples") || strings.Contains(f[0], "/vm/") {
			continue
		}
		pkgs = append(pkgs, f[0]+" "+f[1])
	}
	return pkgs, nil
}

func main() {
	check := flag.String("check", "", "compare with this golden `file` and fail on a difference")
	write := flag.String("write", "", "write the API to this golden `file`")
	counts := flag.Bool("counts", false, "print the number of exported identifiers per package")
	flag.Parse()
	pkgs, err := public()
	if err != nil {
		fmt.Fprintln(os.Stderr, "apigolden:", err)
		os.Exit(2)
	}
	var all []string
	for _, p := range pkgs {
		path, dir, _ := strings.Cut(p, " ")
		lines, err := api(path, dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, "apigolden:", err)
			os.Exit(2)
		}
		if *counts {
			decls := 0 // declarations and methods, fields not counted (issue 30's figure)
			for _, l := range lines {
				if !strings.Contains(l, ": field ") && !strings.Contains(l, ": embedded ") {
					decls++
				}
			}
			fmt.Printf("%5d %5d %s\n", len(lines), decls, path)
		}
		all = append(all, lines...)
	}
	text := strings.Join(all, "\n") + "\n"
	switch {
	case *write != "":
		if err := os.WriteFile(*write, []byte(text), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "apigolden:", err)
			os.Exit(2)
		}
	case *check != "":
		old, err := os.ReadFile(*check)
		if err != nil {
			fmt.Fprintln(os.Stderr, "apigolden:", err)
			os.Exit(2)
		}
		if string(old) != text {
			was := strings.Split(strings.TrimSpace(string(old)), "\n")
			for _, l := range all {
				if !slices.Contains(was, l) {
					fmt.Println("+ " + l)
				}
			}
			for _, l := range was {
				if !slices.Contains(all, l) {
					fmt.Println("- " + l)
				}
			}
			fmt.Fprintf(os.Stderr, "apigolden: the exported API differs from %s (above: + new, - gone); if it is meant, run: go run ./internal/testutil/apigolden -write %s\n", *check, *check)
			os.Exit(1)
		}
	case !*counts:
		fmt.Print(text)
	}
}

// api lists the exported declarations of the package in dir.
func api(path, dir string) ([]string, error) {
	ctx := build.Default
	ctx.GOOS, ctx.GOARCH, ctx.CgoEnabled = "linux", "amd64", true
	bp, err := ctx.ImportDir(dir, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	fset := token.NewFileSet()
	var lines []string
	add := func(format string, args ...any) {
		lines = append(lines, path+": "+fmt.Sprintf(format, args...))
	}
	str := func(n ast.Node) string {
		var b bytes.Buffer
		printer.Fprint(&b, fset, n)
		return strings.Join(strings.Fields(b.String()), " ")
	}
	for _, name := range slices.Concat(bp.GoFiles, bp.CgoFiles) {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Recv == nil {
					add("func %s%s", d.Name.Name, strings.TrimPrefix(str(d.Type), "func"))
					continue
				}
				recv := str(d.Recv.List[0].Type)
				if base := strings.TrimPrefix(recv, "*"); !ast.IsExported(strings.SplitN(base, "[", 2)[0]) {
					continue
				}
				add("method (%s) %s%s", recv, d.Name.Name, strings.TrimPrefix(str(d.Type), "func"))
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if !s.Name.IsExported() {
							continue
						}
						switch t := s.Type.(type) {
						case *ast.StructType:
							add("type %s struct", s.Name.Name)
							var fields func(prefix string, st *ast.StructType)
							fields = func(prefix string, st *ast.StructType) {
								for _, fl := range st.Fields.List {
									for _, n := range fl.Names {
										if !n.IsExported() {
											continue
										}
										// A group declared inline (Stats.Send struct{...}):
										// its fields a line each, as a named type's are.
										if in, ok := fl.Type.(*ast.StructType); ok {
											add("field %s.%s struct", prefix, n.Name)
											fields(prefix+"."+n.Name, in)
											continue
										}
										add("field %s.%s %s", prefix, n.Name, str(fl.Type))
									}
									if len(fl.Names) == 0 {
										add("embedded %s.%s", prefix, str(fl.Type))
									}
								}
							}
							fields(s.Name.Name, t)
						case *ast.InterfaceType:
							add("type %s interface", s.Name.Name)
							for _, m := range t.Methods.List {
								for _, n := range m.Names {
									if n.IsExported() {
										add("method %s.%s%s", s.Name.Name, n.Name, strings.TrimPrefix(str(m.Type), "func"))
									}
								}
								if len(m.Names) == 0 {
									add("embedded %s.%s", s.Name.Name, str(m.Type))
								}
							}
						default:
							eq := " "
							if s.Assign.IsValid() {
								eq = " = "
							}
							add("type %s%s%s", s.Name.Name, eq, str(s.Type))
						}
					case *ast.ValueSpec:
						kind := "var"
						if d.Tok == token.CONST {
							kind = "const"
						}
						for _, n := range s.Names {
							if n.IsExported() {
								add("%s %s", kind, n.Name)
							}
						}
					}
				}
			}
		}
	}
	slices.Sort(lines)
	return lines, nil
}
