package ipoibcm

import (
	"fmt"
	"net/netip"
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
// All fields are guarded by Interface.mu except mac, macIndex and gid,
// which never change.
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

// neighbourTable maps both ways and checks the one-to-one invariant.
type neighbourTable struct {
	byGID   map[hca.GID]*neighbour
	byMAC   map[frame.MAC]*neighbour
	nextMAC uint32
}

func newNeighbourTable() neighbourTable {
	return neighbourTable{
		byGID: make(map[hca.GID]*neighbour),
		byMAC: make(map[frame.MAC]*neighbour),
	}
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
