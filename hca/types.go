package hca

import (
	"net/netip"
)

// QPN is a 24-bit queue pair number.
type QPN uint32

const (
	// QPNMask keeps the 24 bits of a QPN.
	QPNMask QPN = 0xFFFFFF
	// QPNMulticast is the destination QPN of multicast sends (IBTA 10.5.2.3).
	QPNMulticast QPN = 0xFFFFFF
	// QPNGSI is the General Services Interface QP, the one CM MADs use.
	QPNGSI QPN = 1
)

// QKey is a UD queue key.
type QKey uint32

// QKeyGSI is the well-known Q_Key of the GSI QP.
const QKeyGSI QKey = 0x80010000

// PKey is a partition key; bit 15 is the full-membership bit, the low 15
// bits name the partition.
type PKey uint16

// PKeyDefault is the default partition with full membership.
const PKeyDefault PKey = 0xFFFF

// pkeyFullMember is the membership bit of a P_Key.
const pkeyFullMember PKey = 0x8000

// Valid reports whether k names a partition: 0x0000 and 0x8000 are the
// invalid P_Key (IBTA 10.9.1.2) and never match anything.
func (k PKey) Valid() bool { return k&^pkeyFullMember != 0 }

// Full reports whether k is a full member (bit 15 set); a limited member
// may talk only to full members of its partition.
func (k PKey) Full() bool { return k&pkeyFullMember != 0 }

// Matches is the IBTA partition key match (IBTA 10.9.3), as rxe's
// pkey_match: a packet with P_Key k is accepted by a port or QP holding
// P_Key o when both name the same partition (the low 15 bits), that
// partition is valid, and at least one of the two is a full member; two
// limited members of a partition cannot talk.
func (k PKey) Matches(o PKey) bool {
	return k.Valid() && k&^pkeyFullMember == o&^pkeyFullMember && (k | o).Full()
}

// PKeyIndex finds the table entry of k's partition, preferring a full
// member, as Linux's ib_find_pkey does: the membership a QP sends with is
// the table's (the subnet manager's) value at that index, not k's bit.
func PKeyIndex(table []PKey, k PKey) (int, bool) {
	if !k.Valid() {
		return 0, false
	}
	limited := -1
	for i, e := range table {
		if e&^pkeyFullMember != k&^pkeyFullMember {
			continue
		}
		if e.Full() {
			return i, true
		}
		if limited < 0 {
			limited = i
		}
	}
	return max(limited, 0), limited >= 0
}

// MatchingPKeyIndex is the index of the first table entry a packet with
// P_Key k matches (Matches), the entry that let it in; a GSI response
// goes out with it (Linux's wc.pkey_index).
func MatchingPKeyIndex(table []PKey, k PKey) (int, bool) {
	for i, e := range table {
		if k.Matches(e) {
			return i, true
		}
	}
	return 0, false
}

// GID is a 128-bit global identifier. With RoCEv2 it is an IPv6 address or
// an IPv4-mapped one (::ffff:a.b.c.d).
type GID [16]byte

// String formats the GID like an IPv6 address, as tshark and ibv_devinfo do.
func (g GID) String() string { return netip.AddrFrom16(g).String() }

// IsMulticast reports whether g is a multicast GID (first byte 0xFF).
func (g GID) IsMulticast() bool { return g[0] == 0xFF }

// GIDFromAddr maps an IP address to its GID (IPv4 becomes ::ffff:a.b.c.d).
func GIDFromAddr(a netip.Addr) GID { return GID(a.As16()) }

// Addr returns the IP address the GID stands for, unmapping IPv4.
func (g GID) Addr() netip.Addr { return netip.AddrFrom16(g).Unmap() }

// MTU is an IB path MTU in bytes: 256, 512, 1024, 2048 or 4096.
type MTU int

// The IB MTUs.
const (
	MTU256  MTU = 256
	MTU512  MTU = 512
	MTU1024 MTU = 1024
	MTU2048 MTU = 2048
	MTU4096 MTU = 4096
)

// Valid reports whether m is one of the five IB MTUs.
func (m MTU) Valid() bool {
	switch m {
	case MTU256, MTU512, MTU1024, MTU2048, MTU4096:
		return true
	}
	return false
}

// Enum returns the IBTA encoding (1 = 256 ... 5 = 4096), 0 if invalid.
func (m MTU) Enum() uint8 {
	for e, v := uint8(1), MTU256; v <= MTU4096; e, v = e+1, v*2 {
		if v == m {
			return e
		}
	}
	return 0
}

// MTUFromEnum decodes the IBTA MTU encoding; 0 if out of range.
func MTUFromEnum(e uint8) MTU {
	if e < 1 || e > 5 {
		return 0
	}
	return MTU256 << (e - 1)
}

// QPType is the transport service of a QP.
//
//go:generate go tool stringer -type=QPType -linecomment
type QPType int

// QP types.
const (
	QPTypeRC QPType = iota + 1 // RC
	QPTypeUD                   // UD
	// QPTypeGSI is the UD QP 1; one per device.
	QPTypeGSI // GSI
)

// Port describes the attributes of the device's (single) port.
type Port struct {
	GID       GID
	PKeys     []PKey // the P_Key table; index 0 is the default
	ActiveMTU MTU
	Active    bool // link state: true when PORT_ACTIVE
	// PKeyViolations counts packets the port dropped because their BTH
	// P_Key matched no entry of the table, or not the P_Key of the
	// destination QP (IBTA PortInfo P_KeyViolations, not saturating).
	PKeyViolations uint64
	// UDNoBuffer counts UD datagrams the port dropped because their
	// destination QP had no receive posted (UD has no RNR: the sender
	// never knows). A receiver that falls behind its peers loses packets
	// here first.
	UDNoBuffer uint64
}

// PKeyIndex is PKeyIndex over the port's table.
func (p *Port) PKeyIndex(k PKey) (int, bool) { return PKeyIndex(p.PKeys, k) }

// Limits are the device capabilities a consumer sizes its queues by, and
// the device attributes the CM puts on the wire (Linux ib_device_attr).
type Limits struct {
	MaxQP      int
	MaxQPWR    int // per send or receive queue
	MaxCQE     int
	MaxSRQWR   int
	MaxMsgSize int // largest RC message
	// LocalCAACKDelay is the IBTA 5-bit code (4.096 us * 2^t) of how long
	// the device may take to acknowledge a packet: the CM's REP Target ACK
	// Delay and one input of the REQ's Local ACK Timeout.
	LocalCAACKDelay uint8
	// NodeGUID identifies the CA (the CM's Local CA GUID).
	NodeGUID uint64
	// Offloads are the device's stateless IPoIB offloads.
	Offloads Offloads
}
