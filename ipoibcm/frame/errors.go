package frame

import "errors"

// Errors returned by the parsers and rewriters. They are sentinels so that a
// rejected packet costs no allocation; the engine counts each as a drop
// reason.
var (
	// ErrTruncated: the buffer is shorter than the header or the length
	// fields inside it claim.
	ErrTruncated = errors.New("frame: truncated")
	// ErrVLAN: an 802.1Q/802.1ad tagged Ethernet frame; IPoIB carries no
	// VLAN tags.
	ErrVLAN = errors.New("frame: VLAN-tagged ethernet frame")
	// ErrNotEthernetII: the type field is an 802.3 length (LLC frames such
	// as STP), not an EtherType.
	ErrNotEthernetII = errors.New("frame: 802.3 length field, not an EtherType")
	// ErrARPFormat: an ARP body whose hardware type, protocol type or
	// address lengths do not match the flavour being parsed.
	ErrARPFormat = errors.New("frame: unexpected ARP hardware/protocol format")
	// ErrARPOp: an ARP opcode other than request or reply.
	ErrARPOp = errors.New("frame: unsupported ARP opcode")
	// ErrNotND: the packet is not IPv6 neighbour discovery (wrong version,
	// next header, hop limit or ICMPv6 type).
	ErrNotND = errors.New("frame: not an IPv6 neighbour discovery packet")
	// ErrNDOption: a malformed ND option (zero length, overrunning the
	// message, or a link-layer option of the wrong size for its link).
	ErrNDOption = errors.New("frame: malformed ND option")
	// ErrChecksum: the ICMPv6 checksum of the input does not verify.
	ErrChecksum = errors.New("frame: bad checksum")
	// ErrNoSpace: the destination buffer is too small for the result.
	ErrNoSpace = errors.New("frame: destination buffer too small")
	// ErrUnmappedHW: an IPoIB link-layer address in an ND option has no
	// Ethernet MAC (the engine's neighbour table refused it).
	ErrUnmappedHW = errors.New("frame: IPoIB hardware address has no MAC")
)
