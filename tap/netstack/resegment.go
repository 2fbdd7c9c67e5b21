package netstack

import (
	"encoding/binary"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// tcpCutter cuts one TCP segment that the stack queued while the link MTU
// was larger into segments that fit the current MTU, as a NIC's TSO would.
//
// Why the link does this rather than leave it to the engine's ICMP
// frag-needed: when the MTU shrinks under a running transfer (an IPoIB
// mode switch, 65520 -> 4092) the frames already queued make up the tail
// of the sender's flight. Dropping them loses that whole tail, and
// gVisor's TCP, unlike Linux's tcp_simple_retransmit, recovers from a
// lost tail after a PMTU decrease at two segments per retransmission
// timeout: after the RTO, RACK marks the old flight lost and enters SACK
// recovery, but the RFC 6675 pipe (counted in the new, 16 times smaller
// MSS, and blind to RACK's marks) stays above the congestion window, so
// nothing is sent until the next RTO. Cutting the queued frames loses
// nothing, so there is nothing to recover.
//
// Only plain TCP is cut: IPv4 without fragmentation, IPv6 with TCP as the
// first next header. Anything else too big goes out whole, for the engine
// to answer with ICMP.
type tcpCutter struct {
	frame []byte // the whole segment being cut, link header included
	size  int    // bytes of frame in use

	v6      bool
	tcpOff  int // offset of the TCP header in frame
	dataOff int // offset of the payload in frame
	maxData int // payload bytes per cut
	next    int // offset in frame of the next payload byte to send
	cuts    int // cuts made so far, for the IPv4 identification

	// checksums is false when the stack leaves TCP checksums to the link
	// (Config.SkipTXChecksums): the cuts then carry none either.
	checksums bool
}

func newTCPCutter(checksums bool) tcpCutter {
	return tcpCutter{frame: make([]byte, maxFrameSize), checksums: checksums}
}

// pending reports whether a segment is partly cut.
func (c *tcpCutter) pending() bool { return c.next < c.size }

// load takes the serialised frame in c.frame[:size] and prepares to cut it
// to ipMTU. It reports false, leaving nothing pending, when the frame is not
// a TCP segment it can cut or already fits.
func (c *tcpCutter) load(size, ipMTU int) bool {
	c.size, c.next, c.cuts = 0, 0, 0
	f := c.frame[:size]
	tcpOff, v6, ok := tcpOffset(f)
	if !ok || len(f)-tcpOff < header.TCPMinimumSize {
		return false
	}
	tcpLen := int(f[tcpOff+12]>>4) * 4
	if tcpLen < header.TCPMinimumSize || tcpOff+tcpLen > len(f) {
		return false
	}
	dataOff := tcpOff + tcpLen
	maxData := ipMTU - (dataOff - ethernetHeaderLen)
	if maxData <= 0 || len(f)-ethernetHeaderLen <= ipMTU || len(f) == dataOff {
		return false
	}
	if !ipLengthMatches(f, v6) {
		return false
	}
	c.size, c.v6, c.tcpOff, c.dataOff, c.maxData, c.next = size, v6, tcpOff, dataOff, maxData, dataOff
	return true
}

// tcpOffset finds the TCP header of an Ethernet frame carrying IPv4 or IPv6.
func tcpOffset(f []byte) (off int, v6, ok bool) {
	if len(f) < ethernetHeaderLen {
		return 0, false, false
	}
	ip := f[ethernetHeaderLen:]
	switch binary.BigEndian.Uint16(f[12:14]) {
	case uint16(header.IPv4ProtocolNumber):
		if len(ip) < header.IPv4MinimumSize || ip[0]>>4 != 4 {
			return 0, false, false
		}
		ihl := int(ip[0]&0x0f) * 4
		fragment := binary.BigEndian.Uint16(ip[6:8])&0x3fff != 0
		if ihl < header.IPv4MinimumSize || len(ip) < ihl || fragment || ip[9] != uint8(header.TCPProtocolNumber) {
			return 0, false, false
		}
		return ethernetHeaderLen + ihl, false, true
	case uint16(header.IPv6ProtocolNumber):
		if len(ip) < header.IPv6MinimumSize || ip[0]>>4 != 6 || ip[6] != uint8(header.TCPProtocolNumber) {
			return 0, false, false
		}
		return ethernetHeaderLen + header.IPv6MinimumSize, true, true
	}
	return 0, false, false
}

// ipLengthMatches checks the IP length field covers exactly the frame, so
// the cut lengths written back are right.
func ipLengthMatches(f []byte, v6 bool) bool {
	ip := f[ethernetHeaderLen:]
	if v6 {
		return int(binary.BigEndian.Uint16(ip[4:6])) == len(ip)-header.IPv6MinimumSize
	}
	return int(binary.BigEndian.Uint16(ip[2:4])) == len(ip)
}

// cut writes the next segment into dst and returns its length, or 0 if dst
// is too small for it (the caller gives a buffer of at least the MTU plus
// the link header).
func (c *tcpCutter) cut(dst []byte) int {
	n := min(c.maxData, c.size-c.next)
	total := c.dataOff + n
	if len(dst) < total {
		return 0
	}
	copy(dst, c.frame[:c.dataOff])
	copy(dst[c.dataOff:], c.frame[c.next:c.next+n])
	first, last := c.next == c.dataOff, c.next+n == c.size

	tcp := header.TCP(dst[c.tcpOff:total])
	tcp.SetSequenceNumber(header.TCP(c.frame[c.tcpOff:]).SequenceNumber() + uint32(c.next-c.dataOff))
	flags := tcp.Flags()
	if !last {
		flags &^= header.TCPFlagFin | header.TCPFlagPsh
	}
	if !first {
		flags &^= header.TCPFlagCwr
	}
	tcp.SetFlags(uint8(flags))

	ip := dst[ethernetHeaderLen:total]
	var src, dstAddr tcpip.Address
	if c.v6 {
		h := header.IPv6(ip)
		h.SetPayloadLength(uint16(len(ip) - header.IPv6MinimumSize))
		src, dstAddr = h.SourceAddress(), h.DestinationAddress()
	} else {
		h := header.IPv4(ip)
		h.SetTotalLength(uint16(len(ip)))
		h.SetID(h.ID() + uint16(c.cuts))
		h.SetChecksum(0)
		h.SetChecksum(^h.CalculateChecksum())
		src, dstAddr = h.SourceAddress(), h.DestinationAddress()
	}
	if c.checksums {
		tcp.SetChecksum(0)
		xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, src, dstAddr, uint16(len(tcp)))
		tcp.SetChecksum(^checksum.Checksum(tcp, xsum))
	}
	c.next += n
	c.cuts++
	return total
}
