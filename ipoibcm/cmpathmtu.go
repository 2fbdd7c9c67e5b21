package ipoibcm

import (
	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/cm"
)

// Path MTU agreement in the CM exchange. IB takes the path MTU from the
// subnet administrator's path record, which already is the smallest MTU
// along the path, both ports included; with no SA (RoCEv2 over UDP, the
// soft fabric) the REQ carried only our own port MTU, and a peer with a
// smaller one (a different --ib-mtu) silently lost every full-size packet.
// Now the passive side refuses a REQ whose path MTU is above its port's
// with REJ INVALID_MTU (IBTA reason 26), and the active side resends the
// REQ one IB MTU lower at once, without the CM back-off, so two ends with
// different IB MTUs connect at the smaller one within a round trip or two.

// reqPathMTU is the path MTU our next REQ to n carries: our port MTU
// unless the peer refused it.
func (i *Interface) reqPathMTU(n *neighbour) hca.MTU {
	i.neigh.mu.Lock()
	defer i.neigh.mu.Unlock()
	if n.pathMTU != 0 && n.pathMTU < i.port.ActiveMTU {
		return n.pathMTU
	}
	return i.port.ActiveMTU
}

// rejectPathMTU refuses a REQ whose path MTU our port cannot take.
func (p *passiveSet) rejectPathMTU(req *cm.Request) cm.Decision {
	p.limits.ctr.rejectedMTU.Add(1)
	p.log.Info("CM REQ path MTU above our port's: REJ INVALID_MTU, the peer retries lower",
		"from", req.RemoteGID, "path_mtu", req.PathMTU, "port_mtu", p.portMTU)
	return cm.Decision{Reject: cm.RejectInvalidMTU}
}

// lowerPathMTU takes a REJ INVALID_MTU for tc: the next REQ to its peer
// goes one IB MTU lower. It reports false when there is nothing lower to
// try (the peer then gets the usual CM back-off). Control loop.
func (i *Interface) lowerPathMTU(tc *txConn) bool {
	cur := i.reqPathMTU(tc.neigh)
	if cur <= hca.MTU256 {
		return false
	}
	lower := cur / 2
	i.neigh.mu.Lock()
	tc.neigh.pathMTU = lower
	i.neigh.mu.Unlock()
	i.txc.mtuDowngrades.Add(1)
	i.log.Info("peer refused our CM path MTU; the next REQ asks for less", "peer", tc.peer, "path_mtu", cur, "next", lower)
	return true
}
