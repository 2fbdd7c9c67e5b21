package netstack

import (
	"context"
	"net/netip"
	"sync/atomic"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// checksumPort counts the IPv4 TCP segments with payload its host sends,
// and how many of them carry a valid TCP checksum.
type checksumPort struct {
	*Host
	segments, valid atomic.Int64
}

func (c *checksumPort) ReadFramesContext(ctx context.Context, bufs [][]byte, sizes []int) (int, error) {
	n, err := c.Host.ReadFramesContext(ctx, bufs, sizes)
	for k := range n {
		f := bufs[k][:sizes[k]]
		if len(f) < ethernetHeaderLen+header.IPv4MinimumSize || f[12] != 0x08 || f[13] != 0x00 {
			continue
		}
		ip := header.IPv4(f[ethernetHeaderLen:])
		if !ip.IsValid(len(ip)) || ip.TransportProtocol() != header.TCPProtocolNumber {
			continue
		}
		tcp := header.TCP(ip.Payload())
		if len(tcp) < header.TCPMinimumSize || int(tcp.DataOffset()) > len(tcp) {
			continue
		}
		payload := tcp[tcp.DataOffset():]
		if len(payload) == 0 {
			continue
		}
		c.segments.Add(1)
		if tcp.IsChecksumValid(ip.SourceAddress(), ip.DestinationAddress(), checksum.Checksum(payload, 0), uint16(len(payload))) {
			c.valid.Add(1)
		}
	}
	return n, err
}

// TestSkipTXChecksums: with SkipTXChecksums data segments leave without a
// computed TCP checksum and a trusting peer still receives every byte;
// without it every segment's checksum is valid.
func TestSkipTXChecksums(t *testing.T) {
	for _, skip := range []bool{false, true} {
		cfg := Config{MTU: 9000, TrustRXChecksums: true, SkipTXChecksums: skip}
		ca, cb := cfg, cfg
		ca.Addrs, cb.Addrs = []netip.Prefix{addrA4}, []netip.Prefix{addrB4}
		a, err := New(ca)
		if err != nil {
			t.Fatal(err)
		}
		b, err := New(cb)
		if err != nil {
			t.Fatal(err)
		}
		pa := &checksumPort{Host: a}
		stop := Link(pa, b)
		transfer(t, a, b, netip.AddrPortFrom(addrB4.Addr(), 5003), 4<<20)
		stop()
		a.Close()
		b.Close()
		segs, valid := pa.segments.Load(), pa.valid.Load()
		if segs < (4<<20)/9000 {
			t.Fatalf("skip=%t: saw %d data segments", skip, segs)
		}
		if !skip && valid != segs {
			t.Fatalf("checksums computed: %d of %d valid", valid, segs)
		}
		// A segment whose checksum happens to come out valid is possible
		// in principle; most must not.
		if skip && valid > segs/100 {
			t.Fatalf("SkipTXChecksums: %d of %d segments still carry a valid checksum", valid, segs)
		}
	}
}
