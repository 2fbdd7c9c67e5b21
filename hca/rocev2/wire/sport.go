package wire

// FlowLabel returns the flow label Linux derives for a QP pair when the
// GRH carries none (rdma_calc_flow_label): the 64-bit product of the QPNs
// folded to 20 bits.
func FlowLabel(lqpn, rqpn uint32) uint32 {
	v := uint64(lqpn) * uint64(rqpn)
	v ^= v >> 20
	v ^= v >> 40
	return uint32(v) & 0xFFFFF
}

// SourcePortMin is IB_ROCE_UDP_ENCAP_VALID_PORT_MIN: per-QP source ports
// lie in 0xC000-0xFFFF.
const SourcePortMin = 0xC000

// UDPSourcePort returns the RoCEv2 entropy source port of a QP pair as
// Linux rdma_get_udp_sport computes it: in 0xC000-0xFFFF and constant per
// QP pair, so one flow is never spread over paths and reordered.
func UDPSourcePort(lqpn, rqpn uint32) uint16 {
	fl := FlowLabel(lqpn, rqpn)
	return uint16(fl&0x3FFF^(fl&0xFC000)>>14) | 0xC000
}

// QPSourcePort is the source port rxe gives a QP when it is created
// (rxe_qp_init_req): 0xC000 + hash_32(QPN, 14). It stays the port of UD
// and GSI QPs, which have no single peer; RC QPs move to UDPSourcePort
// of their QP pair once connected.
func QPSourcePort(qpn uint32) uint16 {
	const goldenRatio32 = 0x61C88647 // include/linux/hash.h GOLDEN_RATIO_32
	return uint16((qpn*goldenRatio32)>>(32-14)&0x3FFF) | 0xC000
}
