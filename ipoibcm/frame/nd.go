package frame

import (
	"net/netip"

	"github.com/ipoibcm/ipoib/internal/packet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// IPv6 and neighbour discovery constants (RFC 8200, RFC 4861).
const (
	ndHopLimit = 255

	ICMPv6RouterSolicit   = 133
	ICMPv6RouterAdvert    = 134
	ICMPv6NeighborSolicit = 135
	ICMPv6NeighborAdvert  = 136
	ICMPv6Redirect        = 137

	NDOptSourceLL = 1
	NDOptTargetLL = 2

	// ndOptUnit is the unit of the option length field.
	ndOptUnit = 8
	// ethLLOptLen is an Ethernet link-layer option: type, length 1, MAC.
	ethLLOptLen = 8
	// ibLLOptLen is an IPoIB link-layer option: type, length 3, two pad
	// bytes (Linux ndisc_addr_option_pad for ARPHRD_INFINIBAND), hwaddr.
	ibLLOptLen = 24
	ibLLOptPad = 2
)

// NDInfo describes a rewritten ND message so the engine can learn the
// neighbour. HW fields are the IPoIB side, MAC fields the Ethernet side of
// the link-layer options, whichever direction was rewritten; Target is the
// target address of NS, NA and Redirect.
type NDInfo struct {
	Type                     uint8
	Target                   netip.Addr
	HasSourceLL, HasTargetLL bool
	SourceHW, TargetHW       HWAddr
	SourceMAC, TargetMAC     MAC
}

// ndFixedLen is the ICMPv6 message length before the options.
func ndFixedLen(icmpType uint8) int {
	switch icmpType {
	case ICMPv6RouterSolicit:
		return 8
	case ICMPv6RouterAdvert:
		return 16
	case ICMPv6NeighborSolicit, ICMPv6NeighborAdvert:
		return 24
	case ICMPv6Redirect:
		return 40
	}
	return 0
}

// ndMessage returns the ICMPv6 message of an ND packet (the IPv6 payload,
// trailing bytes beyond the payload length cut off).
func ndMessage(ipv6 []byte) ([]byte, error) {
	if len(ipv6) < header.IPv6MinimumSize {
		return nil, ErrTruncated
	}
	ip := header.IPv6(ipv6)
	if header.IPVersion(ipv6) != header.IPv6Version || ip.NextHeader() != packet.ProtoICMPv6 || ip.HopLimit() != ndHopLimit {
		return nil, ErrNotND
	}
	n, ok := packet.IPv6Length(ipv6)
	if !ok {
		return nil, ErrTruncated
	}
	msg := ipv6[header.IPv6MinimumSize:n]
	if len(msg) < 4 {
		return nil, ErrTruncated
	}
	fixed := ndFixedLen(msg[0])
	if fixed == 0 || msg[1] != 0 {
		return nil, ErrNotND
	}
	if len(msg) < fixed {
		return nil, ErrTruncated
	}
	return msg, nil
}

// IsND reports whether an IPv6 packet is neighbour discovery that needs its
// link-layer options rewritten: ICMPv6 (no extension headers) type 133-137,
// code 0, hop limit 255, long enough for its fixed part.
func IsND(ipv6 []byte) bool {
	_, err := ndMessage(ipv6)
	return err == nil
}

// ndDirection says which link form the input options have.
type ndDirection int

const (
	ndToIPoIB ndDirection = iota
	ndToEthernet
)

// ndLayout validates the options of msg for the input form of dir and
// returns the length of the rewritten message.
func ndLayout(msg []byte, dir ndDirection) (int, error) {
	inLL, outLL := ethLLOptLen, ibLLOptLen
	if dir == ndToEthernet {
		inLL, outLL = ibLLOptLen, ethLLOptLen
	}
	out := ndFixedLen(msg[0])
	for off := out; off < len(msg); {
		if len(msg)-off < 2 {
			return 0, ErrNDOption
		}
		olen := int(msg[off+1]) * ndOptUnit
		if olen == 0 || olen > len(msg)-off {
			return 0, ErrNDOption
		}
		switch typ := msg[off]; {
		case typ != NDOptSourceLL && typ != NDOptTargetLL:
			out += olen
		case olen != inLL:
			return 0, ErrNDOption
		case dir == ndToIPoIB && msg[0] == ICMPv6Redirect && typ == NDOptTargetLL:
			// A host's Redirect names another neighbour's MAC, which has
			// no IPoIB address we could put here; the option is optional
			// (RFC 4861 §8.2), so it is left out.
		default:
			out += outLL
		}
		off += olen
	}
	return out, nil
}

// ndVerifyChecksum checks the ICMPv6 checksum of the ND packet ipv6 whose
// message is msg.
func ndVerifyChecksum(ipv6, msg []byte) error {
	if packet.Sum(msg, packet.PseudoHeaderSum(ipv6, true, packet.ProtoICMPv6, len(msg))) != 0xffff {
		return ErrChecksum
	}
	return nil
}

// ndPrepare validates ipv6 and dst for a rewrite and writes the IPv6 header
// and the fixed part of the message; it returns the input message and the
// output length of the whole packet.
func ndPrepare(dst, ipv6 []byte, dir ndDirection) (msg []byte, n int, info NDInfo, err error) {
	msg, err = ndMessage(ipv6)
	if err != nil {
		return nil, 0, info, err
	}
	outMsgLen, err := ndLayout(msg, dir)
	if err != nil {
		return nil, 0, info, err
	}
	if err := ndVerifyChecksum(ipv6, msg); err != nil {
		return nil, 0, info, err
	}
	n = header.IPv6MinimumSize + outMsgLen
	if outMsgLen > 0xffff || len(dst) < n {
		return nil, 0, info, ErrNoSpace
	}
	fixed := ndFixedLen(msg[0])
	copy(dst[:header.IPv6MinimumSize], ipv6[:header.IPv6MinimumSize])
	copy(dst[header.IPv6MinimumSize:header.IPv6MinimumSize+fixed], msg[:fixed])
	info.Type = msg[0]
	if fixed >= 24 {
		info.Target = netip.AddrFrom16([16]byte(msg[8:24]))
	}
	return msg, n, info, nil
}

// ndFinish sets the payload length and the ICMPv6 checksum of the rewritten
// packet pkt.
func ndFinish(pkt []byte) {
	msg := header.ICMPv6(pkt[header.IPv6MinimumSize:])
	header.IPv6(pkt).SetPayloadLength(uint16(len(msg)))
	msg.SetChecksum(0)
	msg.SetChecksum(^packet.Sum(msg, packet.PseudoHeaderSum(pkt, true, packet.ProtoICMPv6, len(msg))))
}

// NDToIPoIB rewrites an ND packet from the host for the IB side: every
// Ethernet link-layer option becomes an IPoIB one carrying own, except the
// Target Link-Layer option of a Redirect, which is dropped. Other options
// are copied. The payload length and checksum are recomputed; the input
// checksum must verify. dst must not overlap ipv6 and needs room for 16
// more bytes per option. n is the length of the packet written to dst.
func NDToIPoIB(dst, ipv6 []byte, own HWAddr) (n int, info NDInfo, err error) {
	msg, n, info, err := ndPrepare(dst, ipv6, ndToIPoIB)
	if err != nil {
		return 0, NDInfo{}, err
	}
	w := header.IPv6MinimumSize + ndFixedLen(msg[0])
	for off := ndFixedLen(msg[0]); off < len(msg); {
		opt := msg[off : off+int(msg[off+1])*ndOptUnit]
		off += len(opt)
		switch opt[0] {
		case NDOptSourceLL:
			if !info.HasSourceLL {
				info.HasSourceLL, info.SourceMAC, info.SourceHW = true, MAC(opt[2:8]), own
			}
		case NDOptTargetLL:
			if msg[0] == ICMPv6Redirect {
				continue
			}
			if !info.HasTargetLL {
				info.HasTargetLL, info.TargetMAC, info.TargetHW = true, MAC(opt[2:8]), own
			}
		default:
			w += copy(dst[w:], opt)
			continue
		}
		w += putIBLLOption(dst[w:], opt[0], own)
	}
	ndFinish(dst[:n])
	return n, info, nil
}

// NDToEthernet rewrites an ND packet from an IB peer for the host: every
// IPoIB link-layer option becomes an Ethernet one carrying the MAC macOf
// maps its hardware address to; ErrUnmappedHW if macOf refuses. info reports
// the peer's original hardware addresses so the engine learns the
// neighbour. The payload length and checksum are recomputed; the input
// checksum must verify. dst must not overlap ipv6.
func NDToEthernet(dst, ipv6 []byte, macOf func(HWAddr) (MAC, bool)) (n int, info NDInfo, err error) {
	msg, n, info, err := ndPrepare(dst, ipv6, ndToEthernet)
	if err != nil {
		return 0, NDInfo{}, err
	}
	w := header.IPv6MinimumSize + ndFixedLen(msg[0])
	for off := ndFixedLen(msg[0]); off < len(msg); {
		opt := msg[off : off+int(msg[off+1])*ndOptUnit]
		off += len(opt)
		if opt[0] != NDOptSourceLL && opt[0] != NDOptTargetLL {
			w += copy(dst[w:], opt)
			continue
		}
		hw := HWAddr(opt[ibLLOptPad+2:])
		mac, ok := macOf(hw)
		if !ok {
			return 0, NDInfo{}, ErrUnmappedHW
		}
		// Linux ignores repeated link-layer options, so the first one is
		// what a neighbour is learned from.
		switch {
		case opt[0] == NDOptSourceLL && !info.HasSourceLL:
			info.HasSourceLL, info.SourceHW, info.SourceMAC = true, hw, mac
		case opt[0] == NDOptTargetLL && !info.HasTargetLL:
			info.HasTargetLL, info.TargetHW, info.TargetMAC = true, hw, mac
		}
		w += putEthLLOption(dst[w:], opt[0], mac)
	}
	ndFinish(dst[:n])
	return n, info, nil
}

func putIBLLOption(b []byte, typ uint8, hw HWAddr) int {
	b[0], b[1] = typ, ibLLOptLen/ndOptUnit
	b[2], b[3] = 0, 0
	copy(b[2+ibLLOptPad:ibLLOptLen], hw[:])
	return ibLLOptLen
}

func putEthLLOption(b []byte, typ uint8, mac MAC) int {
	b[0], b[1] = typ, ethLLOptLen/ndOptUnit
	copy(b[2:ethLLOptLen], mac[:])
	return ethLLOptLen
}
