package netstack

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// fragNeededFrame is an ICMP frag-needed from 10.0.0.2 to 10.0.0.1
// reporting mtu, quoting a TCP segment's headers.
func fragNeededFrame(dstMAC []byte, mtu uint16) []byte {
	quoted := tcpFrame(false, 1, header.TCPFlagAck, nil)[ethernetHeaderLen:][:header.IPv4MinimumSize+8]
	f := make([]byte, ethernetHeaderLen+header.IPv4MinimumSize+header.ICMPv4MinimumSize+len(quoted))
	copy(f[0:6], dstMAC)
	copy(f[6:12], "\x02\x00\x00\x00\x00\x02")
	binary.BigEndian.PutUint16(f[12:14], uint16(header.IPv4ProtocolNumber))
	ip := header.IPv4(f[ethernetHeaderLen:])
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(len(ip)), TTL: 64, Protocol: uint8(header.ICMPv4ProtocolNumber),
		SrcAddr: tcpip.AddrFrom4([4]byte{10, 0, 0, 2}), DstAddr: tcpip.AddrFrom4([4]byte{10, 0, 0, 1}),
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	icmp := header.ICMPv4(ip[header.IPv4MinimumSize:])
	icmp.SetType(header.ICMPv4DstUnreachable)
	icmp.SetCode(header.ICMPv4FragmentationNeeded)
	icmp.SetMTU(mtu)
	copy(icmp[header.ICMPv4MinimumSize:], quoted)
	icmp.SetChecksum(^checksum.Checksum(icmp, 0))
	return f
}

// packetTooBigFrame is an ICMPv6 packet-too-big reporting mtu.
func packetTooBigFrame(mtu uint32) []byte {
	f := make([]byte, ethernetHeaderLen+header.IPv6MinimumSize+header.ICMPv6PacketTooBigMinimumSize+40)
	binary.BigEndian.PutUint16(f[12:14], uint16(header.IPv6ProtocolNumber))
	ip := header.IPv6(f[ethernetHeaderLen:])
	ip.Encode(&header.IPv6Fields{
		PayloadLength: uint16(len(ip) - header.IPv6MinimumSize), TransportProtocol: header.ICMPv6ProtocolNumber, HopLimit: 255,
	})
	icmp := header.ICMPv6(ip[header.IPv6MinimumSize:])
	icmp.SetType(header.ICMPv6PacketTooBig)
	icmp.SetMTU(mtu)
	return f
}

func TestIsStalePMTU(t *testing.T) {
	mac := []byte("\x02\x00\x00\x00\x00\x01")
	echo := fragNeededFrame(mac, 1500)
	header.ICMPv4(echo[ethernetHeaderLen+header.IPv4MinimumSize:]).SetType(header.ICMPv4Echo)
	for name, tc := range map[string]struct {
		frame []byte
		want  bool
	}{
		"v4 equal to link":     {fragNeededFrame(mac, 4092), true},
		"v4 above link":        {fragNeededFrame(mac, 65520), true},
		"v4 below link":        {fragNeededFrame(mac, 2044), false},
		"v4 old style, no MTU": {fragNeededFrame(mac, 0), false},
		"v4 echo":              {echo, false},
		"v6 equal to link":     {packetTooBigFrame(4092), true},
		"v6 below link":        {packetTooBigFrame(1280), false},
		"tcp":                  {tcpFrame(false, 1, header.TCPFlagAck, nil), false},
		"truncated ICMP":       {fragNeededFrame(mac, 4092)[:ethernetHeaderLen+header.IPv4MinimumSize+4], false},
		"runt":                 {[]byte{1, 2, 3}, false},
	} {
		if got := isStalePMTU(tc.frame, 4092); got != tc.want {
			t.Errorf("%s: isStalePMTU = %v, want %v", name, got, tc.want)
		}
	}
}

// TestStalePMTUNotDelivered checks the host drops and counts a frag-needed
// at or above its link MTU and still takes one below it.
func TestStalePMTUNotDelivered(t *testing.T) {
	h := newTestHost(t, Config{MTU: 4092, Addrs: []netip.Prefix{addrA4}})
	mac := h.HostMAC()
	if _, err := h.WriteFrames([][]byte{fragNeededFrame(mac, 4092)}); err != nil {
		t.Fatal(err)
	}
	icmpIn := h.Stack().Stats().ICMP.V4.PacketsReceived.DstUnreachable
	if c := h.Counters(); c.RxDroppedStalePMTU != 1 || icmpIn.Value() != 0 {
		t.Fatalf("stale frag-needed: dropped %d, ICMP delivered %d", c.RxDroppedStalePMTU, icmpIn.Value())
	}
	if _, err := h.WriteFrames([][]byte{fragNeededFrame(mac, 2044)}); err != nil {
		t.Fatal(err)
	}
	if c := h.Counters(); c.RxDroppedStalePMTU != 1 || icmpIn.Value() != 1 {
		t.Fatalf("fresh frag-needed: dropped %d, ICMP delivered %d", c.RxDroppedStalePMTU, icmpIn.Value())
	}
}
