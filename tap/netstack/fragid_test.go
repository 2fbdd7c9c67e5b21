package netstack

import (
	"encoding/binary"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// ipv4Fragment is a TCP frame turned into an IPv4 fragment with ID id,
// fragment offset offset (in 8-byte units) and the more-fragments flag.
func ipv4Fragment(id uint16, offset uint16, more bool) []byte {
	f := tcpFrame(false, 1, header.TCPFlagAck, make([]byte, 64))
	ip := header.IPv4(f[ethernetHeaderLen:])
	ip.SetID(id)
	flags := uint16(0x4000) | offset // DF stays set, as gVisor leaves it
	if more {
		flags |= 0x2000
	}
	binary.BigEndian.PutUint16(ip[6:8], flags)
	ip.SetChecksum(0)
	ip.SetChecksum(^ip.CalculateChecksum())
	return f
}

func TestFragRenumberer(t *testing.T) {
	var r fragRenumberer
	steps := []struct {
		name  string
		frame []byte
		want  uint16
	}{
		{"first datagram, first fragment", ipv4Fragment(0, 0, true), 1},
		{"first datagram, middle", ipv4Fragment(0, 500, true), 1},
		{"first datagram, last", ipv4Fragment(0, 1000, false), 1},
		{"not a fragment", ipv4Fragment(0, 0, false), 0},
		{"second datagram, first fragment", ipv4Fragment(0, 0, true), 2},
		{"second datagram, last", ipv4Fragment(0, 500, false), 2},
		{"fragment with its own ID", ipv4Fragment(77, 0, true), 77},
	}
	for _, s := range steps {
		r.renumber(s.frame)
		ip := header.IPv4(s.frame[ethernetHeaderLen:])
		if ip.ID() != s.want || !ip.IsChecksumValid() {
			t.Fatalf("%s: ID %d (want %d), checksum valid %v", s.name, ip.ID(), s.want, ip.IsChecksumValid())
		}
	}
	var fresh fragRenumberer
	orphan := ipv4Fragment(0, 500, false)
	fresh.renumber(orphan)
	if id := header.IPv4(orphan[ethernetHeaderLen:]).ID(); id != 0 {
		t.Fatalf("a later fragment without its first got ID %d", id)
	}
}
