// Package capture records what HCAs carry as a pcapng file that tshark
// and Wireshark decode as RoCEv2: every message of a soft fabric becomes
// IPv6/UDP/4791 packets with a BTH, a DETH (UD) or an AETH (ACK, RNR
// NAK), the payload (CM MADs on QP 1, IPoIB frames otherwise) and a valid
// ICRC, on interface 0 ("fabric", LINKTYPE_RAW). Engine events (QP state
// changes, dead flag set, LAST_WQE, drain posted and completed, reap, REJ
// reasons) go to interface 1 ("events") as records whose comment is the
// event, so a soak failure can be read packet by packet.
//
// The soft fabric has no packets, so this package makes them: an RC
// message is cut into SEND_FIRST/MIDDLE/LAST packets of the path MTU with
// consecutive PSNs per QP, and acknowledged by one ACK carrying the MSN;
// a UD send is one SEND_ONLY. PSNs start at 0 per QP as seen by the
// capture, not at the CM's starting PSN.
//
// Capturing never slows or drops traffic: the fabric's tap copies a
// message into a bounded queue (Stream) or ring (Ring) and returns; when
// the queue's byte budget is spent, records are dropped and counted, and
// the file says so in a comment. Frames are built and written on the
// capture's own goroutine.
package capture
