// Package apicheck holds the tests of promises the public API makes as a
// whole. It is free of the module's internals: no exported name of a
// public package may mention a type from an internal package, and its
// documentation (go doc -all) may name none either. And no method of a
// value no constructor made panics or waits for ever (notmade_test.go).
package apicheck

import (
	"encoding/json"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
)

const module = "github.com/go-rdma/rdmacm"

// publicPackages are the module's importable library packages: not
// internal, not commands, not tests.
func publicPackages() ([]string, error) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{.Name}}", module+"/...").Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w", err)
	}
	var pkgs []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, name, _ := strings.Cut(line, " ")
		if name == "main" || strings.Contains(path, "/internal") || strings.HasPrefix(path, module+"/integration") {
			continue
		}
		pkgs = append(pkgs, path)
	}
	if len(pkgs) < 4 {
		return nil, fmt.Errorf("found only %v: the list of public packages is wrong", pkgs)
	}
	return pkgs, nil
}

// exportData maps every package the public ones depend on to its compiled
// export data, for the gc importer.
func exportData(pkgs []string) (map[string]string, error) {
	args := append([]string{"list", "-export", "-deps", "-json=ImportPath,Export"}, pkgs...)
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		return nil, fmt.Errorf("go list -export: %w", err)
	}
	files := map[string]string{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p struct{ ImportPath, Export string }
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			return nil, err
		}
		files[p.ImportPath] = p.Export
	}
	return files, nil
}

// TestNoInternalTypesInPublicAPI walks every exported constant, variable,
// function, type, field and method of every public package and fails on
// any type from an internal package in it.
func TestNoInternalTypesInPublicAPI(t *testing.T) {
	for path, pkg := range importPublic(t) {
		w := walker{t: t, seen: map[types.Type]bool{}}
		scope := pkg.Scope()
		for _, name := range scope.Names() {
			obj := scope.Lookup(name)
			if !obj.Exported() {
				continue
			}
			where := path + "." + name
			w.visit(where, obj.Type())
			if tn, ok := obj.(*types.TypeName); ok {
				w.visitDecl(where, tn.Type())
			}
		}
	}
}

