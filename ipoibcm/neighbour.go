package ipoibcm

import (
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// neighbour is one remote IPoIB port as the host sees it: a locally
// administered MAC mapped one-to-one to the port's 20-byte hardware
// address. Neighbours are keyed by port GID, not by the whole hardware
// address, so a peer that restarts with a new UD QPN keeps its MAC and the
// host's ARP cache stays valid; learning the new address updates hw and
// flushes the TX connection to the old QP.
//
// All fields are guarded by neighbourTable.mu except mac, macIndex and
// gid, which never change.
type neighbour struct {
	gid      hca.GID
	mac      frame.MAC
	macIndex uint32

	hw  frame.HWAddr
	ips []netip.Addr
	ah  hca.AH // UD address handle, created on first UD send

	tx *txConn // active connection, nil when none

	// parked holds TX pool buffers waiting for tx to come up; each holds
	// one global TX credit.
	parked  [maxParked]parkedFrame
	nParked int

	created        time.Time
	lastUse        time.Time // last host packet sent to it (TX aging)
	lastSeen       time.Time // last time it was learnt from the wire (ARP, ND, UD, REQ)
	cmBackoffUntil time.Time // CM refused: UD until then
	// pathMTU is the IB path MTU our REQs to this peer carry; 0 until a
	// REJ INVALID_MTU lowered it from our port's (cmpathmtu.go).
	pathMTU hca.MTU
}

// idleSince is when the neighbour was last used in either direction.
func (n *neighbour) idleSince() time.Time {
	if n.lastSeen.After(n.lastUse) {
		return n.lastSeen
	}
	return n.lastUse
}

// parkedFrame is a host frame in a TX pool buffer (Ethernet header
// included) waiting for its connection.
type parkedFrame struct {
	buf int
	n   int
}

// neighbourTable is the interface's neighbours, mapped both ways (the
// one-to-one invariant checked), with the host addresses seen. Its lock
// guards the maps, every neighbour's mutable fields (the connection and
// the parked frames with them) and the credits the parked frames hold
// (txPath.parkedCredits). Lock order: Interface.mu, the passive set's
// (passiveSet.mu), then this one, then the active set's and the
// multicast table's.
type neighbourTable struct {
	mu sync.Mutex

	byGID   map[hca.GID]*neighbour
	byMAC   map[frame.MAC]*neighbour
	nextMAC uint32
	hostIPs []netip.Addr // host addresses seen, for re-resolving neighbours

	ctr neighCounters

	// What the table works with, fixed at New.
	self       hca.GID // our port's GID: never a neighbour
	portMTU    hca.MTU // our port's active MTU
	ahs        ahMaker
	retire     func(hca.AH)  // destroys an address handle once no send can use it
	timeout    time.Duration // Config.NeighbourTimeout
	evictAfter time.Duration // Config.NeighbourEvictAfter
	log        *slog.Logger
	// post hands work to the control loop: the teardown of the
	// connection of a neighbour that came back with a new QPN.
	post func(func())
}

// neighCounters count the table's changes: peers that restarted (new
// QPN), connections aged for idleness, neighbours evicted, and ARP
// re-resolutions the engine sent itself.
type neighCounters struct {
	restarts, aged, evicted, reresolves atomic.Uint64
}

func (t *neighbourTable) init(cfg *Config, self hca.GID, portMTU hca.MTU, ahs ahMaker, retire func(hca.AH), log *slog.Logger, post func(func())) {
	t.byGID = make(map[hca.GID]*neighbour)
	t.byMAC = make(map[frame.MAC]*neighbour)
	t.self, t.portMTU, t.ahs, t.retire, t.log, t.post = self, portMTU, ahs, retire, log, post
	t.timeout, t.evictAfter = cfg.NeighbourTimeout, cfg.NeighbourEvictAfter
}

// lookupOrCreate returns the neighbour of hw's port, creating it (with a
// fresh MAC) if needed. It does not update an existing neighbour's hw.
//
// MAC indices are handed out cyclically, skipping those in use. An evicted
// neighbour's MAC is therefore free again but comes back only after the
// other 2^32-1 indices: never in practice. Eviction itself waits
// NeighbourEvictAfter (10 min by default) of silence, far past the point
// where the host's ARP / ND cache has let the entry go stale (Linux:
// base_reachable_time 30 s, gc_stale_time 60 s) and must re-resolve, so
// even a reused MAC could not be taken for the old neighbour.
func (t *neighbourTable) lookupOrCreate(hw frame.HWAddr, now time.Time) (*neighbour, error) {
	gid := hw.GID()
	if n := t.byGID[gid]; n != nil {
		return n, nil
	}
	if uint64(len(t.byMAC)) >= 1<<32 {
		return nil, fmt.Errorf("neighbour %s: every MAC index in use: %w", hw, errMACsExhausted)
	}
	idx := t.nextMAC
	for t.byMAC[frame.LocalMAC(idx)] != nil {
		idx++
	}
	t.nextMAC = idx + 1
	mac := frame.LocalMAC(idx)
	n := &neighbour{gid: gid, mac: mac, macIndex: idx, hw: hw, created: now, lastUse: now, lastSeen: now}
	t.byGID[gid] = n
	t.byMAC[mac] = n
	return n, nil
}

// remove forgets n; its MAC index becomes free.
func (t *neighbourTable) remove(n *neighbour) {
	if t.byGID[n.gid] == n {
		delete(t.byGID, n.gid)
	}
	if t.byMAC[n.mac] == n {
		delete(t.byMAC, n.mac)
	}
}

func (t *neighbourTable) lookupMAC(mac frame.MAC) *neighbour { return t.byMAC[mac] }

func (t *neighbourTable) lookupGID(gid hca.GID) *neighbour { return t.byGID[gid] }

func (n *neighbour) addIP(a netip.Addr) {
	if !a.IsValid() || a.IsUnspecified() {
		return
	}
	for _, b := range n.ips {
		if a == b {
			return
		}
	}
	n.ips = append(n.ips, a)
}

// park keeps a frame for a connection being set up (at most maxParked per
// neighbour); under neighbourTable.mu. A parked frame holds a TX credit so the
// REP handler can post it without overrunning a send queue; all parked
// frames together hold at most parkedCreditCap credits. Linux does not
// count neigh->queue against tx_outstanding at all, but there a parked skb
// costs no send slot; here it holds a pool buffer, so the cap keeps a
// crowd of unresponsive 'C' peers (each parking 3 frames for a ~30 s CM
// timeout) from stopping the reader for everyone else.
func (n *neighbour) park(tx *txPath, bufIdx, size int) bool {
	if n.nParked == maxParked || tx.parkedCredits >= tx.parkedCreditCap() {
		tx.data.drop(dropTxNeighQueueFull)
		return false
	}
	n.parked[n.nParked] = parkedFrame{buf: bufIdx, n: size}
	n.nParked++
	tx.parkedCredits++
	tx.outstanding.Add(1)
	return true
}

// unpark forgets n's parked frames once they were posted or dropped;
// their credits are returned by the caller or the completions.
func (n *neighbour) unpark(tx *txPath) {
	tx.parkedCredits -= n.nParked
	n.nParked = 0
}

// dropParked drops n's parked frames, counted under reason.
func (n *neighbour) dropParked(tx *txPath, reason dropReason) {
	for k := range n.nParked {
		tx.pool.put1(n.parked[k].buf)
		tx.data.drop(reason)
	}
	cnt := n.nParked
	n.unpark(tx)
	tx.returnCredits(cnt)
}

// noteHostIP remembers an address the host uses.
func (t *neighbourTable) noteHostIP(a netip.Addr) {
	if !a.IsValid() || a.IsUnspecified() {
		return
	}
	for _, b := range t.hostIPs {
		if a == b {
			return
		}
	}
	if len(t.hostIPs) < 64 {
		t.hostIPs = append(t.hostIPs, a)
	}
}

// learn records that hw is the current hardware address of its port
// (seen in ARP, ND, a UD source or a CM REQ) and returns its neighbour. A
// changed QPN means the peer restarted: its TX connection went to a QP
// that no longer exists and is flushed at once.
func (t *neighbourTable) learn(hw frame.HWAddr, ip netip.Addr, now time.Time) *neighbour {
	if hw.IsMulticast() || hw.GID() == t.self {
		return nil
	}
	_, known := t.byGID[hw.GID()]
	n, err := t.lookupOrCreate(hw, now)
	if err != nil {
		t.log.Error("neighbour table", "err", err)
		return nil
	}
	if !known {
		t.log.Debug("neighbour", "ip", ip, "hw", hw, "mac", n.mac)
	}
	n.addIP(ip)
	n.lastSeen = now
	if n.hw != hw {
		old := n.hw
		n.hw = hw
		t.log.Debug("neighbour", "ip", ip, "hw", hw, "was", old, "mac", n.mac)
		if old.QPN() != hw.QPN() || (old.Connected() && !hw.Connected()) {
			t.ctr.restarts.Add(1)
			n.cmBackoffUntil = time.Time{}
			if tc := n.tx; tc != nil {
				// Its connection went to a QP that is gone.
				tc.detachLocked(dropTxNeighFlushed)
				t.post(tc.teardown)
			}
		}
	}
	return n
}

// ah is the address handle for UD sends to n, created on first use and
// kept until the neighbour is evicted or its path flushed.
func (t *neighbourTable) ah(n *neighbour) (hca.AH, error) {
	if n.ah == nil {
		ah, err := t.ahs.CreateAH(n.hw.GID())
		if err != nil {
			return nil, fmt.Errorf("address handle for neighbour %s: %w", n.hw, err)
		}
		n.ah = ah
	}
	return n.ah, nil
}

// dropAH retires n's address handle, if it has one: the host reader
// may still be posting with it (sendWindow).
func (t *neighbourTable) dropAH(n *neighbour) {
	if n.ah != nil {
		t.retire(n.ah)
		n.ah = nil
	}
}

// reqPathMTU is the path MTU our next REQ to n carries: our port MTU
// unless the peer refused it (cmpathmtu.go).
func (t *neighbourTable) reqPathMTU(n *neighbour) hca.MTU {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n.pathMTU != 0 && n.pathMTU < t.portMTU {
		return n.pathMTU
	}
	return t.portMTU
}

// age disconnects the TX connection of neighbours unused for sending for
// NeighbourTimeout (control loop). The MAC mapping stays: the host's ARP
// cache still names it, and the next frame rebuilds the connection.
// Neighbours silent in both directions for NeighbourEvictAfter, with
// nothing left that refers to them in either connection set, are
// forgotten (evict).
func (t *neighbourTable) age(now time.Time, active *activeSet, passive *passiveSet) {
	var idle []*txConn
	passive.mu.Lock()
	t.mu.Lock()
	for _, n := range t.byGID {
		if now.Sub(n.lastUse) < t.timeout {
			continue
		}
		if n.tx != nil {
			idle = append(idle, n.tx)
			n.tx.detachLocked(dropTxNeighFlushed)
			t.ctr.aged.Add(1)
		}
	}
	active.mu.Lock()
	t.evict(now, active.set, passive.set)
	active.mu.Unlock()
	t.mu.Unlock()
	passive.mu.Unlock()
	for _, tc := range idle {
		tc.teardown()
	}
}

// evict removes neighbours idle for NeighbourEvictAfter that nothing
// refers to (txConns and rxConns are the engine's connection sets, their
// owners' locks held): no TX connection (not even one still closing,
// whose teardown writes to its neighbour), no parked frame, no passive
// connection from the port (its packets reach the host under the
// neighbour's MAC). Their address handle is destroyed and their MAC index
// freed. Without this the table would grow with every peer ever seen.
func (t *neighbourTable) evict(now time.Time, txConns map[*txConn]struct{}, rxConns map[*rxConn]struct{}) {
	var busy map[*neighbour]bool
	var rxPeers map[hca.GID]bool
	for _, n := range t.byGID {
		if now.Sub(n.idleSince()) < t.evictAfter || n.tx != nil || n.nParked > 0 {
			continue
		}
		if busy == nil {
			// Built once per pass, and only when some neighbour is
			// idle long enough: most passes allocate nothing.
			busy = make(map[*neighbour]bool, len(txConns))
			for tc := range txConns {
				busy[tc.neigh] = true
			}
			rxPeers = make(map[hca.GID]bool, len(rxConns))
			for rc := range rxConns {
				rxPeers[rc.peer.GID()] = true
			}
		}
		if busy[n] || rxPeers[n.gid] {
			continue
		}
		t.dropAH(n)
		t.remove(n)
		t.ctr.evicted.Add(1)
		t.log.Debug("neighbour evicted", "peer", n.hw, "mac", n.mac, "idle", now.Sub(n.idleSince()))
	}
}

// flushPaths flushes what every neighbour knows about the path to
// its port, as ipoib_flush_paths does: parked frames are dropped
// (tx_neigh_flushed), address handles destroyed, CM back-off and path MTU
// forgotten. The TX connections were torn down before. Unlike Linux the
// neighbour itself stays: it is the MAC we handed the host for that
// port, and keeping it keeps every ARP/ND entry of the host and of its
// peers valid across down and up (Linux's host neighbours hold the
// port's 20-byte address itself, which cannot go stale); unused ones age
// out as always. The parked frames' buffers and credits go back to tx.
func (t *neighbourTable) flushPaths(tx *txPath) int {
	n := 0
	for _, nb := range t.byGID {
		if nb.tx != nil {
			nb.tx.detachLocked(dropTxNeighFlushed)
		}
		nb.dropParked(tx, dropTxNeighFlushed)
		t.dropAH(nb)
		nb.cmBackoffUntil, nb.pathMTU = time.Time{}, 0
		n++
	}
	return n
}
