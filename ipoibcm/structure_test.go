package ipoibcm

import (
	"go/ast"
	"go/parser"
	"go/token"
	"iter"
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
	for fd := range funcBodies(files) {
		name := fd.Name.Name
		if calls[name] == nil {
			calls[name] = map[string]bool{}
		}
		collectCalls(fd.Body, calls[name], func() { syncs[name] = true })
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

// The method ceilings: Interface is the assembly (construction,
// configuration, the mode switch, the public API) and the behaviour lives
// on the owners of the state, so no type grows into the one object every
// feature lands on. maxInterfaceMethods is what Interface has come down
// to; lower it as behaviour moves to its owners, never raise it.
const (
	maxMethods          = 40
	maxInterfaceMethods = 39
)

// TestMethodCeilings counts the methods declared on each type of the
// package (test files aside).
func TestMethodCeilings(t *testing.T) {
	_, files := parseSources(t)
	count := map[string]int{}
	for _, af := range files {
		for _, d := range af.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv == nil || len(fd.Recv.List) != 1 {
				continue
			}
			count[recvTypeName(fd.Recv.List[0].Type)]++
		}
	}
	if count["Interface"] == 0 || count["passiveSet"] == 0 || count["rxPath"] == 0 {
		t.Fatalf("methods of Interface, passiveSet and rxPath not found (%v): the check has gone blind", count)
	}
	for typ, n := range count {
		limit := maxMethods
		if typ == "Interface" {
			limit = maxInterfaceMethods
		}
		if n > limit {
			t.Errorf("%s has %d methods, more than %d: give the behaviour to the type that owns its state", typ, n, limit)
		}
	}
}

// recvTypeName is the type name of a method receiver: T, *T, T[P] or *T[P].
func recvTypeName(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// backPointersLeft are the owners that still reach the whole Interface
// (type.field), by a field of type *Interface or by being handed the
// Interface itself as one of their narrow interfaces. The list may only
// shrink: an entry that no longer holds fails the test too.
var backPointersLeft = map[string]bool{}

// TestNoInterfaceBackPointers: no type but Interface holds a *Interface
// (a parent's children are owned, not pointed back to: childSet's map and
// Interface.parent are the assembly's), and no method of Interface hands
// the Interface itself (its receiver) to a field of another type, which
// is the same back-pointer behind a narrow interface.
func TestNoInterfaceBackPointers(t *testing.T) {
	fset, files := parseSources(t)
	found := map[string]bool{}
	own := map[string]bool{} // Interface's own *Interface fields (parent)
	structs := 0
	for _, af := range files {
		ast.Inspect(af, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return true
			}
			if ts.Name.Name == "Interface" {
				for _, f := range st.Fields.List {
					for _, id := range f.Names {
						if isInterfacePointer(f.Type) {
							own[id.Name] = true
						}
					}
				}
				return true
			}
			structs++
			for _, f := range st.Fields.List {
				if !isInterfacePointer(f.Type) {
					continue
				}
				names := []string{"(embedded)"}
				if len(f.Names) > 0 {
					names = names[:0]
					for _, id := range f.Names {
						names = append(names, id.Name)
					}
				}
				for _, name := range names {
					key := ts.Name.Name + "." + name
					found[key] = true
					if !backPointersLeft[key] {
						t.Errorf("%s: %s holds a *Interface: hand it the narrow pieces it needs", fset.Position(f.Pos()), key)
					}
				}
			}
			return true
		})
	}
	// Then the functions, once Interface's own fields are known.
	for fd := range funcBodies(files) {
		self := interfaceNames(fd)
		reached := func(pos token.Pos, key string) {
			found[key] = true
			if !backPointersLeft[key] {
				t.Errorf("%s: %s gets the Interface itself: hand it the narrow pieces it needs", fset.Position(pos), key)
			}
		}
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CompositeLit:
				for _, el := range n.Elts {
					if kv, ok := el.(*ast.KeyValueExpr); ok && isSelf(kv.Value, self) {
						if k, ok := kv.Key.(*ast.Ident); ok {
							reached(kv.Pos(), typeName(n.Type)+"."+k.Name)
						}
					}
				}
			case *ast.AssignStmt:
				for k, lhs := range n.Lhs {
					if sel, ok := lhs.(*ast.SelectorExpr); ok && k < len(n.Rhs) && isSelf(n.Rhs[k], self) && !own[sel.Sel.Name] {
						reached(n.Pos(), "?."+sel.Sel.Name)
					}
				}
			}
			return true
		})
	}
	if structs < 10 {
		t.Fatalf("only %d struct types found: the check has gone blind", structs)
	}
	for key := range backPointersLeft {
		if !found[key] {
			t.Errorf("%s no longer reaches the Interface: take it off backPointersLeft", key)
		}
	}
}

