// Package frame holds the link-layer formats of IPoIB and of the Ethernet
// host port, and the translations between them.
//
// IPoIB (RFC 4391, RFC 4755) has no Ethernet header: every payload carries a
// 4-byte encapsulation header (EtherType + reserved), and a link-layer
// address is 20 bytes (flags, UD QPN, GID). The host side of an Interface is
// an Ethernet TAP, so ARP and IPv6 neighbour discovery have to be rewritten
// between the two address formats, and when a packet is too big for the IB
// path the host is told with ICMP "fragmentation needed" or ICMPv6 "packet
// too big".
//
// Everything here is pure and works on caller-provided buffers, so the
// engine's data path calls it without allocating. Parsers return the
// exported sentinel errors unwrapped: the engine maps them to drop counters
// with errors.Is, and a drop must not cost an allocation.
package frame
