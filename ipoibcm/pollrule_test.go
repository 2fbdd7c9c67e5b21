package ipoibcm

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPollHandlersNeverSyncOrStop enforces napi's one rule (never call
// Sync or Stop of a poll context from its Handle: both wait for the
// running poll) over the package's source: no function reachable from
// the poll handlers, by direct call, calls Sync or Stop on a napi context.
// Work the handlers hand to the control loop (closures passed to post)
// does not count: it runs on the control loop's goroutine.
//
// Reachability is by function and method name, so it over-approximates:
// a false alarm means a handler calls something that shares a name with a
// function that syncs, and the answer is to rename, not to loosen this.
func TestPollHandlersNeverSyncOrStop(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]map[string]bool{} // function name -> names it calls
	syncs := map[string]bool{}            // functions calling Sync/Stop on a napi context
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		af, err := parser.ParseFile(fset, f, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			name := fd.Name.Name
			if calls[name] == nil {
				calls[name] = map[string]bool{}
			}
			collectCalls(fd.Body, calls[name], func() { syncs[name] = true })
		}
	}
	if len(syncs) == 0 {
		t.Fatal("no function calls Sync or Stop on a napi context: the check has gone blind")
	}
	for _, root := range []string{"handleRX", "handleTX"} {
		if calls[root] == nil {
			t.Fatalf("poll handler %s not found", root)
		}
		seen := map[string]string{root: ""}
		queue := []string{root}
		for len(queue) > 0 {
			fn := queue[0]
			queue = queue[1:]
			if syncs[fn] {
				var path []string
				for p := fn; p != ""; p = seen[p] {
					path = append(path, p)
				}
				t.Errorf("%s reaches %s, which calls Sync or Stop on a poll context", root, strings.Join(path, " <- "))
				continue
			}
			for callee := range calls[fn] {
				if _, ok := seen[callee]; !ok && calls[callee] != nil {
					seen[callee] = fn
					queue = append(queue, callee)
				}
			}
		}
	}
}

// collectCalls records the names body calls, skipping closures handed to
// the control loop (post), and reports calls of Sync or Stop on a napi
// context (a selector ending in NAPI).
func collectCalls(body ast.Node, into map[string]bool, sync func()) {
	ast.Inspect(body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		switch fn := call.Fun.(type) {
		case *ast.Ident:
			into[fn.Name] = true
		case *ast.SelectorExpr:
			into[fn.Sel.Name] = true
			if fn.Sel.Name == "post" {
				return false // its argument runs on the control loop
			}
			if fn.Sel.Name == "Sync" || fn.Sel.Name == "Stop" {
				if recv, ok := fn.X.(*ast.SelectorExpr); ok && strings.HasSuffix(recv.Sel.Name, "NAPI") {
					sync()
				}
			}
		}
		return true
	})
}