// interfaceNames are the names fd binds to an *Interface: a method's
// receiver, and variables it makes with &Interface{...} (New).
func interfaceNames(fd *ast.FuncDecl) map[string]bool {
	names := map[string]bool{}
	if fd.Recv != nil && len(fd.Recv.List) == 1 && len(fd.Recv.List[0].Names) == 1 && recvTypeName(fd.Recv.List[0].Type) == "Interface" {
		names[fd.Recv.List[0].Names[0].Name] = true
	}
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		as, ok := n.(*ast.AssignStmt)
		if !ok {
			return true
		}
		for k, rhs := range as.Rhs {
			u, ok := rhs.(*ast.UnaryExpr)
			if !ok || k >= len(as.Lhs) {
				continue
			}
			if cl, ok := u.X.(*ast.CompositeLit); ok && typeName(cl.Type) == "Interface" {
				if id, ok := as.Lhs[k].(*ast.Ident); ok {
					names[id.Name] = true
				}
			}
		}
		return true
	})
	return names
}

func isSelf(e ast.Expr, self map[string]bool) bool {
	id, ok := e.(*ast.Ident)
	return ok && self[id.Name]
}

func isInterfacePointer(e ast.Expr) bool {
	s, ok := e.(*ast.StarExpr)
	if !ok {
		return false
	}
	id, ok := s.X.(*ast.Ident)
	return ok && id.Name == "Interface"
}

// typeName is a composite literal's type as written (T, *T, pkg.T).
func typeName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.SelectorExpr:
		return x.Sel.Name
	case *ast.StarExpr:
		return typeName(x.X)
	}
	return "?"
}

// closuresLeft are the owners' fields that are still handed a function
// bound to the whole Interface (type.field, or field.init for an
// argument of an owner's init). The list may only shrink: an entry that
// no longer holds fails the test too.
var closuresLeft = map[string]bool{
	// checkHostDownQuiet reads the Interface's downQuiet beside the
	// host link and both connection sets.
	"controlTasks.after": true,
}

