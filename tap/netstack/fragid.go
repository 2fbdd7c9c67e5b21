package netstack

import (
	"encoding/binary"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// fragRenumberer gives the IPv4 fragments gVisor makes of its own
// don't-fragment packets a unique identification per datagram.
//
// gVisor sends TCP with DF set and, as RFC 6864 allows for atomic
// datagrams, IP ID 0. When the link MTU shrinks under a connection whose
// MSS was set for the old MTU, gVisor's IPv4 layer fragments those packets
// anyway, and every fragment of every segment carries ID 0: the receiver
// keys reassembly on (source, destination, protocol, ID), so after one lost
// fragment it joins fragments of different segments, the result fails its
// TCP checksum, and the connection crawls from one retransmission timeout
// to the next (measured: 90 and 700 RTOs, 20 s and 3 min, for 32 MiB after
// a 65520 -> 4092 mode switch). gVisor writes a packet's fragments one after
// another, first fragment first, so a fresh ID at each first fragment,
// kept for the fragments that follow, makes them unique again.
type fragRenumberer struct {
	next uint16 // the ID the next datagram gets; never 0
	cur  uint16 // the ID of the datagram being fragmented
}

// renumber rewrites frame's IPv4 ID if it is a fragment with ID 0.
func (r *fragRenumberer) renumber(frame []byte) {
	if len(frame) < ethernetHeaderLen+header.IPv4MinimumSize ||
		binary.BigEndian.Uint16(frame[12:14]) != uint16(header.IPv4ProtocolNumber) {
		return
	}
	ip := header.IPv4(frame[ethernetHeaderLen:])
	more, offset := ip.More(), ip.FragmentOffset()
	if (!more && offset == 0) || ip.ID() != 0 || header.IPVersion(ip) != header.IPv4Version {
		return
	}
	if offset == 0 {
		if r.next == 0 {
			r.next = 1
		}
		r.cur = r.next
		r.next++
	}
	if r.cur == 0 {
		return // a later fragment whose first we never saw: leave it
	}
	ip.SetID(r.cur)
	ip.SetChecksum(0)
	ip.SetChecksum(^ip.CalculateChecksum())
}
