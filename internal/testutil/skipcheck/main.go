// Command skipcheck reads the output of go test -json and holds the run's skips to a
// committed, reasoned allow-list: a skip that is not on the list fails, so a capability
// that regresses cannot hide as a skip.
//
//	go test -json ./... | skipcheck -echo -record build/gotest.json
//	skipcheck -allow internal/testutil/skips.txt build/gotest.json [more.json...]
//
// With -echo it prints what go test would have printed without -v (package results and
// the output of failed tests) and exits non-zero when a test or package failed; -record
// keeps the JSON stream. Without -echo it reads the named JSON files, lists every skip
// with its reason, and exits non-zero when a skip is not allowed (or an allow-list line
// has no reason). Allowed entries that did not skip are reported, not failed: another
// machine may have the feature.
//
// The allow-list has one entry a line: the package's import path, the test's full name
// (a path.Match pattern: * stops at /), and a reason after "#". Lines that start with # are
// comments.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
)

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// skip is one skipped test and why.
type skip struct {
	Package, Test, Reason string
}

// rule is one allow-list entry.
type rule struct {
	Package, Test, Reason string
	line                  int
	used                  bool
}

func main() {
	echo := flag.Bool("echo", false, "print go test's usual output from the JSON on stdin")
	record := flag.String("record", "", "with -echo: also write the JSON stream to this file")
	allow := flag.String("allow", "", "the allow-list of skips")
	flag.Parse()
	if *echo {
		var rec io.Writer = io.Discard
		if *record != "" {
			f, err := os.Create(*record)
			if err != nil {
				fatal(err)
			}
			defer f.Close()
			rec = f
		}
		failed, err := echoRun(os.Stdin, os.Stdout, rec)
		if err != nil {
			fatal(err)
		}
		if failed {
			os.Exit(1)
		}
		return
	}
	if *allow == "" || flag.NArg() == 0 {
		fatal(errors.New("usage: skipcheck -allow FILE run.json... | skipcheck -echo [-record FILE]"))
	}
	rules, err := readAllow(*allow)
	if err != nil {
		fatal(err)
	}
	var skips []skip
	for _, name := range flag.Args() {
		f, err := os.Open(name)
		if err != nil {
			fatal(err)
		}
		s, err := collect(f)
		f.Close()
		if err != nil {
			fatal(fmt.Errorf("%s: %w", name, err))
		}
		skips = append(skips, s...)
	}
	if !check(os.Stdout, skips, rules, *allow) {
		os.Exit(1)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "skipcheck:", err)
	os.Exit(2)
}

// echoRun prints package results and failed tests' output; it reports whether anything
// failed. Every input line goes to rec unchanged.
func echoRun(r io.Reader, w, rec io.Writer) (failed bool, err error) {
	type key struct{ pkg, test string }
	buf := map[key][]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		rec.Write(line)
		rec.Write([]byte{'\n'})
		var e event
		if json.Unmarshal(line, &e) != nil {
			fmt.Fprintln(w, string(line)) // go test's own messages (build errors) are not JSON
			continue
		}
		k := key{e.Package, e.Test}
		switch {
		case e.Action == "output" && e.Test == "":
			fmt.Fprint(w, e.Output)
		case e.Action == "output":
			buf[k] = append(buf[k], e.Output)
		case e.Action == "fail":
			failed = true
			for _, o := range buf[k] {
				fmt.Fprint(w, o)
			}
			delete(buf, k)
		case e.Action == "pass" || e.Action == "skip":
			delete(buf, k)
		}
	}
	return failed, sc.Err()
}

// collect returns the skipped tests of a go test -json stream with the lines they logged.
func collect(r io.Reader) ([]skip, error) {
	type key struct{ pkg, test string }
	out := map[key][]string{}
	var skips []skip
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Test == "" {
			continue
		}
		k := key{e.Package, e.Test}
		switch e.Action {
		case "output":
			o := strings.TrimSpace(e.Output)
			if o != "" && !strings.HasPrefix(o, "=== ") && !strings.HasPrefix(o, "--- ") {
				out[k] = append(out[k], o)
			}
		case "skip":
			skips = append(skips, skip{e.Package, e.Test, strings.Join(out[k], " | ")})
			delete(out, k)
		case "pass", "fail":
			delete(out, k)
		}
	}
	return skips, sc.Err()
}

func readAllow(name string) ([]*rule, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	var rules []*rule
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		spec, reason, _ := strings.Cut(line, "#")
		f := strings.Fields(spec)
		reason = strings.TrimSpace(reason)
		if len(f) != 2 || reason == "" {
			return nil, fmt.Errorf("%s:%d: want \"package test # reason\", got %q", name, i+1, line)
		}
		if _, err := path.Match(f[1], ""); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, i+1, err)
		}
		rules = append(rules, &rule{Package: f[0], Test: f[1], Reason: reason, line: i + 1})
	}
	return rules, nil
}

// check prints every skip and whether the allow-list covers it; it reports whether all are.
func check(w io.Writer, skips []skip, rules []*rule, listName string) bool {
	sort.Slice(skips, func(i, j int) bool {
		if skips[i].Package != skips[j].Package {
			return skips[i].Package < skips[j].Package
		}
		return skips[i].Test < skips[j].Test
	})
	var bad []skip
	for _, s := range skips {
		var hit *rule
		for _, r := range rules {
			if ok, _ := path.Match(r.Test, s.Test); ok && r.Package == s.Package {
				hit = r
				break
			}
		}
		if hit == nil {
			bad = append(bad, s)
			continue
		}
		hit.used = true
		fmt.Fprintf(w, "skipcheck: allowed  %s %s: %s\n", s.Package, s.Test, s.Reason)
	}
	for _, r := range rules {
		if !r.used {
			fmt.Fprintf(w, "skipcheck: note: %s:%d (%s %s) matched no skip in this run\n", listName, r.line, r.Package, r.Test)
		}
	}
	for _, s := range bad {
		fmt.Fprintf(w, "skipcheck: NOT ALLOWED %s %s: %s\n", s.Package, s.Test, s.Reason)
	}
	fmt.Fprintf(w, "skipcheck: %d skipped, %d allowed by %s, %d not allowed\n", len(skips), len(skips)-len(bad), listName, len(bad))
	return len(bad) == 0
}
