package netstack

import (
	"encoding/binary"
	"errors"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// Reasons a received frame is not delivered. They are returned unwrapped on
// the receive path so that dropping a frame does not allocate.
var (
	ErrRunt             = errors.New("frame shorter than an Ethernet header")
	ErrOtherHost        = errors.New("frame for another host's MAC")
	ErrUnknownEtherType = errors.New("ethertype is not IPv4, IPv6 or ARP")
)

// ethernetHeader is the part of a frame's header the address filter needs.
type ethernetHeader struct {
	dst, src [6]byte
	proto    tcpip.NetworkProtocolNumber
}

// parseEthernet reads the Ethernet header at the front of frame.
func parseEthernet(frame []byte) (ethernetHeader, error) {
	if len(frame) < ethernetHeaderLen {
		return ethernetHeader{}, ErrRunt
	}
	var h ethernetHeader
	copy(h.dst[:], frame[0:6])
	copy(h.src[:], frame[6:12])
	h.proto = tcpip.NetworkProtocolNumber(binary.BigEndian.Uint16(frame[12:14]))
	return h, nil
}

func (h *ethernetHeader) broadcast() bool {
	return h.dst == [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
}

// multicast is true for group addresses, broadcast included.
func (h *ethernetHeader) multicast() bool { return h.dst[0]&0x01 != 0 }
