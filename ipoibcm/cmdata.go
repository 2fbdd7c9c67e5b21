package ipoibcm

import (
	"encoding/binary"
	"fmt"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// Service IDs (docs/wire.md §2): Linux/OFED's IETF base, which we
// connect to, and the RFC 4755 form illumos uses, which we also accept.
const (
	serviceIDIETF uint64 = 0x1000000000000000
	serviceIDRFC  uint64 = 0x0100000000000000
)

// cmPrivateData is struct ipoib_cm_data: {UD QPN, receive MTU}, big-endian.
func cmPrivateData(qpn hca.QPN) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint32(b[0:4], uint32(qpn&hca.QPNMask))
	binary.BigEndian.PutUint32(b[4:8], frame.CMBufSize)
	return b
}

// parseCMPrivateData reads {UD QPN, MTU}; the QPN's high byte is ignored
// on receive (RFC 4755 §6).
func parseCMPrivateData(b []byte) (hca.QPN, int, error) {
	if len(b) < 8 {
		return 0, 0, fmt.Errorf("CM private data of %d bytes: %w", len(b), hca.ErrInvalidArgument)
	}
	return hca.QPN(binary.BigEndian.Uint32(b[0:4])) & hca.QPNMask, int(binary.BigEndian.Uint32(b[4:8])), nil
}
