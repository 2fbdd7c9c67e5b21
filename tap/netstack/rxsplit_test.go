package netstack

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

var (
	splitDst = net.HardwareAddr{0x02, 0, 0, 0, 0, 1}
	splitSrc = net.HardwareAddr{0x02, 0, 0, 0, 0, 2}
)

// ipv4Frame is an Ethernet frame holding an IPv4 packet with an IHL of
// ihlWords, protocol proto, flags/fragment field frag, and l4 after it.
func ipv4Frame(ihlWords int, proto uint8, frag uint16, l4 []byte) []byte {
	ip := make([]byte, ihlWords*4+len(l4))
	ip[0] = 0x40 | byte(ihlWords)
	binary.BigEndian.PutUint16(ip[2:4], uint16(len(ip)))
	binary.BigEndian.PutUint16(ip[6:8], frag)
	ip[8], ip[9] = 64, proto
	copy(ip[ihlWords*4:], l4)
	return frame(splitDst, splitSrc, 0x0800, ip)
}

func ipv6Frame(next uint8, l4 []byte) []byte {
	ip := make([]byte, 40+len(l4))
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:6], uint16(len(l4)))
	ip[6], ip[7] = next, 64
	copy(ip[40:], l4)
	return frame(splitDst, splitSrc, 0x86dd, ip)
}

// tcpSegment is a TCP header with dataOffWords words, then payload bytes.
func tcpSegment(dataOffWords, payload int) []byte {
	s := make([]byte, dataOffWords*4+payload)
	s[12] = byte(dataOffWords) << 4
	return s
}

func TestHeadersLen(t *testing.T) {
	const tcp, udp, icmp = 6, 17, 1
	for _, c := range []struct {
		name  string
		frame []byte
		proto uint16
		want  int
	}{
		{"ipv4 tcp", ipv4Frame(5, tcp, 0x4000, tcpSegment(5, 1000)), 0x0800, 14 + 20 + 20},
		{"ipv4 options tcp options", ipv4Frame(7, tcp, 0, tcpSegment(8, 1000)), 0x0800, 14 + 28 + 32},
		{"ipv4 udp", ipv4Frame(5, udp, 0, make([]byte, 1000)), 0x0800, 14 + 20 + 8},
		{"ipv4 icmp", ipv4Frame(5, icmp, 0, make([]byte, 1000)), 0x0800, 0},
		{"ipv4 first fragment", ipv4Frame(5, tcp, 0x2000, tcpSegment(5, 1000)), 0x0800, 0},
		{"ipv4 later fragment", ipv4Frame(5, tcp, 0x0010, tcpSegment(5, 1000)), 0x0800, 0},
		{"ipv4 ihl too small", ipv4Frame(4, tcp, 0, tcpSegment(5, 1000)), 0x0800, 0},
		{"ipv4 tcp offset too small", ipv4Frame(5, tcp, 0, tcpSegment(4, 1000)), 0x0800, 0},
		{"ipv4 tcp offset past end", ipv4Frame(5, tcp, 0, tcpSegment(5, 0)[:16]), 0x0800, 0},
		{"ipv4 wrong version", ipv6Frame(tcp, tcpSegment(5, 10)), 0x0800, 0},
		{"ipv6 tcp", ipv6Frame(tcp, tcpSegment(5, 1000)), 0x86dd, 14 + 40 + 20},
		{"ipv6 udp", ipv6Frame(udp, make([]byte, 8)), 0x86dd, 14 + 40 + 8},
		{"ipv6 hop-by-hop", ipv6Frame(0, tcpSegment(5, 1000)), 0x86dd, 0},
		{"ipv6 truncated", ipv6Frame(tcp, nil)[:40], 0x86dd, 0},
		{"arp", frame(splitDst, splitSrc, 0x0806, make([]byte, 28)), 0x0806, 0},
		{"runt", []byte{1, 2, 3}, 0x0800, 0},
	} {
		if got := headersLen(c.frame, c.proto); got != c.want {
			t.Errorf("%s: headersLen = %d, want %d", c.name, got, c.want)
		}
	}
}

// TestRxBufferSplitsLargeSegments: a large TCP frame becomes a header
// chunk and a payload chunk, a small one stays whole, and either way the
// bytes are the frame's.
func TestRxBufferSplitsLargeSegments(t *testing.T) {
	for _, c := range []struct {
		name  string
		frame []byte
		views int
	}{
		{"large", ipv4Frame(5, 6, 0, tcpSegment(5, 60000)), 2},
		{"small payload", ipv4Frame(5, 6, 0, tcpSegment(5, splitMinPayload-1)), 1},
		{"not split", ipv4Frame(5, 1, 0, make([]byte, 60000)), 1},
	} {
		const hdrs = 14 + 20 + 20
		for k := range c.frame[hdrs:] {
			c.frame[hdrs+k] = byte(k * 7) // recognisable payload
		}
		buf := rxBuffer(c.frame, uint16(header.IPv4ProtocolNumber))
		views := 0
		list := buf.AsViewList()
		for v := list.Front(); v != nil; v = v.Next() {
			views++
		}
		if views != c.views {
			t.Errorf("%s: %d views, want %d", c.name, views, c.views)
		}
		if got := buf.Flatten(); !bytes.Equal(got, c.frame) {
			t.Errorf("%s: buffer holds different bytes", c.name)
		}
		buf.Release()
	}
}

// FuzzHeadersLen: any bytes, either ethertype, never panic, and a split
// always falls inside the frame after at least the smallest headers.
func FuzzHeadersLen(f *testing.F) {
	f.Add(ipv4Frame(5, 6, 0, tcpSegment(5, 100)), uint16(0x0800))
	f.Add(ipv6Frame(17, make([]byte, 8)), uint16(0x86dd))
	f.Add([]byte{}, uint16(0x0800))
	f.Fuzz(func(t *testing.T, b []byte, proto uint16) {
		n := headersLen(b, proto)
		if n == 0 {
			return
		}
		if n < ethernetHeaderLen+header.IPv4MinimumSize+header.UDPMinimumSize || n > len(b) {
			t.Fatalf("headersLen = %d for a %d-byte frame", n, len(b))
		}
		buf := rxBuffer(b, proto)
		defer buf.Release()
		if !bytes.Equal(buf.Flatten(), b) {
			t.Fatal("rxBuffer changed the bytes")
		}
	})
}