// TestNoClosureCapturesInterface: a closure that names the Interface, or
// a method value of it, is the back-pointer TestNoInterfaceBackPointers
// forbids in another form, so none may be stored in an owner: as a field
// of a composite literal of one of the package's types, assigned to a
// field (outside the Interface's own), or handed to an owner's init.
// Closures posted to the control loop run once and keep nothing; the
// verbs' callbacks are the device's.
func TestNoClosureCapturesInterface(t *testing.T) {
	// The check first proves it still sees each form.
	const canary = `package p
type Interface struct{ x int; w writer; o owner }
type writer struct{ quiet func() bool }
type owner struct{ f func() int; g func() }
func (o *owner) init(f func() int) { o.f = f }
func (i *Interface) get() int { return i.x }
func New() *Interface {
	i := &Interface{}
	i.w = writer{quiet: func() bool { return i.x == 0 }}
	i.o.init(func() int { return i.x })
	return i
}
func (o *owner) set(i *Interface) { o.g = i.start }
func (i *Interface) start() { i.o.f = i.get; i.o.g = func() {} }
`
	fset := token.NewFileSet()
	af, err := parser.ParseFile(fset, "canary.go", canary, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := interfaceClosures(map[string]*ast.File{"canary.go": af})
	want := []string{"o.f", "owner.g", "o.init", "writer.quiet"}
	if len(got) != len(want) {
		t.Fatalf("the check finds %v in its canary, want %v: it has gone blind", got, want)
	}
	for _, k := range want {
		if _, ok := got[k]; !ok {
			t.Fatalf("the check misses %s in its canary (finds %v): it has gone blind", k, got)
		}
	}

	fset, files := parseSources(t)
	found := interfaceClosures(files)
	for key, pos := range found {
		if !closuresLeft[key] {
			t.Errorf("%s: %s is handed a function bound to the Interface: hand it the narrow pieces it needs", fset.Position(pos), key)
		}
	}
	for key := range closuresLeft {
		if _, ok := found[key]; !ok {
			t.Errorf("%s no longer gets a function bound to the Interface: take it off closuresLeft", key)
		}
	}
}

// interfaceClosures finds the functions bound to the Interface that are
// stored in owners (see TestNoClosureCapturesInterface), by the owner's
// field.
func interfaceClosures(files map[string]*ast.File) map[string]token.Pos {
	fields := map[string][]string{} // the package's struct types and their fields, in order
	methods := map[string]bool{}    // Interface's methods
	for _, af := range files {
		for _, d := range af.Decls {
			switch d := d.(type) {
			case *ast.GenDecl:
				for _, s := range d.Specs {
					ts, ok := s.(*ast.TypeSpec)
					if !ok {
						continue
					}
					st, ok := ts.Type.(*ast.StructType)
					if !ok {
						continue
					}
					var names []string
					for _, f := range st.Fields.List {
						if len(f.Names) == 0 {
							names = append(names, typeName(f.Type)) // embedded
						}
						for _, id := range f.Names {
							names = append(names, id.Name)
						}
					}
					fields[ts.Name.Name] = names
				}
			case *ast.FuncDecl:
				if d.Recv != nil && len(d.Recv.List) == 1 && recvTypeName(d.Recv.List[0].Type) == "Interface" {
					methods[d.Name.Name] = true
				}
			}
		}
	}
	found := map[string]token.Pos{}
	for fd := range funcBodies(files) {
		self := interfaceNames(fd)
		recv := ""
		if fd.Recv != nil && len(fd.Recv.List) == 1 && len(fd.Recv.List[0].Names) == 1 {
			recv = fd.Recv.List[0].Names[0].Name
		}
		for _, p := range fd.Type.Params.List {
			if isInterfacePointer(p.Type) {
				for _, id := range p.Names {
					self[id.Name] = true
				}
			}
		}
		if len(self) == 0 {
			continue
		}
		bound := func(e ast.Expr) bool {
			switch e := e.(type) {
			case *ast.FuncLit:
				names := false
				ast.Inspect(e.Body, func(n ast.Node) bool {
					if id, ok := n.(*ast.Ident); ok && self[id.Name] {
						names = true
					}
					return !names
				})
				return names
			case *ast.SelectorExpr:
				return isSelf(e.X, self) && methods[e.Sel.Name]
			}
			return false
		}
		// stored records v, stored in owner.field, if it is bound;
		// a slice or array literal stored there is looked into.
		var stored func(key string, v ast.Expr)
		stored = func(key string, v ast.Expr) {
			if cl, ok := v.(*ast.CompositeLit); ok {
				if _, ok := cl.Type.(*ast.ArrayType); ok {
					for _, el := range cl.Elts {
						stored(key, el)
					}
				}
				return
			}
			if bound(v) {
				found[key] = v.Pos()
			}
		}
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CompositeLit:
				typ := typeName(n.Type)
				names, ok := fields[typ]
				if !ok || typ == "Interface" {
					return true
				}
				for k, el := range n.Elts {
					if kv, ok := el.(*ast.KeyValueExpr); ok {
						if id, ok := kv.Key.(*ast.Ident); ok {
							stored(typ+"."+id.Name, kv.Value)
						}
					} else if k < len(names) {
						stored(typ+"."+names[k], el)
					}
				}
			case *ast.AssignStmt:
				for k, lhs := range n.Lhs {
					sel, ok := lhs.(*ast.SelectorExpr)
					if !ok || k >= len(n.Rhs) || isSelf(sel.X, self) {
						continue // the Interface's own fields are the assembly's
					}
					owner := "?"
					if id, ok := sel.X.(*ast.Ident); ok && id.Name == recv {
						owner = recvTypeName(fd.Recv.List[0].Type)
					} else if inner, ok := sel.X.(*ast.SelectorExpr); ok {
						owner = inner.Sel.Name
					}
					stored(owner+"."+sel.Sel.Name, n.Rhs[k])
				}
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok || sel.Sel.Name != "init" {
					return true
				}
				owner := "?"
				switch x := sel.X.(type) {
				case *ast.SelectorExpr:
					owner = x.Sel.Name
				case *ast.Ident:
					owner = x.Name
				}
				for _, a := range n.Args {
					stored(owner+".init", a)
				}
			}
			return true
		})
	}
	return found
}

// funcBodies yields every function or method with a body declared in files.
func funcBodies(files map[string]*ast.File) iter.Seq[*ast.FuncDecl] {
	return func(yield func(*ast.FuncDecl) bool) {
		for _, af := range files {
			for _, d := range af.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil && !yield(fd) {
					return
				}
			}
		}
	}
}
