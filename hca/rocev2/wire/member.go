package wire

import (
	"encoding/binary"
	"net/netip"
)

// Membership MADs spread the head-end replication set of a fabric without
// multicast (docs/wire.md §6): a vendor-specific MAD (management class
// 0x09, IBA 13.4.4 vendor range 1, which needs no OUI) sent to QP 1 with
// Q_Key 0x80010000 like any GSI MAD, so a RoCEv2 analyser decodes it as a
// MAD and a stack that does not know the class drops it. A Get asks for
// the members known to the receiver starting at index Offset (the
// attribute modifier); the GetResp with the request's transaction ID
// carries up to MaxMemberAddrs(v6) of them and the total. Both are
// MemberMADLen bytes, so answering a request never sends more than it
// received.
//
// MAD layout (256 bytes): the 24-byte common header (base version 1,
// class 0x09, class version 1, method, status 0, class-specific 0, TID,
// attribute ID MemberAttrID, reserved, attribute modifier = offset) and
// 232 data bytes: version 1, address length 4 or 16, total members
// (uint16), address count (uint8), 3 reserved, then the addresses.
const (
	MemberMADLen    = 256
	MemberMgmtClass = 0x09
	MemberAttrID    = 0xFF01
	// MemberGet and MemberGetResp are the MAD methods (IBA 13.4.5).
	MemberGet     = 0x01
	MemberGetResp = 0x81

	madHeaderLen    = 24
	memberDataHead  = 8
	memberVersion   = 1
	memberDataBytes = MemberMADLen - madHeaderLen - memberDataHead
)

// MaxMemberAddrs is how many addresses of a family one MAD carries: 56
// IPv4 or 14 IPv6.
func MaxMemberAddrs(v6 bool) int {
	if v6 {
		return memberDataBytes / 16
	}
	return memberDataBytes / 4
}

// MemberMAD is a decoded membership MAD. Addrs is the caller's buffer:
// ParseMemberMAD appends to Addrs[:0] within its capacity.
type MemberMAD struct {
	Method uint8
	TID    uint64
	Offset uint32
	Total  uint16
	V6     bool
	Addrs  []netip.Addr
}

// IsMemberMAD reports whether a UD payload to QP 1 is a membership MAD
// (its class and attribute), before it is parsed.
func IsMemberMAD(b []byte) bool {
	return len(b) >= madHeaderLen && b[1] == MemberMgmtClass && binary.BigEndian.Uint16(b[16:18]) == MemberAttrID
}

// PutMemberMAD writes m into b (at least MemberMADLen bytes), with at most
// MaxMemberAddrs(m.V6) of its addresses (those of the other family are
// skipped), and returns MemberMADLen.
func PutMemberMAD(b []byte, m *MemberMAD) int {
	b = b[:MemberMADLen]
	clear(b)
	b[0], b[1], b[2], b[3] = 1, MemberMgmtClass, 1, m.Method
	binary.BigEndian.PutUint64(b[8:16], m.TID)
	binary.BigEndian.PutUint16(b[16:18], MemberAttrID)
	binary.BigEndian.PutUint32(b[20:24], m.Offset)
	d := b[madHeaderLen:]
	alen := 4
	if m.V6 {
		alen = 16
	}
	d[0], d[1] = memberVersion, byte(alen)
	binary.BigEndian.PutUint16(d[2:4], m.Total)
	n, max := 0, MaxMemberAddrs(m.V6)
	at := memberDataHead
	for _, a := range m.Addrs {
		if n == max {
			break
		}
		if a.Is4() == m.V6 {
			continue
		}
		if m.V6 {
			v := a.As16()
			copy(d[at:], v[:])
		} else {
			v := a.As4()
			copy(d[at:], v[:])
		}
		at += alen
		n++
	}
	d[4] = byte(n)
	return MemberMADLen
}

// ParseMemberMAD decodes a membership MAD. Anything but exactly what
// PutMemberMAD writes (the length, versions, class, method, attribute,
// address length and count) is DropGarbage or DropTruncated.
func ParseMemberMAD(b []byte, m *MemberMAD) error {
	if len(b) < MemberMADLen {
		return DropTruncated
	}
	if b[0] != 1 || b[1] != MemberMgmtClass || b[2] != 1 || (b[3] != MemberGet && b[3] != MemberGetResp) ||
		binary.BigEndian.Uint16(b[16:18]) != MemberAttrID || binary.BigEndian.Uint16(b[4:6]) != 0 {
		return DropGarbage
	}
	d := b[madHeaderLen:MemberMADLen]
	if d[0] != memberVersion || (d[1] != 4 && d[1] != 16) {
		return DropGarbage
	}
	v6 := d[1] == 16
	n := int(d[4])
	if n > MaxMemberAddrs(v6) || n > cap(m.Addrs) {
		return DropGarbage
	}
	m.Method = b[3]
	m.TID = binary.BigEndian.Uint64(b[8:16])
	m.Offset = binary.BigEndian.Uint32(b[20:24])
	m.Total = binary.BigEndian.Uint16(d[2:4])
	m.V6 = v6
	m.Addrs = m.Addrs[:0]
	at := memberDataHead
	for range n {
		var a netip.Addr
		if v6 {
			a = netip.AddrFrom16([16]byte(d[at : at+16]))
		} else {
			a = netip.AddrFrom4([4]byte(d[at : at+4]))
		}
		at += int(d[1])
		m.Addrs = append(m.Addrs, a)
	}
	return nil
}
