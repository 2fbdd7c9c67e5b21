package cli

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/ipoibcm/ipoib/control"
	"github.com/ipoibcm/ipoib/ipoibcm"
)

// peerTracker follows when bytes last arrived from each peer of one
// interface, for 'ipoib show peers': it samples the RX connections'
// byte counts every period (upService's ticker), so "last received" is
// exact to the period, where the engine's own RX stamp moves only once
// per stale-scan period.
type peerTracker struct {
	period time.Duration

	mu    sync.Mutex
	peers map[string]*peerSeen // by hardware address
}

type peerSeen struct {
	rxBytes uint64
	lastRX  time.Time // zero: nothing arrived yet
}

// peerSample is how often peerTracker samples.
const peerSample = time.Second

func newPeerTracker(period time.Duration) *peerTracker {
	return &peerTracker{period: period, peers: map[string]*peerSeen{}}
}

// sample records st's RX byte counts at now.
func (t *peerTracker) sample(now time.Time, st ipoibcm.Stats) {
	sums := map[string]uint64{}
	for _, c := range st.RXConns {
		sums[c.Peer] += c.Bytes
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for hw, n := range sums {
		p, ok := t.peers[hw]
		if !ok {
			p = &peerSeen{}
			t.peers[hw] = p
		}
		// A replaced connection starts its count again: any change with
		// bytes on the books is data since the last sample.
		if n != p.rxBytes && n > 0 {
			p.lastRX = now
		}
		p.rxBytes = n
	}
}

// activity is the peer_activity section for st: the last receive as
// sampled and the retransmits of each peer's connections' QPs.
func (t *peerTracker) activity(now time.Time, st ipoibcm.Stats, retransmits func(qpn uint32) uint64) map[string]control.PeerActivity {
	out := map[string]control.PeerActivity{}
	add := func(cs []ipoibcm.ConnInfo) {
		for _, c := range cs {
			a, ok := out[c.Peer]
			if !ok {
				a = control.PeerActivity{LastRXMS: -1, SampleMS: t.period.Milliseconds()}
			}
			a.Retransmits += retransmits(uint32(c.LocalQPN))
			out[c.Peer] = a
		}
	}
	add(st.TXConns)
	add(st.RXConns)
	t.mu.Lock()
	defer t.mu.Unlock()
	for hw, p := range t.peers {
		a, ok := out[hw]
		if !ok {
			a = control.PeerActivity{LastRXMS: -1, SampleMS: t.period.Milliseconds()}
		}
		if !p.lastRX.IsZero() {
			a.LastRXMS = now.Sub(p.lastRX).Milliseconds()
		}
		out[hw] = a
	}
	return out
}

// withSection adds key: v to a stats object made by statsWithDevice.
func withSection(stats any, key string, v any) any {
	m, ok := stats.(map[string]json.RawMessage)
	if !ok {
		return stats
	}
	b, err := json.Marshal(v)
	if err != nil {
		return stats
	}
	m[key] = b
	return m
}
