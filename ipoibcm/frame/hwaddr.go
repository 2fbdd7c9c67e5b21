package frame

import (
	"encoding/binary"
	"encoding/hex"

	"github.com/ipoibcm/ipoib/hca"
)

// Link constants of IPoIB (RFC 4391, RFC 4755) as Linux uses them.
const (
	// EncapLen is the IPoIB encapsulation header: EtherType + reserved.
	EncapLen = 4
	// HWAddrLen is INFINIBAND_ALEN: flags, 24-bit UD QPN, 16-byte GID.
	HWAddrLen = 20
	// EthHdrLen is an untagged Ethernet II header without FCS.
	EthHdrLen = 14
	// FlagRC is the 'C' flag in hardware-address byte 0: the interface
	// accepts RC connections (RFC 4755, Linux IPOIB_FLAGS_RC).
	FlagRC = 0x80
	// FlagUC advertises UC connections; Linux never sets it and neither do
	// we, but a peer's address may carry it.
	FlagUC = 0x40
	// QKeyIPoIB is OpenSM's default Q_Key of the IPoIB broadcast group,
	// used by all IPoIB UD traffic.
	QKeyIPoIB hca.QKey = 0x0B1B
	// CMMTU is Linux IPOIB_CM_MTU: the largest IP MTU in connected mode,
	// 64 KiB minus 16 so the header stays 16-byte aligned.
	CMMTU = 65520
	// CMBufSize is the receive size advertised in CM private data: CMMTU
	// plus the encapsulation header (Linux IPOIB_CM_BUF_SIZE).
	CMBufSize = CMMTU + EncapLen
)

// EtherTypes IPoIB carries.
const (
	EtherTypeIPv4 = 0x0800
	EtherTypeARP  = 0x0806
	EtherTypeIPv6 = 0x86DD
)

// HWAddr is an IPoIB link-layer address: byte 0 flags, bytes 1-3 the UD QPN
// (big-endian), bytes 4-19 the port GID or a multicast GID.
type HWAddr [HWAddrLen]byte

// NewHWAddr builds the hardware address of an interface with UD QP qpn on
// the port with GID gid. Only the low 24 bits of qpn are used.
func NewHWAddr(flags byte, qpn hca.QPN, gid hca.GID) HWAddr {
	var a HWAddr
	binary.BigEndian.PutUint32(a[0:4], uint32(qpn&hca.QPNMask))
	a[0] = flags
	copy(a[4:], gid[:])
	return a
}

// Flags returns byte 0 (FlagRC, FlagUC).
func (a HWAddr) Flags() byte { return a[0] }

// QPN returns the 24-bit UD QPN (Linux IPOIB_QPN).
func (a HWAddr) QPN() hca.QPN {
	return hca.QPN(binary.BigEndian.Uint32(a[0:4])) & hca.QPNMask
}

// GID returns the port or multicast GID.
func (a HWAddr) GID() hca.GID { return hca.GID(a[4:20]) }

// Connected reports whether the owner accepts RC connections ('C' flag).
func (a HWAddr) Connected() bool { return a[0]&FlagRC != 0 }

// IsMulticast reports whether the address names a multicast group; Linux
// ipoib_start_xmit tests exactly this byte.
func (a HWAddr) IsMulticast() bool { return a[4] == 0xff }

// IsZero reports whether every byte is zero (the target of an ARP request).
func (a HWAddr) IsZero() bool { return a == HWAddr{} }

// String returns the 40 hex digits tshark prints for arp.src.hw.
func (a HWAddr) String() string {
	var buf [2 * HWAddrLen]byte
	hex.Encode(buf[:], a[:])
	return string(buf[:])
}

// ColonString returns the address as ip link prints link/infiniband:
// twenty colon-separated hex bytes.
func (a HWAddr) ColonString() string {
	const hexdig = "0123456789abcdef"
	buf := make([]byte, 0, 3*HWAddrLen-1)
	for i, b := range a {
		if i > 0 {
			buf = append(buf, ':')
		}
		buf = append(buf, hexdig[b>>4], hexdig[b&0xf])
	}
	return string(buf)
}

// UDMTU is the IP MTU of datagram mode on an IB path MTU: the encapsulation
// header comes out of the single packet a UD message is (IPOIB_UD_MTU).
func UDMTU(ib hca.MTU) int { return int(ib) - EncapLen }
