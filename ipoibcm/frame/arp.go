package frame

import (
	"encoding/binary"
	"net/netip"
)

// ARP constants (RFC 826; hardware type 32 is InfiniBand, RFC 4391).
const (
	ARPRequest = 1
	ARPReply   = 2

	ARPHWEthernet   = 1
	ARPHWInfiniBand = 32

	// IPoIBARPLen is the ARP body carried after the encapsulation header.
	IPoIBARPLen = 8 + 2*(HWAddrLen+4)
	// EthARPLen is the ARP body after the Ethernet header (frames on the
	// wire are padded beyond it; the padding is ignored).
	EthARPLen = 8 + 2*(6+4)

	arpProtoIPv4 = EtherTypeIPv4
	arpIPv4Len   = 4
)

// ARP is the part of an IPv4 ARP message common to both link types.
type ARP struct {
	Op                 uint16
	SenderIP, TargetIP netip.Addr
}

// IPoIBARP is an ARP message with 20-byte IPoIB hardware addresses. The
// sender's 'C' flag travels in SenderHW.
type IPoIBARP struct {
	ARP
	SenderHW, TargetHW HWAddr
}

// EthARP is an ARP message with Ethernet addresses, as the host speaks it.
type EthARP struct {
	ARP
	SenderMAC, TargetMAC MAC
}

// parseARPFixed checks the 8-byte ARP header for the given hardware
// flavour and returns the opcode.
func parseARPFixed(b []byte, hwType uint16, hwLen int, bodyLen int) (uint16, error) {
	if len(b) < bodyLen {
		return 0, ErrTruncated
	}
	if binary.BigEndian.Uint16(b[0:2]) != hwType ||
		binary.BigEndian.Uint16(b[2:4]) != arpProtoIPv4 ||
		int(b[4]) != hwLen || b[5] != arpIPv4Len {
		return 0, ErrARPFormat
	}
	op := binary.BigEndian.Uint16(b[6:8])
	if op != ARPRequest && op != ARPReply {
		return 0, ErrARPOp
	}
	return op, nil
}

func putARPFixed(b []byte, hwType uint16, hwLen int, op uint16) {
	binary.BigEndian.PutUint16(b[0:2], hwType)
	binary.BigEndian.PutUint16(b[2:4], arpProtoIPv4)
	b[4] = byte(hwLen)
	b[5] = arpIPv4Len
	binary.BigEndian.PutUint16(b[6:8], op)
}

// putIPv4 writes an address as 4 bytes; an invalid or IPv6 address writes
// 0.0.0.0 rather than panicking, since ARP can only carry IPv4.
func putIPv4(b []byte, a netip.Addr) {
	if a.Is4() || a.Is4In6() {
		v := a.Unmap().As4()
		copy(b, v[:])
		return
	}
	clear(b[:4])
}

// ParseIPoIBARP parses the 56-byte ARP body that follows the IPoIB
// encapsulation header. Bytes past the body are ignored.
func ParseIPoIBARP(b []byte) (IPoIBARP, error) {
	op, err := parseARPFixed(b, ARPHWInfiniBand, HWAddrLen, IPoIBARPLen)
	if err != nil {
		return IPoIBARP{}, err
	}
	return IPoIBARP{
		ARP: ARP{
			Op:       op,
			SenderIP: netip.AddrFrom4([4]byte(b[28:32])),
			TargetIP: netip.AddrFrom4([4]byte(b[52:56])),
		},
		SenderHW: HWAddr(b[8:28]),
		TargetHW: HWAddr(b[32:52]),
	}, nil
}

// Marshal writes the 56-byte body into b and returns IPoIBARPLen, or 0 if b
// is too short.
func (a *IPoIBARP) Marshal(b []byte) int {
	if len(b) < IPoIBARPLen {
		return 0
	}
	putARPFixed(b, ARPHWInfiniBand, HWAddrLen, a.Op)
	copy(b[8:28], a.SenderHW[:])
	putIPv4(b[28:32], a.SenderIP)
	copy(b[32:52], a.TargetHW[:])
	putIPv4(b[52:56], a.TargetIP)
	return IPoIBARPLen
}

// ParseEthARP parses the 28-byte Ethernet ARP body that follows the
// Ethernet header. Padding past the body is ignored.
func ParseEthARP(b []byte) (EthARP, error) {
	op, err := parseARPFixed(b, ARPHWEthernet, 6, EthARPLen)
	if err != nil {
		return EthARP{}, err
	}
	return EthARP{
		ARP: ARP{
			Op:       op,
			SenderIP: netip.AddrFrom4([4]byte(b[14:18])),
			TargetIP: netip.AddrFrom4([4]byte(b[24:28])),
		},
		SenderMAC: MAC(b[8:14]),
		TargetMAC: MAC(b[18:24]),
	}, nil
}

// Marshal writes the 28-byte body into b and returns EthARPLen, or 0 if b is
// too short.
func (a *EthARP) Marshal(b []byte) int {
	if len(b) < EthARPLen {
		return 0
	}
	putARPFixed(b, ARPHWEthernet, 6, a.Op)
	copy(b[8:14], a.SenderMAC[:])
	putIPv4(b[14:18], a.SenderIP)
	copy(b[18:24], a.TargetMAC[:])
	putIPv4(b[24:28], a.TargetIP)
	return EthARPLen
}

// ToIPoIB is the host's ARP as it goes on the IB wire: same opcode and IP
// addresses, the given hardware addresses (the Interface's own as sender; a
// zero target in a request, as Linux arp_create sends).
func (a *EthARP) ToIPoIB(senderHW, targetHW HWAddr) IPoIBARP {
	return IPoIBARP{ARP: a.ARP, SenderHW: senderHW, TargetHW: targetHW}
}

// ToEthernet is an IB peer's ARP as the host sees it: the sender's MAC is
// the one the engine mapped its hardware address to.
func (a *IPoIBARP) ToEthernet(senderMAC, targetMAC MAC) EthARP {
	return EthARP{ARP: a.ARP, SenderMAC: senderMAC, TargetMAC: targetMAC}
}
