// Package wire encodes and decodes RoCEv2 transport packets: the base
// transport header (BTH), the datagram and acknowledge extended headers
// (DETH, AETH), pad counts and the invariant CRC (ICRC), exactly as IBTA
// Vol 1 and Annex A17 lay them out and as Linux rxe and tshark read them.
//
// A RoCEv2 packet is the UDP payload of a datagram sent to port 4791:
//
//	BTH(12) [DETH(8) | AETH(4)] payload pad(0..3) ICRC(4)
//
// Every decoder works on caller buffers, allocates nothing and returns an
// error carrying a DropReason for malformed input, so a receiver can count
// why it dropped a packet. The package also holds test helpers other
// packages share: a builder of whole IPv4/UDP/RoCEv2 frames and a classic
// pcap writer whose output tshark decodes.
package wire
