// Package internal_test checks how the packages under internal/ import one
// another. It has no code of its own: only this test.
package internal_test

import (
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// internalPath is the import path of this directory.
const internalPath = "github.com/kuboprotocol/vertal2kubo/internal"

// TestNoImportClimbsBack fails when two sibling directories under internal/
// import each other, one of them from its subtree at any depth: then one
// of the two imports climbs back up a floor it was called from (as
// internal/sandbox once imported internal/engine for Limits while
// engine/oci imported sandbox). A package importing one of its own
// ancestors (a driver using the engine's types) or descendants is the
// normal shape and is allowed. Test files are left out: a test may sit
// above what it tests (the e2e suites import the attack suite).
func TestNoImportClimbsBack(t *testing.T) {
	imports, err := readImports(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range climbs(imports) {
		t.Errorf("%s, and a package under that import's subtree imports back into this one's: move what both use below both", c)
	}
}

func TestClimbs(t *testing.T) {
	got := climbs(map[string][]string{
		"engine":          nil,
		"engine/oci":      {"engine", "sandbox", "sandbox/uidpool"},
		"sandbox":         {"engine"},
		"sandbox/uidpool": nil,
		"engine/pool":     {"engine"},
		"engine/docker":   {"engine", "engine/policy"},
		"engine/policy":   {"engine"},
		"execution":       {"engine", "store"},
		"store/sqlite":    {"store"},
		"api":             {"execution"},
		"api/mcp":         {"api", "web"},
		"web":             {"jobs"},
		"jobs":            {"api/wire"},
	})
	want := []string{
		// A cycle of two: sandbox/ and engine/ import each other.
		"engine/oci imports sandbox",
		"engine/oci imports sandbox/uidpool",
		"sandbox imports engine",
		// A cycle of three: api/ → web/ → jobs/ → api/.
		"api/mcp imports web",
		"jobs imports api/wire",
		"web imports jobs",
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("climbs = %q, want %q", got, want)
	}
}

// climbs returns each import of a package from a sibling subtree that
// leads, through the imports between the siblings of that directory, back
// to the importing package's own subtree. imports maps a package (its
// directory relative to internal/) to the packages it imports, relative
// too.
func climbs(imports map[string][]string) []string {
	// next[parent][from][to]: some package under parent/from imports one
	// under parent/to.
	next := map[string]map[string]map[string]bool{}
	for pkg, imps := range imports {
		for _, imp := range imps {
			parent, from, to, ok := siblings(pkg, imp)
			if !ok {
				continue
			}
			if next[parent] == nil {
				next[parent] = map[string]map[string]bool{}
			}
			if next[parent][from] == nil {
				next[parent][from] = map[string]bool{}
			}
			next[parent][from][to] = true
		}
	}
	var out []string
	for pkg, imps := range imports {
		for _, imp := range imps {
			parent, from, to, ok := siblings(pkg, imp)
			if ok && reaches(next[parent], to, from) {
				out = append(out, pkg+" imports "+imp)
			}
		}
	}
	slices.Sort(out)
	return out
}

// reaches reports whether the graph g leads from one node to another.
func reaches(g map[string]map[string]bool, from, to string) bool {
	seen := map[string]bool{from: true}
	queue := []string{from}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		for m := range g[n] {
			if m == to {
				return true
			}
			if !seen[m] {
				seen[m] = true
				queue = append(queue, m)
			}
		}
	}
	return false
}

// siblings returns the deepest directory holding both packages and the
// two different directories right below it on their ways; ok is false
// when one package lies within the other's directory.
func siblings(pkg, imp string) (parent, from, to string, ok bool) {
	a, b := strings.Split(pkg, "/"), strings.Split(imp, "/")
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	if i == len(a) || i == len(b) {
		return "", "", "", false
	}
	return path.Join(a[:i]...), a[i], b[i], true
}

// readImports parses the non-test Go files of every package under root
// and returns their imports of other packages under internal/.
func readImports(root string) (map[string][]string, error) {
	out := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && p != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(filepath.Dir(p))
		if _, ok := out[pkg]; !ok {
			out[pkg] = nil
		}
		for _, s := range f.Imports {
			imp := strings.Trim(s.Path.Value, `"`)
			rel, ok := strings.CutPrefix(imp, internalPath+"/")
			if ok && !slices.Contains(out[pkg], rel) {
				out[pkg] = append(out[pkg], rel)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		wd, _ := os.Getwd()
		return nil, fmt.Errorf("no Go packages under %s", wd)
	}
	for _, imps := range out {
		slices.Sort(imps)
	}
	return out, nil
}
