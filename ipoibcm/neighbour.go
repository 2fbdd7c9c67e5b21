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
	cmBackoffUntil time.Time // CM refused: UD until then
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
func (t *neighbourTable) lookupOrCreate(hw frame.HWAddr, now time.Time) (*neighbour, error) {
	gid := hw.GID()
	if n := t.byGID[gid]; n != nil {
		return n, nil
	}
	idx := t.nextMAC
	mac := frame.LocalMAC(idx)
	if other := t.byMAC[mac]; other != nil {
		return nil, fmt.Errorf("neighbour %s: MAC %s already maps %s: %w", hw, mac, other.hw, errMACCollision)
	}
	t.nextMAC++
	n := &neighbour{gid: gid, mac: mac, macIndex: idx, hw: hw, created: now, lastUse: now}
	t.byGID[gid] = n
	t.byMAC[mac] = n
	return n, nil
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
