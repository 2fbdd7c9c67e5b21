package frame

import (
	"bytes"
	"net/netip"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

var (
	testTapMAC  = MAC{0x52, 0x54, 0, 0, 0, 1}
	testPeerMAC = LocalMAC(4)
)

// ipv4Packet builds an IPv4 packet of total length size with protocol
// proto; payload starts with the given bytes and is then patterned.
func ipv4Packet(size int, flags uint8, fragOff uint16, proto uint8, src, dst string, payload ...byte) []byte {
	pkt := make([]byte, size)
	for i := header.IPv4MinimumSize; i < size; i++ {
		pkt[i] = byte(i * 7)
	}
	copy(pkt[header.IPv4MinimumSize:], payload)
	ip := header.IPv4(pkt)
	ip.Encode(&header.IPv4Fields{
		TotalLength:    uint16(size),
		ID:             0x1234,
		Flags:          flags,
		FragmentOffset: fragOff,
		TTL:            64,
		Protocol:       proto,
		SrcAddr:        tcpip.AddrFrom4(netip.MustParseAddr(src).As4()),
		DstAddr:        tcpip.AddrFrom4(netip.MustParseAddr(dst).As4()),
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	return pkt
}

func ipv6Packet(size int, next uint8, src, dst string, payload ...byte) []byte {
	pkt := make([]byte, size)
	for i := header.IPv6MinimumSize; i < size; i++ {
		pkt[i] = byte(i * 13)
	}
	copy(pkt[header.IPv6MinimumSize:], payload)
	header.IPv6(pkt).Encode(&header.IPv6Fields{
		PayloadLength:     uint16(size - header.IPv6MinimumSize),
		TransportProtocol: tcpip.TransportProtocolNumber(next),
		HopLimit:          64,
		SrcAddr:           tcpip.AddrFrom16(netip.MustParseAddr(src).As16()),
		DstAddr:           tcpip.AddrFrom16(netip.MustParseAddr(dst).As16()),
	})
	return pkt
}

// checkFragNeeded parses a BuildTooBig IPv4 frame with gVisor and returns
// the quoted bytes.
func checkFragNeeded(t testing.TB, frame []byte, offending []byte, mtu int) []byte {
	t.Helper()
	eth, err := ParseEthernet(frame)
	if err != nil || eth.Dst != testTapMAC || eth.Src != testPeerMAC || eth.EtherType != EtherTypeIPv4 {
		t.Fatalf("ethernet %+v, %v", eth, err)
	}
	ip := header.IPv4(frame[EthHdrLen:])
	if !ip.IsValid(len(ip)) || !ip.IsChecksumValid() || int(ip.TotalLength()) != len(ip) {
		t.Fatalf("bad IPv4 header % x", frame[EthHdrLen:EthHdrLen+20])
	}
	orig := header.IPv4(offending)
	if ip.SourceAddress() != orig.DestinationAddress() || ip.DestinationAddress() != orig.SourceAddress() ||
		ip.Protocol() != uint8(header.ICMPv4ProtocolNumber) {
		t.Fatalf("addresses %v -> %v proto %d", ip.SourceAddress(), ip.DestinationAddress(), ip.Protocol())
	}
	if len(ip) > icmpv4MaxErrorLen {
		t.Fatalf("ICMP error of %d bytes exceeds 576", len(ip))
	}
	icmp := header.ICMPv4(ip.Payload())
	if icmp.Type() != header.ICMPv4DstUnreachable || icmp.Code() != header.ICMPv4FragmentationNeeded ||
		int(icmp.MTU()) != mtu {
		t.Fatalf("ICMP type %d code %d mtu %d", icmp.Type(), icmp.Code(), icmp.MTU())
	}
	if checksum.Checksum(icmp, 0) != 0xffff {
		t.Fatal("ICMP checksum invalid")
	}
	if icmp.Checksum() != header.ICMPv4Checksum(icmp[:8], checksum.Checksum(icmp[8:], 0)) {
		t.Fatal("ICMP checksum differs from gVisor's")
	}
	quoted := icmp[8:]
	if avail := min(int(orig.TotalLength()), len(offending)); len(quoted) < min(int(orig.HeaderLength())+8, avail) {
		t.Fatalf("quoted only %d bytes", len(quoted))
	}
	if !bytes.Equal(quoted, offending[:len(quoted)]) {
		t.Fatal("quoted bytes differ from the offending packet")
	}
	return quoted
}

func checkPacketTooBig(t testing.TB, frame []byte, offending []byte, mtu int) []byte {
	t.Helper()
	eth, err := ParseEthernet(frame)
	if err != nil || eth.Dst != testTapMAC || eth.Src != testPeerMAC || eth.EtherType != EtherTypeIPv6 {
		t.Fatalf("ethernet %+v, %v", eth, err)
	}
	ip := header.IPv6(frame[EthHdrLen:])
	if !ip.IsValid(len(ip)) || int(ip.PayloadLength())+header.IPv6MinimumSize != len(ip) ||
		ip.NextHeader() != uint8(header.ICMPv6ProtocolNumber) || len(ip) > icmpv6MaxErrorLen {
		t.Fatalf("bad IPv6 header % x", frame[EthHdrLen:EthHdrLen+40])
	}
	orig := header.IPv6(offending)
	if ip.SourceAddress() != orig.DestinationAddress() || ip.DestinationAddress() != orig.SourceAddress() {
		t.Fatalf("addresses %v -> %v", ip.SourceAddress(), ip.DestinationAddress())
	}
	icmp := header.ICMPv6(ip.Payload())
	if icmp.Type() != header.ICMPv6PacketTooBig || icmp.Code() != 0 || int(icmp.MTU()) != mtu {
		t.Fatalf("ICMPv6 type %d code %d mtu %d", icmp.Type(), icmp.Code(), icmp.MTU())
	}
	if !gvisorChecksumValid(frame[EthHdrLen:]) {
		t.Fatal("ICMPv6 checksum invalid")
	}
	quoted := icmp[8:]
	if !bytes.Equal(quoted, offending[:len(quoted)]) {
		t.Fatal("quoted bytes differ from the offending packet")
	}
	return quoted
}

func TestBuildTooBigIPv4(t *testing.T) {
	off := ipv4Packet(3000, header.IPv4FlagDontFragment, 0, uint8(header.UDPProtocolNumber), "192.0.2.1", "192.0.2.2")
	buf := make([]byte, 2048)
	n := BuildTooBig(buf, testTapMAC, testPeerMAC, off, 2044)
	if n != EthHdrLen+576 {
		t.Fatalf("frame length %d, want %d", n, EthHdrLen+576)
	}
	if q := checkFragNeeded(t, buf[:n], off, 2044); len(q) != 548 {
		t.Fatalf("quoted %d bytes, want 548", len(q))
	}

	// A short packet is quoted whole, and Ethernet padding after its
	// total length (odd, to exercise the checksum's last byte) is not.
	small := append(ipv4Packet(101, header.IPv4FlagDontFragment, 0, uint8(header.TCPProtocolNumber), "10.0.0.1", "10.0.0.2"), 0, 0, 0)
	n = BuildTooBig(buf, testTapMAC, testPeerMAC, small, 1000)
	if q := checkFragNeeded(t, buf[:n], small, 1000); len(q) != 101 {
		t.Fatalf("quoted %d bytes, want 101", len(q))
	}

	// An ICMP echo request is not an error: it gets an answer.
	echo := ipv4Packet(3000, header.IPv4FlagDontFragment, 0, 1, "192.0.2.1", "192.0.2.2", 8, 0)
	if n := BuildTooBig(buf, testTapMAC, testPeerMAC, echo, 2044); n == 0 {
		t.Fatal("no error for an ICMP echo request")
	}

	// dst just big enough for header + 8 quoted bytes.
	tight := make([]byte, EthHdrLen+20+8+28)
	if n := BuildTooBig(tight, testTapMAC, testPeerMAC, off, 2044); n != len(tight) {
		t.Fatalf("tight buffer: n = %d", n)
	} else {
		checkFragNeeded(t, tight, off, 2044)
	}
	if n := BuildTooBig(tight[:len(tight)-1], testTapMAC, testPeerMAC, off, 2044); n != 0 {
		t.Fatalf("buffer below header+8: n = %d", n)
	}
}

func TestBuildTooBigIPv4Refusals(t *testing.T) {
	df, udp := uint8(header.IPv4FlagDontFragment), uint8(header.UDPProtocolNumber)
	buf := make([]byte, 2048)
	for _, c := range []struct {
		name string
		pkt  []byte
		mtu  int
	}{
		{"no DF", ipv4Packet(3000, 0, 0, udp, "192.0.2.1", "192.0.2.2"), 2044},
		{"non-initial fragment", ipv4Packet(3000, df, 1480, udp, "192.0.2.1", "192.0.2.2"), 2044},
		{"ICMP dest unreachable", ipv4Packet(3000, df, 0, 1, "192.0.2.1", "192.0.2.2", 3, 1), 2044},
		{"ICMP time exceeded", ipv4Packet(3000, df, 0, 1, "192.0.2.1", "192.0.2.2", 11, 0), 2044},
		{"multicast destination", ipv4Packet(3000, df, 0, udp, "192.0.2.1", "239.1.2.3"), 2044},
		{"limited broadcast", ipv4Packet(3000, df, 0, udp, "192.0.2.1", "255.255.255.255"), 2044},
		{"unspecified source", ipv4Packet(3000, df, 0, udp, "0.0.0.0", "192.0.2.2"), 2044},
		{"unspecified destination", ipv4Packet(3000, df, 0, udp, "192.0.2.1", "0.0.0.0"), 2044},
		{"total length below header", func() []byte {
			p := ipv4Packet(3000, df, 0, udp, "192.0.2.1", "192.0.2.2")
			p[2], p[3] = 0, 19
			return p
		}(), 2044},
		{"loopback source", ipv4Packet(3000, df, 0, udp, "127.0.0.1", "192.0.2.2"), 2044},
		{"class E source", ipv4Packet(3000, df, 0, udp, "240.0.0.1", "192.0.2.2"), 2044},
		{"mtu 0", ipv4Packet(3000, df, 0, udp, "192.0.2.1", "192.0.2.2"), 0},
		{"mtu above 16 bits", ipv4Packet(3000, df, 0, udp, "192.0.2.1", "192.0.2.2"), 70000},
		{"truncated header", ipv4Packet(3000, df, 0, udp, "192.0.2.1", "192.0.2.2")[:19], 2044},
		{"empty", nil, 2044},
		{"version 5", []byte{0x55, 0, 0, 20}, 2044},
	} {
		if n := BuildTooBig(buf, testTapMAC, testPeerMAC, c.pkt, c.mtu); n != 0 {
			t.Errorf("%s: BuildTooBig = %d, want 0", c.name, n)
		}
	}
}

func TestBuildTooBigIPv6(t *testing.T) {
	off := ipv6Packet(3000, uint8(header.UDPProtocolNumber), "2001:db8::1", "2001:db8::2")
	buf := make([]byte, 2048)
	n := BuildTooBig(buf, testTapMAC, testPeerMAC, off, 2044)
	if n != EthHdrLen+1280 {
		t.Fatalf("frame length %d, want %d", n, EthHdrLen+1280)
	}
	if q := checkPacketTooBig(t, buf[:n], off, 2044); len(q) != 1232 {
		t.Fatalf("quoted %d bytes, want 1232", len(q))
	}

	echo := ipv6Packet(3000, 58, "2001:db8::1", "2001:db8::2", 128, 0)
	if n := BuildTooBig(buf, testTapMAC, testPeerMAC, echo, 2044); n == 0 {
		t.Fatal("no error for an ICMPv6 echo request")
	} else {
		checkPacketTooBig(t, buf[:n], echo, 2044)
	}

	// An authentication header (length in 4-byte units) before UDP.
	withAH := ipv6Packet(3000, 51, "2001:db8::1", "2001:db8::2", 17, 4)
	if n := BuildTooBig(buf, testTapMAC, testPeerMAC, withAH, 2044); n == 0 {
		t.Fatal("no error behind an authentication header")
	}
	// A later fragment of anything: its upper-layer type is unknowable and
	// RFC 4443 allows the error.
	laterFrag := ipv6Packet(48, 44, "2001:db8::1", "2001:db8::2", 58, 0, 0x05, 0x00, 0, 0, 0, 7)
	if n := BuildTooBig(buf, testTapMAC, testPeerMAC, laterFrag, 1280); n == 0 {
		t.Fatal("no error for a later fragment")
	} else {
		checkPacketTooBig(t, buf[:n], laterFrag, 1280)
	}

	// A destination-options header before UDP is walked, not refused.
	withOpts := ipv6Packet(3000, 60, "2001:db8::1", "2001:db8::2", 17, 0, 1, 4, 0, 0, 0, 0)
	if n := BuildTooBig(buf, testTapMAC, testPeerMAC, withOpts, 4092); n == 0 {
		t.Fatal("no error behind a destination-options header")
	} else {
		checkPacketTooBig(t, buf[:n], withOpts, 4092)
	}
}

func TestBuildTooBigIPv6Refusals(t *testing.T) {
	udp := uint8(header.UDPProtocolNumber)
	// A fragment header (first fragment, M set) in front of an ICMPv6
	// destination-unreachable message.
	fragICMPErr := ipv6Packet(3000, 44, "2001:db8::1", "2001:db8::2", 58, 0, 0, 1, 0, 0, 0, 7, 1, 0)
	buf := make([]byte, 2048)
	for _, c := range []struct {
		name string
		pkt  []byte
	}{
		{"ICMPv6 dest unreachable", ipv6Packet(3000, 58, "2001:db8::1", "2001:db8::2", 1, 0)},
		{"ICMPv6 packet too big", ipv6Packet(3000, 58, "2001:db8::1", "2001:db8::2", 2, 0)},
		{"ICMPv6 error behind a fragment header", fragICMPErr},
		{"ICMPv6 with no room for its type", ipv6Packet(40, 58, "2001:db8::1", "2001:db8::2")},
		{"multicast source", ipv6Packet(3000, udp, "ff02::1", "2001:db8::2")},
		{"unspecified source", ipv6Packet(3000, udp, "::", "2001:db8::2")},
		{"multicast destination", ipv6Packet(3000, udp, "2001:db8::1", "ff02::1")},
		{"truncated", ipv6Packet(3000, udp, "2001:db8::1", "2001:db8::2")[:39]},
	} {
		if n := BuildTooBig(buf, testTapMAC, testPeerMAC, c.pkt, 2044); n != 0 {
			t.Errorf("%s: BuildTooBig = %d, want 0", c.name, n)
		}
	}
	if n := BuildTooBig(buf, testTapMAC, testPeerMAC, ipv6Packet(3000, udp, "2001:db8::1", "2001:db8::2"), 0); n != 0 {
		t.Errorf("mtu 0: BuildTooBig = %d, want 0", n)
	}
}

func FuzzBuildTooBig(f *testing.F) {
	df, udp := uint8(header.IPv4FlagDontFragment), uint8(header.UDPProtocolNumber)
	f.Add(ipv4Packet(700, df, 0, udp, "192.0.2.1", "192.0.2.2"), uint32(576), uint16(2044))
	f.Add(ipv4Packet(60, df, 0, 1, "192.0.2.1", "192.0.2.2", 8), uint32(90), uint16(68))
	f.Add(ipv6Packet(1400, udp, "2001:db8::1", "2001:db8::2"), uint32(1400), uint16(1280))
	f.Add(ipv6Packet(200, 44, "2001:db8::1", "2001:db8::2", 58, 0, 0, 1, 0, 0, 0, 7, 128), uint32(300), uint16(1280))
	f.Fuzz(func(t *testing.T, pkt []byte, dstLen uint32, mtu uint16) {
		buf := make([]byte, dstLen%4096)
		n := BuildTooBig(buf, testTapMAC, testPeerMAC, pkt, int(mtu))
		if n == 0 {
			return
		}
		if n > len(buf) {
			t.Fatalf("n = %d beyond dst of %d", n, len(buf))
		}
		switch pkt[0] >> 4 {
		case 4:
			checkFragNeeded(t, buf[:n], pkt, int(mtu))
		case 6:
			checkPacketTooBig(t, buf[:n], pkt, int(mtu))
		default:
			t.Fatalf("error built for IP version %d", pkt[0]>>4)
		}
	})
}
