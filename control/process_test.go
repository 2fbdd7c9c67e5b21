package control

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

type fakeProcess struct {
	stopped  atomic.Int32
	reloaded atomic.Int32
	fail     error
}

func (p *fakeProcess) Stopping() StopInfo { return StopInfo{PID: 42, TAPs: []string{"ib0"}} }
func (p *fakeProcess) Stop()              { p.stopped.Add(1) }
func (p *fakeProcess) Reload() (ReloadResult, error) {
	p.reloaded.Add(1)
	return ReloadResult{Applied: []string{"peers added [10.0.0.3]"}, NotLive: []string{"mtu"}}, p.fail
}

// TestStopAndReload: FindProcess finds the process by its interface, a
// stop answers with what will be gone and only then stops it, a reload
// returns what was applied and what was not, errors come back as one
// line; a process that takes neither refuses, and a name it does not
// serve is not it.
func TestStopAndReload(t *testing.T) {
	dir := t.TempDir()
	srv, err := Listen(dir, []Endpoint{newFake("h1")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	tgt, err := FindProcess(dir, "", "ib0", time.Second)
	if err != nil || tgt.Interface.Host != "h1" || tgt.Socket != srv.Path() {
		t.Fatalf("FindProcess: %+v, %v", tgt, err)
	}
	if _, err := tgt.Ask(OpStop, time.Second); err == nil || !strings.Contains(err.Error(), "does not take stop requests") {
		t.Fatalf("stop without a process: %v", err)
	}
	p := &fakeProcess{}
	srv.SetProcess(p)
	r, err := tgt.Ask(OpReload, time.Second)
	if err != nil || r.Reload == nil || r.Reload.NotLive[0] != "mtu" || p.reloaded.Load() != 1 {
		t.Fatalf("reload: %+v, %v", r, err)
	}
	p.fail = errors.New("a.conf:3: addr: bad\nsecond line")
	if _, err := tgt.Ask(OpReload, time.Second); err == nil || !strings.Contains(err.Error(), "a.conf:3: addr: bad; second line") {
		t.Fatalf("failed reload: %v", err)
	}
	if _, err := FindProcess(dir, "", "ib1", time.Second); !errors.Is(err, ErrNoTarget) {
		t.Fatalf("FindProcess ib1: %v", err)
	}
	c, err := Dial(srv.Path(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Do(Request{Op: OpStop, Name: "ib1"}); err == nil || p.stopped.Load() != 0 {
		t.Fatalf("stop of an interface not served: %v, stopped %d", err, p.stopped.Load())
	}
	c.Close()
	r, err = tgt.Ask(OpStop, time.Second)
	if err != nil || r.Stopping == nil || r.Stopping.PID != 42 || r.Stopping.Socket != srv.Path() {
		t.Fatalf("stop: %+v, %v", r, err)
	}
	// Stop runs once the answer is out; the client saw it, so it ran or
	// is about to: Close waits for the connection's goroutine.
	srv.Close()
	if p.stopped.Load() != 1 {
		t.Fatalf("Stop called %d times", p.stopped.Load())
	}
}
