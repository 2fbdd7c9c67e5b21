package cm

import (
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/soft"
)

// BenchmarkEstablish measures full REQ/REP/RTU handshakes per second on
// the soft fabric, batchSize connections in flight at a time.
func BenchmarkEstablish(b *testing.B) {
	const batchSize = 256
	f := newTestFabric(b, soft.Faults{})
	opts := Options{ResponseTimeout: time.Second, TimeWait: time.Millisecond, Seed: 1}
	a := newNode(b, f, "a", opts)
	opts.Seed = 2
	p := newNode(b, f, "b", opts)
	var established sync.WaitGroup
	acc := newAcceptor(p)
	// The passive QPs are destroyed after each batch like the active ones;
	// kept, they would exhaust the device's QPs once b.N grows.
	var passiveMu sync.Mutex
	var passive []hca.QP
	acc.decide = func(r *Request) Decision {
		qp := p.rcQP()
		passiveMu.Lock()
		passive = append(passive, qp)
		passiveMu.Unlock()
		return Decision{QP: qp, StartingPSN: 1, PrivateData: ipoibPrivate(0x49), Handler: func(Event) {}}
	}
	if _, err := p.m.Listen([]uint64{ietfSID}, acc.accept); err != nil {
		b.Fatal(err)
	}
	handler := func(ev Event) {
		if ev.Type == EventEstablished {
			established.Done()
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	var total time.Duration
	for done := 0; done < b.N; {
		n := min(batchSize, b.N-done)
		b.StopTimer()
		qps := make([]hca.QP, n)
		for i := range qps {
			qps[i] = a.rcQP()
		}
		established.Add(n)
		b.StartTimer()
		t0 := time.Now()
		for _, qp := range qps {
			if _, err := a.m.Connect(ConnectParams{DestGID: p.dev.GID(), ServiceID: ietfSID, QP: qp, PathMTU: hca.MTU4096}, handler); err != nil {
				b.Fatal(err)
			}
		}
		established.Wait()
		total += time.Since(t0)
		b.StopTimer()
		for _, qp := range qps {
			qp.Destroy()
		}
		passiveMu.Lock()
		for _, qp := range passive {
			qp.Destroy()
		}
		passive = passive[:0]
		passiveMu.Unlock()
		b.StartTimer()
		done += n
	}
	b.ReportMetric(float64(b.N)/total.Seconds(), "conns/s")
	if s := a.m.Stats(); s.Retries != 0 {
		b.Logf("retries %d", s.Retries)
	}
}

func TestCloseStopsEverything(t *testing.T) {
	f := newTestFabric(t, soft.Faults{})
	before := managerGoroutines()
	dev, err := f.NewDevice("a")
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewManager(dev, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewManager(dev, Options{}); !errors.Is(err, hca.ErrBusy) {
		t.Fatalf("second Manager on one device: %v", err)
	}
	if got := managerGoroutines(); got != before+1 {
		t.Fatalf("manager goroutines %d, want %d", got, before+1)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if got := managerGoroutines(); got != before {
		t.Fatalf("manager goroutines after Close %d, want %d", got, before)
	}
	if _, err := m.Listen([]uint64{1}, func(*Request) Decision { return Decision{} }); !errors.Is(err, ErrClosed) {
		t.Fatalf("Listen after Close: %v", err)
	}
	if f.Stats().GSIQPs != 0 {
		t.Fatalf("GSI QP left: %+v", f.Stats())
	}
	// The device's GSI QP is free again: a new Manager may take it.
	m2, err := NewManager(dev, Options{})
	if err != nil {
		t.Fatal(err)
	}
	m2.Close()
}

func TestConnectValidates(t *testing.T) {
	f := newTestFabric(t, soft.Faults{})
	n := newNode(t, f, "a", testOptions(1))
	good := ConnectParams{QP: n.rcQP(), PathMTU: hca.MTU1024}
	for name, mod := range map[string]func(*ConnectParams){
		"no QP":        func(p *ConnectParams) { p.QP = nil },
		"bad MTU":      func(p *ConnectParams) { p.PathMTU = 1500 },
		"private data": func(p *ConnectParams) { p.PrivateData = make([]byte, 93) },
		"retry":        func(p *ConnectParams) { p.RetryCount = 8 },
		"QP in Reset": func(p *ConnectParams) {
			qp, _ := n.dev.CreateQP(hca.QPConfig{Type: hca.QPTypeRC, SendCQ: n.cq, RecvCQ: n.cq, MaxSendWR: 1, MaxRecvWR: 1})
			p.QP = qp
		},
	} {
		p := good
		mod(&p)
		if _, err := n.m.Connect(p, nil); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := n.m.Listen(nil, nil); err == nil {
		t.Error("Listen without IDs: no error")
	}
	if _, err := n.m.Listen([]uint64{5, 5}, func(*Request) Decision { return Decision{} }); !errors.Is(err, ErrServiceIDInUse) {
		t.Errorf("Listen with a repeated ID: %v", err)
	}
}

// managerGoroutines counts running Manager loops. Counting all goroutines
// was flaky: other tests' goroutines may still be exiting.
func managerGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	// "created by" names NewManager whether or not run has started yet.
	return strings.Count(string(buf), "created by github.com/ipoibcm/ipoib/hca/cm.NewManager")
}
