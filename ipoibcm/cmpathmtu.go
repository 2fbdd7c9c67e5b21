package ipoibcm

import "github.com/ipoibcm/ipoib/hca/cm"

// Path MTU agreement in the CM exchange. IB takes the path MTU from the
// subnet administrator's path record, which already is the smallest MTU
// along the path, both ports included; with no SA (RoCEv2 over UDP, the
// soft fabric) the REQ carried only our own port MTU, and a peer with a
// smaller one (a different --ib-mtu) silently lost every full-size packet.
// Now the passive side refuses a REQ whose path MTU is above its port's
// with REJ INVALID_MTU (IBTA reason 26), and the active side resends the
// REQ one IB MTU lower at once, without the CM back-off, so two ends with
// different IB MTUs connect at the smaller one within a round trip or two.

// rejectPathMTU refuses a REQ whose path MTU our port cannot take.
func (p *passiveSet) rejectPathMTU(req *cm.Request) cm.Decision {
	p.limits.ctr.rejectedMTU.Add(1)
	p.log.Info("CM REQ path MTU above our port's: REJ INVALID_MTU, the peer retries lower",
		"from", req.RemoteGID, "path_mtu", req.PathMTU, "port_mtu", p.portMTU)
	return cm.Decision{Reject: cm.RejectInvalidMTU}
}
