package capture

import (
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/ipoibcm/ipoib/hca/rocev2"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/ipoibcm"
)

// Sink takes tapped messages and engine events: a Stream or a Ring.
type Sink interface {
	// Message runs under the fabric lock (see soft.Tap).
	Message(m *soft.Message)
	// Datagram runs under a RoCEv2 device's lock (see rocev2.Tap).
	Datagram(src, dst netip.AddrPort, pkt []byte)
	// Event runs on an engine goroutine (see ipoibcm.EventObserver).
	Event(host string, e *ipoibcm.Event)
}

// Mux is the one soft.Tap of a fabric, handing every message to the
// sinks attached at the moment. With none attached a message costs one
// atomic load, so a fabric can keep its Mux for its whole life and
// captures can come and go.
type Mux struct {
	mu    sync.Mutex
	sinks atomic.Pointer[[]Sink]
}

var (
	_ soft.Tap       = (*Mux)(nil)
	_ rocev2.Tap     = (*Mux)(nil)
	_ rocev2.IdleTap = (*Mux)(nil)
)

// Idle implements rocev2.IdleTap: no sink is attached.
func (x *Mux) Idle() bool { return x.sinks.Load() == nil }

// Datagram implements rocev2.Tap.
func (x *Mux) Datagram(src, dst netip.AddrPort, pkt []byte) {
	if p := x.sinks.Load(); p != nil {
		for _, s := range *p {
			s.Datagram(src, dst, pkt)
		}
	}
}

// Message implements soft.Tap.
func (x *Mux) Message(m *soft.Message) {
	if p := x.sinks.Load(); p != nil {
		for _, s := range *p {
			s.Message(m)
		}
	}
}

// Attach adds s until the returned function is called.
func (x *Mux) Attach(s Sink) (detach func()) {
	x.update(func(l []Sink) []Sink { return append(l, s) })
	var once sync.Once
	return func() {
		once.Do(func() {
			x.update(func(l []Sink) []Sink {
				return slices.DeleteFunc(l, func(o Sink) bool { return o == s })
			})
		})
	}
}

func (x *Mux) update(fn func([]Sink) []Sink) {
	x.mu.Lock()
	defer x.mu.Unlock()
	var cur []Sink
	if p := x.sinks.Load(); p != nil {
		cur = slices.Clone(*p)
	}
	next := fn(cur)
	if len(next) == 0 {
		x.sinks.Store(nil)
		return
	}
	x.sinks.Store(&next)
}

// Observer is the EventObserver for host's interface: its events go to
// every attached sink.
func (x *Mux) Observer(host string) ipoibcm.EventObserver { return muxObserver{x, host} }

type muxObserver struct {
	x    *Mux
	host string
}

func (o muxObserver) ObserveEvent(e ipoibcm.Event) {
	if p := o.x.sinks.Load(); p != nil {
		for _, s := range *p {
			s.Event(o.host, &e)
		}
	}
}
