package netstack

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// ErrBadEchoReply is returned by Ping when the reply does not match the
// request.
var ErrBadEchoReply = errors.New("echo reply does not match request")

// pingSeq is the sequence number Ping sends; each call uses its own
// endpoint (and so its own identifier), so one value is enough.
const pingSeq = 1

// Ping sends one ICMP (IPv4) or ICMPv6 echo request of size payload bytes to
// dst through a datagram ping endpoint and waits for the matching reply or
// ctx. It returns the round-trip time.
func (h *Host) Ping(ctx context.Context, dst netip.Addr, size int) (time.Duration, error) {
	if size < 0 {
		return 0, fmt.Errorf("netstack ping %v: negative size %d", dst, size)
	}
	fa, netProto := toFullAddress(netip.AddrPortFrom(dst, 0))
	transProto, reqType, replyType := icmp.ProtocolNumber6, byte(header.ICMPv6EchoRequest), byte(header.ICMPv6EchoReply)
	if dst.Unmap().Is4() {
		transProto, reqType, replyType = icmp.ProtocolNumber4, byte(header.ICMPv4Echo), byte(header.ICMPv4EchoReply)
	}

	var wq waiter.Queue
	ep, terr := h.stack.NewEndpoint(transProto, netProto, &wq)
	if terr != nil {
		return 0, tcpipErr(fmt.Sprintf("netstack ping %v: new endpoint", dst), terr)
	}
	defer ep.Close()
	if terr := ep.Connect(fa); terr != nil {
		return 0, tcpipErr(fmt.Sprintf("netstack ping %v: connect", dst), terr)
	}

	// Echo header: type, code, checksum, identifier (the endpoint fills
	// it in), sequence; then a recognisable payload.
	req := make([]byte, 8+size)
	req[0] = reqType
	binary.BigEndian.PutUint16(req[6:8], pingSeq)
	for i := range req[8:] {
		req[8+i] = byte(i)
	}

	entry, notify := waiter.NewChannelEntry(waiter.ReadableEvents)
	wq.EventRegister(&entry)
	defer wq.EventUnregister(&entry)

	start := time.Now()
	var r bytes.Reader
	r.Reset(req)
	if _, terr := ep.Write(&r, tcpip.WriteOptions{}); terr != nil {
		return 0, tcpipErr(fmt.Sprintf("netstack ping %v: send", dst), terr)
	}
	var reply bytes.Buffer
	for {
		reply.Reset()
		_, terr := ep.Read(&reply, tcpip.ReadOptions{})
		if _, wouldBlock := terr.(*tcpip.ErrWouldBlock); wouldBlock {
			select {
			case <-notify:
				continue
			case <-ctx.Done():
				return 0, fmt.Errorf("netstack ping %v: %w", dst, ctx.Err())
			}
		}
		if terr != nil {
			return 0, tcpipErr(fmt.Sprintf("netstack ping %v: receive", dst), terr)
		}
		rtt := time.Since(start)
		if err := checkEchoReply(reply.Bytes(), req, replyType); err != nil {
			return 0, fmt.Errorf("netstack ping %v: %w", dst, err)
		}
		return rtt, nil
	}
}

// checkEchoReply verifies an echo reply against the request it answers.
// The identifier is not compared: the endpoint owns it.
func checkEchoReply(reply, req []byte, replyType byte) error {
	if len(reply) != len(req) {
		return fmt.Errorf("%w: %d bytes, sent %d", ErrBadEchoReply, len(reply), len(req))
	}
	if reply[0] != replyType || reply[1] != 0 {
		return fmt.Errorf("%w: type %d code %d", ErrBadEchoReply, reply[0], reply[1])
	}
	if !bytes.Equal(reply[6:8], req[6:8]) {
		return fmt.Errorf("%w: sequence %x", ErrBadEchoReply, reply[6:8])
	}
	if !bytes.Equal(reply[8:], req[8:]) {
		return fmt.Errorf("%w: payload differs", ErrBadEchoReply)
	}
	return nil
}
