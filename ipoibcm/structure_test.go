package ipoibcm

import (
	"go/ast"
	"go/parser"
	"go/token"
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
	_, files := parseSources(t)
	calls := map[string]map[string]bool{} // function name -> names it calls
	syncs := map[string]bool{}            // functions calling Sync/Stop on a napi context
	for _, af := range files {
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
// context (a selector ending in napi or NAPI).
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
				if recv, ok := fn.X.(*ast.SelectorExpr); ok && strings.HasSuffix(strings.ToLower(recv.Sel.Name), "napi") {
					sync()
				}
			}
		}
		return true
	})
}

// TestRXStateChangesOnlyInTheStateMachine: a passive connection's state is
// assigned only in rxteardown.go (rxTransition and the destroy it runs),
// so the teardown route can be read in one file.
func TestRXStateChangesOnlyInTheStateMachine(t *testing.T) {
	fset, files := parseSources(t)
	found := 0
	for f, af := range files {
		ast.Inspect(af, func(n ast.Node) bool {
			as, ok := n.(*ast.AssignStmt)
			if !ok {
				return true
			}
			for k, lhs := range as.Lhs {
				sel, ok := lhs.(*ast.SelectorExpr)
				if !ok || sel.Sel.Name != "state" || k >= len(as.Rhs) {
					continue
				}
				rhs, ok := as.Rhs[k].(*ast.Ident)
				if !ok || !strings.HasPrefix(rhs.Name, "rx") {
					continue
				}
				found++
				if f != "rxteardown.go" {
					t.Errorf("%s: passive connection state set to %s outside rxteardown.go", fset.Position(as.Pos()), rhs.Name)
				}
			}
			return true
		})
	}
	if found == 0 {
		t.Fatal("no rxConn state assignment found at all: the check has gone blind")
	}
}

// TestTXStateChangesOnlyInTheStateMachine: an active connection's state
// is stored only by txTransition (txconn.go), which applies the table of
// txStep, so every change of a txConn's life is one named event.
func TestTXStateChangesOnlyInTheStateMachine(t *testing.T) {
	fset, files := parseSources(t)
	found := 0
	for f, af := range files {
		for _, d := range af.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			inTransition := f == "txconn.go" && fd.Name.Name == "txTransition"
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.CallExpr:
					// tc.state.store(...): the one write of a txStateCell.
					sel, ok := n.Fun.(*ast.SelectorExpr)
					if !ok || sel.Sel.Name != "store" {
						return true
					}
					if inner, ok := sel.X.(*ast.SelectorExpr); !ok || inner.Sel.Name != "state" {
						return true
					}
					found++
					if !inTransition {
						t.Errorf("%s: active connection state stored in %s, not txTransition", fset.Position(n.Pos()), fd.Name.Name)
					}
				case *ast.SelectorExpr:
					// The cell's atomic is the cell's alone.
					if n.Sel.Name == "v" {
						if inner, ok := n.X.(*ast.SelectorExpr); ok && inner.Sel.Name == "state" {
							t.Errorf("%s: %s reaches into a txStateCell", fset.Position(n.Pos()), fd.Name.Name)
						}
					}
				}
				return true
			})
		}
	}
	if found != 1 {
		t.Fatalf("found %d stores of a txConn state, want exactly the one in txTransition: the check has gone blind or been bypassed", found)
	}
}

// TestTXStepTable walks every state and event through txStep: the
// active connection only ever moves forward, and a destroyed one stays.
func TestTXStepTable(t *testing.T) {
	want := map[[2]int]txState{
		{int(txConnecting), int(txEvREP)}:      txUp,
		{int(txConnecting), int(txEvTeardown)}: txClosing,
		{int(txUp), int(txEvTeardown)}:         txClosing,
		{int(txConnecting), int(txEvDestroy)}:  txDestroyed,
		{int(txUp), int(txEvDestroy)}:          txDestroyed,
		{int(txClosing), int(txEvDestroy)}:     txDestroyed,
	}
	for s := txConnecting; s <= txDestroyed; s++ {
		for ev := txEvREP; ev <= txEvDestroy; ev++ {
			to, ok := txStep(s, ev)
			w, allowed := want[[2]int{int(s), int(ev)}]
			if ok != allowed || (ok && to != w) || (!ok && to != s) {
				t.Errorf("txStep(%s, %s) = %s, %v; want %s, %v", s, ev, to, ok, w, allowed)
			}
		}
	}
}

// parseSources parses the package's non-test Go files, by file name.
func parseSources(t *testing.T) (*token.FileSet, map[string]*ast.File) {
	t.Helper()
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	files := make(map[string]*ast.File)
	for _, f := range names {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files[f] = af
	}
	if len(files) == 0 {
		t.Fatal("no source files found")
	}
	return fset, files
}
