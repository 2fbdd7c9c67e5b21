package hca

import (
	"fmt"

	"github.com/ipoibcm/ipoib/offload"
)

// Offloads are the stateless offloads a device performs on IPoIB
// messages: what Linux reads from a ConnectX as IB_DEVICE_UD_TSO and
// IB_DEVICE_UD_IP_CSUM (drivers/infiniband/ulp/ipoib/ipoib_main.c sets
// NETIF_F_TSO and NETIF_F_IP_CSUM from them).
//
// The device finds the IP header OffloadL3Offset bytes into the message,
// behind the IPoIB encapsulation header, as a ConnectX parses IPoIB
// datagrams; a message that does not parse as IPv4/IPv6 with TCP or UDP
// gets no checksum work and no WCIPCsumOK.
type Offloads struct {
	// IPCsum: sends flagged SendIPCsum get their IPv4 header and TCP/UDP
	// checksums filled, and UD receives the device verified complete with
	// WCIPCsumOK (IB_DEVICE_UD_IP_CSUM). Whether RC receives are verified
	// is the backend's choice; it never flags what it did not verify.
	IPCsum bool
	// UDLSOMaxSize is the largest UD LSO message (SendWR.MSS set), headers
	// included; 0 means the device has no LSO.
	UDLSOMaxSize int
}

// ConnectXOffloads is what a backend that models a ConnectX reports:
// checksum offload, and LSO of a 64 KiB IP packet behind the IPoIB header.
func ConnectXOffloads() Offloads {
	return Offloads{IPCsum: true, UDLSOMaxSize: 65536 + OffloadL3Offset}
}

// OffloadL3Offset is where the offloads expect the IP header: behind the
// 4-byte IPoIB encapsulation header (RFC 4391 section 6).
const OffloadL3Offset = 4

// SendFlags modify a send work request.
type SendFlags uint8

const (
	// SendIPCsum asks the device to compute the IPv4 header checksum and
	// the TCP/UDP checksum of the message (IB_SEND_IP_CSUM). What the
	// checksum fields held is ignored. The device may write the checksums
	// into the send buffer itself.
	SendIPCsum SendFlags = 1 << iota
)

// WCFlags describe a receive completion.
type WCFlags uint8

const (
	// WCIPCsumOK: the device verified the IPv4 header checksum (if IPv4)
	// and the TCP/UDP checksum of the received message (IB_WC_IP_CSUM_OK);
	// the consumer may mark it CHECKSUM_UNNECESSARY.
	WCIPCsumOK WCFlags = 1 << iota
	// WCCsumPartial: the sender asked for checksum offload and the
	// message never crossed a wire that needed one (the in-process
	// fabric passes it on as veth passes CHECKSUM_PARTIAL): the bytes are
	// intact but the TCP/UDP checksum field holds whatever the sender left
	// there. The consumer may hand the message on as partial, or fill the
	// checksum before it goes anywhere that checks.
	WCCsumPartial
)

func (f WCFlags) String() string {
	switch f {
	case 0:
		return "none"
	case WCIPCsumOK:
		return "ip-csum-ok"
	case WCCsumPartial:
		return "csum-partial"
	case WCIPCsumOK | WCCsumPartial:
		return "ip-csum-ok|csum-partial"
	}
	return fmt.Sprintf("WCFlags(%#x)", uint8(f))
}

// ErrLSOTooLarge: an LSO send is larger than Offloads.UDLSOMaxSize. It
// wraps ErrInvalidArgument.
var ErrLSOTooLarge = fmt.Errorf("LSO message larger than the device maximum: %w", ErrInvalidArgument)

// MaxLSOSegments bounds how many packets one LSO send may become, so a
// tiny MSS cannot turn one work request into tens of thousands of
// packets.
const MaxLSOSegments = 1024

// PrepareLSO checks an LSO send (wr.MSS > 0) against the device's
// offloads and its path MTU, as a ConnectX checks an IB_WR_LSO work
// request, and returns the parsed headers of wr.Data (offsets into it).
// Each segment is the headers plus at most wr.MSS bytes, so the MSS must
// leave room for the headers inside the MTU.
func (o Offloads) PrepareLSO(wr *SendWR, mtu MTU) (offload.Headers, error) {
	if o.UDLSOMaxSize == 0 {
		return offload.Headers{}, fmt.Errorf("LSO send: device has no LSO: %w", ErrNotSupported)
	}
	if len(wr.Data) > o.UDLSOMaxSize {
		return offload.Headers{}, fmt.Errorf("LSO send of %d bytes, device maximum %d: %w", len(wr.Data), o.UDLSOMaxSize, ErrLSOTooLarge)
	}
	h, err := offload.Parse(wr.Data, OffloadL3Offset)
	if err != nil {
		return h, fmt.Errorf("LSO send: headers: %v: %w", err, ErrInvalidArgument)
	}
	if h.End+wr.MSS > int(mtu) {
		return h, fmt.Errorf("LSO send: MSS %d + %d header bytes exceed the %d-byte MTU: %w", wr.MSS, h.End, mtu, ErrInvalidArgument)
	}
	if n := h.Segments(wr.MSS); n > MaxLSOSegments {
		return h, fmt.Errorf("LSO send: %d segments of MSS %d, at most %d: %w", n, wr.MSS, MaxLSOSegments, ErrInvalidArgument)
	}
	return h, nil
}
