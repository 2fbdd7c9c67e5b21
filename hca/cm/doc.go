// Package cm is the InfiniBand Communication Manager (IBTA Vol 1 ch. 12)
// over the GSI QP of any hca.Device.
//
// It has two halves. The codec (REQ, MRA, REJ, REP, RTU, DREQ, DREP and the
// common MAD header, DecodeMAD) is byte-exact to the IBTA tables as Linux
// spells them in include/rdma/ibta_vol1_c12.h, so tshark and a Linux ib_cm
// decode what it writes. The Manager owns the GSI QP (QPN 1, Q_Key
// 0x80010000, P_Key index 0), its CQ and receive buffers, and one goroutine
// that receives MADs and runs the response and time-wait timers of every
// connection's state machine.
//
// Connections follow Linux ib_cm: a REQ gets a fresh transaction ID and the
// REP, RTU, REJ and MRA that answer it reuse it; a DREQ gets a fresh one and
// the DREP reuses it. Requests and replies are retried on response timeout
// up to Max CM Retries; a duplicate REQ is answered with the REP already
// sent (or an MRA while the consumer has not decided yet); a REQ from a
// remote QP that already holds an established connection is rejected as
// STALE_CONN and the old connection is told it is stale, so a restarted
// peer recovers at once.
//
// Handlers run on the Manager's goroutine, outside its lock, and may call
// Conn methods. On REP the QP is moved to RTR and RTS and the handler sees
// EventREPReceived before the RTU leaves, so a consumer can flush packets
// it parked during connection setup without racing the peer's first
// receive (the Linux 2018 start_xmit / cm_rep_handler race).
package cm
