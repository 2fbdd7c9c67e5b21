package frame

import "encoding/binary"

// EtherTypes that mark a tagged frame (802.1Q, 802.1ad and the pre-standard
// QinQ value).
const (
	etherTypeVLAN    = 0x8100
	etherTypeQinQ    = 0x88A8
	etherTypeQinQOld = 0x9100
	// etherTypeMin is the smallest EtherType; below it the field is an
	// 802.3 length.
	etherTypeMin = 0x0600
)

// MAC is an Ethernet address.
type MAC [6]byte

// IsMulticast reports whether the I/G bit is set (broadcast included).
func (m MAC) IsMulticast() bool { return m[0]&0x01 != 0 }

// IsBroadcast reports whether m is ff:ff:ff:ff:ff:ff.
func (m MAC) IsBroadcast() bool { return m == MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff} }

// String formats m as aa:bb:cc:dd:ee:ff.
func (m MAC) String() string {
	const digits = "0123456789abcdef"
	var buf [17]byte
	for i, b := range m {
		if i > 0 {
			buf[3*i-1] = ':'
		}
		buf[3*i], buf[3*i+1] = digits[b>>4], digits[b&0x0f]
	}
	return string(buf[:])
}

// The first two bytes of every MAC the Interface hands to the host for an
// IPoIB neighbour: 0x02 is locally administered unicast, 0x1b echoes the
// IPoIB Q_Key so the addresses stand out in host tools.
const (
	localMACByte0 = 0x02
	localMACByte1 = 0x1b
)

// LocalMAC is the MAC that stands for the neighbour in slot index of the
// engine's table: 02:1b followed by index big-endian. Distinct indices give
// distinct MACs, so the mapping never collides.
func LocalMAC(index uint32) MAC {
	m := MAC{localMACByte0, localMACByte1}
	binary.BigEndian.PutUint32(m[2:], index)
	return m
}

// LocalMACIndex inverts LocalMAC; ok is false for any other MAC.
func LocalMACIndex(m MAC) (index uint32, ok bool) {
	if m[0] != localMACByte0 || m[1] != localMACByte1 {
		return 0, false
	}
	return binary.BigEndian.Uint32(m[2:]), true
}

// EthHeader is an untagged Ethernet II header.
type EthHeader struct {
	Dst, Src  MAC
	EtherType uint16
}

// ParseEthernet reads the header of a frame from the host. Tagged frames
// return ErrVLAN and 802.3 length frames ErrNotEthernetII, so the engine can
// count them; the payload starts at EthHdrLen.
func ParseEthernet(b []byte) (EthHeader, error) {
	if len(b) < EthHdrLen {
		return EthHeader{}, ErrTruncated
	}
	h := EthHeader{
		Dst:       MAC(b[0:6]),
		Src:       MAC(b[6:12]),
		EtherType: binary.BigEndian.Uint16(b[12:14]),
	}
	switch {
	case h.EtherType == etherTypeVLAN, h.EtherType == etherTypeQinQ, h.EtherType == etherTypeQinQOld:
		return h, ErrVLAN
	case h.EtherType < etherTypeMin:
		return h, ErrNotEthernetII
	}
	return h, nil
}

// PutEthernet writes h into the first EthHdrLen bytes of b.
func PutEthernet(b []byte, h EthHeader) {
	_ = b[EthHdrLen-1]
	copy(b[0:6], h.Dst[:])
	copy(b[6:12], h.Src[:])
	binary.BigEndian.PutUint16(b[12:14], h.EtherType)
}
