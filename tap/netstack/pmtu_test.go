package netstack

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// pathClamp stands in for the engine on a path whose MTU is below the
// host's: it swallows IPv4 frames longer than pathMTU+14 from its host and
// answers each with ICMP fragmentation-needed, as the Interface does.
type pathClamp struct {
	*observedPort
	pathMTU int
	peerMAC net.HardwareAddr
	peerIP  netip.Addr
	icmps   int
}

func (p *pathClamp) ReadFramesContext(ctx context.Context, bufs [][]byte, sizes []int) (int, error) {
	for {
		n, err := p.observedPort.ReadFramesContext(ctx, bufs, sizes)
		if err != nil {
			return 0, err
		}
		kept := 0
		for i := range n {
			f := bufs[i][:sizes[i]]
			if len(f) > p.pathMTU+ethernetHeaderLen && f[12] == 0x08 && f[13] == 0x00 {
				p.icmps++
				if _, err := p.Host.WriteFrames([][]byte{p.fragNeeded(f)}); err != nil {
					return 0, err
				}
				continue
			}
			bufs[kept], bufs[i] = bufs[i], bufs[kept]
			sizes[kept] = sizes[i]
			kept++
		}
		if kept > 0 {
			return kept, nil
		}
	}
}

// fragNeeded builds the Ethernet frame carrying ICMP type 3 code 4 for the
// IPv4 packet in tooBig, quoting its header and 8 bytes as RFC 792 asks.
func (p *pathClamp) fragNeeded(tooBig []byte) []byte {
	quoted := tooBig[ethernetHeaderLen : ethernetHeaderLen+header.IPv4MinimumSize+8]
	orig := header.IPv4(quoted)
	f := make([]byte, ethernetHeaderLen+header.IPv4MinimumSize+header.ICMPv4MinimumSize+len(quoted))
	copy(f[0:6], tooBig[6:12])
	copy(f[6:12], p.peerMAC)
	f[12], f[13] = 0x08, 0x00
	ip := header.IPv4(f[ethernetHeaderLen:])
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(len(f) - ethernetHeaderLen),
		TTL:         64,
		Protocol:    uint8(header.ICMPv4ProtocolNumber),
		SrcAddr:     tcpip.AddrFromSlice(p.peerIP.AsSlice()),
		DstAddr:     orig.SourceAddress(),
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	icmp := header.ICMPv4(ip[header.IPv4MinimumSize:])
	icmp.SetType(header.ICMPv4DstUnreachable)
	icmp.SetCode(header.ICMPv4FragmentationNeeded)
	icmp.SetMTU(uint16(p.pathMTU))
	copy(icmp[header.ICMPv4MinimumSize:], quoted)
	icmp.SetChecksum(^checksum.Checksum(icmp, 0))
	return f
}

// TestPathMTUFromICMP checks the host honours the engine's PMTU answer: a
// connection opened at MTU 9000 over a 1500-byte path shrinks its segments
// after ICMP frag-needed and delivers every byte. With GSO on, gVisor does
// not fragment, so only the ICMP can save the connection.
func TestPathMTUFromICMP(t *testing.T) {
	for _, gso := range []bool{false, true} {
		// Recovering the swallowed segments takes retransmission timeouts;
		// a 5 ms floor keeps the test fast.
		tcpOpts := TCPOptions{MinRTO: 5 * time.Millisecond}
		a, err := New(Config{MTU: 9000, GSO: gso, TCP: tcpOpts, Addrs: []netip.Prefix{addrA4}})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		b, err := New(Config{MTU: 9000, GSO: gso, TCP: tcpOpts, Addrs: []netip.Prefix{addrB4}})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		clamp := &pathClamp{observedPort: &observedPort{Host: a}, pathMTU: 1500, peerMAC: b.HostMAC(), peerIP: addrB4.Addr()}
		pb := &observedPort{Host: b}
		stop := Link(clamp, pb)
		transfer(t, a, b, netip.AddrPortFrom(addrB4.Addr(), 5001), 4<<20)
		stop()
		if clamp.icmps == 0 {
			t.Fatalf("gso=%v: no segment exceeded the path; the test proves nothing", gso)
		}
		if got := b.Counters().RxPackets; got == 0 {
			t.Fatalf("gso=%v: B received nothing", gso)
		}
		t.Logf("gso=%v: %d ICMP frag-needed sent, A timeouts %d", gso, clamp.icmps, a.Stack().Stats().TCP.Timeouts.Value())
	}
}
