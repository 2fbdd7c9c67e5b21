package frame

import "encoding/binary"

// PutEncap writes the 4-byte IPoIB encapsulation header: EtherType and a
// zero reserved field (Wireshark's heuristic needs it zero). b must hold
// EncapLen bytes.
func PutEncap(b []byte, etherType uint16) {
	_ = b[3] // one bounds check for the four stores
	binary.BigEndian.PutUint16(b[0:2], etherType)
	b[2], b[3] = 0, 0
}

// ParseEncap returns the EtherType of an IPoIB payload. The reserved field
// is ignored on receive (RFC 4391).
func ParseEncap(b []byte) (etherType uint16, err error) {
	if len(b) < EncapLen {
		return 0, ErrTruncated
	}
	return binary.BigEndian.Uint16(b[0:2]), nil
}
