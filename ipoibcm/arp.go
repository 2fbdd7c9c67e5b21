package ipoibcm

import (
	"net/netip"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// txARPLocked turns a host Ethernet ARP packet into IPoIB ARP (hardware
// type 32, 20-byte addresses) in place and sends it over UD: to the
// broadcast group for requests the host broadcast, unicast to the
// neighbour behind the destination MAC otherwise.
func (i *Interface) txARPLocked(t *txScratch, bufIdx int, h frame.EthHeader, payload []byte, now time.Time) bool {
	a, err := frame.ParseEthARP(payload)
	if err != nil {
		i.ctr.drop(dropTxBadARP)
		return false
	}
	i.noteHostIPLocked(a.SenderIP)
	var target frame.HWAddr
	if a.TargetMAC != (frame.MAC{}) {
		if n := i.neigh.lookupMAC(a.TargetMAC); n != nil {
			target = n.hw
		}
	}
	ib := a.ToIPoIB(i.hw, target)
	b := i.pool.bufs[bufIdx]
	size := frame.EthHdrLen + ib.Marshal(b[frame.EthHdrLen:])
	var n *neighbour
	if !h.Dst.IsMulticast() {
		n = i.neigh.lookupMAC(h.Dst)
	}
	if n == nil {
		// A unicast request to a MAC we no longer map is the host
		// re-probing a stale ARP entry of an evicted neighbour: asking the
		// broadcast group instead lets the peer answer at once, with the
		// MAC it maps to now, rather than after the host gives up on
		// unicast probes. Anything else to an unknown MAC has no target.
		if !h.Dst.IsMulticast() && a.Op != frame.ARPRequest {
			i.ctr.drop(dropTxUnknownNeighbour)
			return false
		}
		ah, err := i.groupAHLocked(i.bcast)
		if err != nil {
			i.ctr.drop(dropTxNoAH)
			return false
		}
		return i.postUDLocked(&t.wr, ah, 0xFFFFFF, bufIdx, size, frame.EtherTypeARP)
	}
	n.lastUse = now
	ah, err := i.neighAHLocked(n)
	if err != nil {
		i.ctr.drop(dropTxNoAH)
		return false
	}
	return i.postUDLocked(&t.wr, ah, n.hw.QPN(), bufIdx, size, frame.EtherTypeARP)
}

// noteHostIPLocked remembers an address the host uses.
func (i *Interface) noteHostIPLocked(a netip.Addr) {
	if !a.IsValid() || a.IsUnspecified() {
		return
	}
	for _, b := range i.hostIPs {
		if a == b {
			return
		}
	}
	if len(i.hostIPs) < 64 {
		i.hostIPs = append(i.hostIPs, a)
	}
}

// learnLocked records that hw is the current hardware address of its port
// (seen in ARP, ND, a UD source or a CM REQ) and returns its neighbour. A
// changed QPN means the peer restarted: its TX connection went to a QP
// that no longer exists and is flushed at once.
func (i *Interface) learnLocked(hw frame.HWAddr, ip netip.Addr, now time.Time) *neighbour {
	if hw.IsMulticast() || hw.GID() == i.hw.GID() {
		return nil
	}
	_, known := i.neigh.byGID[hw.GID()]
	n, err := i.neigh.lookupOrCreate(hw, now)
	if err != nil {
		i.log.Error("neighbour table", "err", err)
		return nil
	}
	if !known {
		i.log.Debug("neighbour", "ip", ip, "hw", hw, "mac", n.mac)
	}
	n.addIP(ip)
	n.lastSeen = now
	if n.hw != hw {
		old := n.hw
		n.hw = hw
		i.log.Debug("neighbour", "ip", ip, "hw", hw, "was", old, "mac", n.mac)
		if old.QPN() != hw.QPN() || (old.Connected() && !hw.Connected()) {
			i.rs.neighRestarts.Add(1)
			n.cmBackoffUntil = time.Time{}
			if n.tx != nil {
				tc := n.tx
				i.detachTXLocked(tc, dropTxNeighFlushed)
				i.ctl.post(func() { i.teardownTX(tc) })
			}
		}
	}
	return n
}

// reresolve asks ARP again for a neighbour's IPv4 addresses, from the
// engine itself (sender = our hardware address and a host address), so a
// peer that came back with a new UD QPN is relearnt without waiting for
// the host's ARP cache to expire. The reply also reaches the host, which
// takes it as a confirmation. Control loop.
func (i *Interface) reresolve(n *neighbour) {
	i.mu.Lock()
	defer i.mu.Unlock()
	var src netip.Addr
	for _, a := range i.hostIPs {
		if a.Is4() {
			src = a
			break
		}
	}
	if !src.IsValid() {
		return
	}
	var wr [1]hca.SendWR
	for _, ip := range n.ips {
		if !ip.Is4() || i.creditsFree() < 2 {
			continue
		}
		var idx [1]int
		if i.pool.take(idx[:]) == 0 {
			return
		}
		b := i.pool.bufs[idx[0]]
		req := frame.IPoIBARP{ARP: frame.ARP{Op: arpOpRequest, SenderIP: src, TargetIP: ip}, SenderHW: i.hw}
		size := frame.EthHdrLen + req.Marshal(b[frame.EthHdrLen:])
		ah, err := i.groupAHLocked(i.bcast)
		if err != nil || !i.postUDLocked(&wr, ah, hca.QPNMulticast, idx[0], size, frame.EtherTypeARP) {
			i.pool.put1(idx[0])
			return
		}
		i.rs.reresolves.Add(1)
	}
}