// importPublic is every public package, type-checked from its compiled
// export data, by import path (public).
func importPublic(t *testing.T) map[string]*types.Package {
	pkgs, err := public()
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

// public lists and type-checks the public packages once for all the tests
// here: each listing is a run of go list.
var public = sync.OnceValues(func() (map[string]*types.Package, error) {
	pkgs, err := publicPackages()
	if err != nil {
		return nil, err
	}
	files, err := exportData(pkgs)
	if err != nil {
		return nil, err
	}
	imp := importer.ForCompiler(token.NewFileSet(), "gc", func(path string) (io.ReadCloser, error) {
		f, ok := files[path]
		if !ok || f == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	imported := map[string]*types.Package{}
	for _, path := range pkgs {
		pkg, err := imp.Import(path)
		if err != nil {
			return nil, fmt.Errorf("importing %s: %w", path, err)
		}
		imported[path] = pkg
	}
	return imported, nil
})

// TestOptionsAreOpaque: an exported option type (named ...Option, a func
// of one argument that returns nothing) takes a pointer to an unexported
// type of its own package, so that options come only from the package's
// With functions. One that took a type callers can build (rdmanet's took
// *[]msg.Option) let a caller write an option that drops the package's
// own settings.
func TestOptionsAreOpaque(t *testing.T) {
	options := 0
	for path, pkg := range importPublic(t) {
		scope := pkg.Scope()
		for _, name := range scope.Names() {
			tn, ok := scope.Lookup(name).(*types.TypeName)
			if !ok || !tn.Exported() || !strings.HasSuffix(name, "Option") {
				continue
			}
			sig, ok := tn.Type().Underlying().(*types.Signature)
			if !ok || sig.Params().Len() != 1 || sig.Results().Len() != 0 {
				continue
			}
			options++
			ptr, _ := sig.Params().At(0).Type().(*types.Pointer)
			var arg *types.Named
			if ptr != nil {
				arg, _ = ptr.Elem().(*types.Named)
			}
			if arg == nil || arg.Obj().Exported() || arg.Obj().Pkg() != pkg {
				t.Errorf("%s.%s is func(%v): an option takes a pointer to an unexported type of %s", path, name, sig.Params().At(0).Type(), pkg.Name())
			}
		}
	}
	if options < 3 {
		t.Fatalf("found %d option types: cm's, msg's and rdmanet's at least", options)
	}
	t.Logf("%d option types", options)
}

// walker reports internal types reachable from the exported API.
type walker struct {
	t    *testing.T
	seen map[types.Type]bool
}

// visitDecl visits what a declared type exports: its underlying type's
// exported fields and methods, and its exported methods.
func (w *walker) visitDecl(where string, typ types.Type) {
	w.visitExported(where, typ.Underlying())
	for _, recv := range []types.Type{typ, types.NewPointer(typ)} {
		ms := types.NewMethodSet(recv)
		for i := range ms.Len() {
			m := ms.At(i).Obj()
			if m.Exported() {
				w.visit(where+"."+m.Name(), m.Type())
			}
		}
	}
}

// visitExported visits the exported parts of a struct or interface.
func (w *walker) visitExported(where string, typ types.Type) {
	switch u := typ.(type) {
	case *types.Struct:
		for i := range u.NumFields() {
			if f := u.Field(i); f.Exported() {
				w.visit(where+"."+f.Name(), f.Type())
			}
		}
	case *types.Interface:
		for i := range u.NumMethods() {
			if m := u.Method(i); m.Exported() {
				w.visit(where+"."+m.Name(), m.Type())
			}
		}
	default:
		w.visit(where, typ)
	}
}

// visit checks a type appearing in the exported API, and what it is made of.
func (w *walker) visit(where string, typ types.Type) {
	if typ == nil || w.seen[typ] {
		return
	}
	w.seen[typ] = true
	switch u := typ.(type) {
	case *types.Alias:
		w.visitNamedPath(where, u.Obj())
		w.visit(where, u.Rhs())
	case *types.Named:
		w.visitNamedPath(where, u.Obj())
		if args := u.TypeArgs(); args != nil {
			for i := range args.Len() {
				w.visit(where, args.At(i))
			}
		}
		// A named type of a public package is checked where it is
		// declared; one of another package is that package's business.
	case *types.Pointer:
		w.visit(where, u.Elem())
	case *types.Slice:
		w.visit(where, u.Elem())
	case *types.Array:
		w.visit(where, u.Elem())
	case *types.Map:
		w.visit(where, u.Key())
		w.visit(where, u.Elem())
	case *types.Chan:
		w.visit(where, u.Elem())
	case *types.Signature:
		for _, tuple := range []*types.Tuple{u.Params(), u.Results()} {
			for i := range tuple.Len() {
				w.visit(where, tuple.At(i).Type())
			}
		}
	case *types.Struct, *types.Interface:
		w.visitExported(where, u)
	}
}

func (w *walker) visitNamedPath(where string, obj *types.TypeName) {
	if obj.Pkg() != nil && strings.Contains(obj.Pkg().Path(), "/internal/") {
		w.t.Errorf("%s mentions %s.%s, a type of an internal package", where, obj.Pkg().Path(), obj.Name())
	}
}

// internalName matches what documentation must not name: an internal
// package's path or one of its identifiers, and methods documented as
// being for sibling packages.
var internalName = regexp.MustCompile(`/internal/|\b(verbs|seam|fdwait|testbed|rxetest)\.[A-Z]|\bfor packages? (bufpool|endpoint|cm|msg)\b`)

// TestGoDocNamesNothingInternal reads go doc -all of every public package,
// which shows declarations as written (constant expressions included) and
// every exported comment.
func TestGoDocNamesNothingInternal(t *testing.T) {
	for _, path := range slices.Sorted(maps.Keys(importPublic(t))) {
		out, err := exec.Command("go", "doc", "-all", path).CombinedOutput()
		if err != nil {
			t.Fatalf("go doc -all %s: %v\n%s", path, err, out)
		}
		for i, line := range strings.Split(string(out), "\n") {
			if internalName.MatchString(line) {
				t.Errorf("go doc -all %s, line %d names something internal: %s", path, i+1, strings.TrimSpace(line))
			}
		}
	}
}
