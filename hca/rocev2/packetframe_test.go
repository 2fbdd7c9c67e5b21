package rocev2

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"

	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

var (
	frameSrc = netip.MustParseAddrPort("10.9.0.2:49152")
	frameDst = netip.MustParseAddrPort("10.9.0.1:4791")
)

// rxFrame is what the packet socket reads: a virtio-net header (GSO
// segment size gso, 0 for none), a 14-byte Ethernet header and ip.
func rxFrame(ip []byte, gso int) []byte {
	b := make([]byte, vnetHdrLen+14, vnetHdrLen+14+len(ip))
	if gso > 0 {
		b[1] = vnetGSOUDPL4
		binary.NativeEndian.PutUint16(b[4:], uint16(gso))
	}
	binary.BigEndian.PutUint16(b[vnetHdrLen+12:], 0x0800)
	return append(b, ip...)
}

// gsoSuperPacket joins datagrams of one flow, each built for its own ID
// (base, base+1, ...), into the one IPv4 packet a UDP_SEGMENT send is
// before segmentation: the first header, with the whole length.
func gsoSuperPacket(t testing.TB, base uint16, payloads [][]byte) []byte {
	t.Helper()
	var super []byte
	for i, p := range payloads {
		d := rxeDatagram(t, frameSrc, frameDst, base+uint16(i), 0x12, p)
		if i == 0 {
			super = append(super, d...)
		} else {
			super = append(super, d[wire.IPv4HeaderLen+wire.UDPHeaderLen:]...)
		}
	}
	binary.BigEndian.PutUint16(super[2:], uint16(len(super)))
	binary.BigEndian.PutUint16(super[wire.IPv4HeaderLen+4:], uint16(len(super)-wire.IPv4HeaderLen))
	binary.BigEndian.PutUint16(super[10:], 0)
	binary.BigEndian.PutUint16(super[10:], ^checksum.Checksum(super[:wire.IPv4HeaderLen], 0))
	return super
}

// A GSO frame splits into its datagrams, each with the headers it has
// after segmentation, so each one's ICRC checks (IDs wrap at 65535); a
// plain frame is one datagram, Ethernet padding behind it cut off.
func TestPacketFrameSegments(t *testing.T) {
	seg := func(n int) []byte { return make([]byte, n) }
	// Equal segments but the last: GSO's rule. Payload 1000 is one
	// datagram of 1000+12+8+4 bytes (BTH, DETH, ICRC).
	payloads := [][]byte{seg(1000), seg(1000), seg(1000), seg(300)}
	segSize := wire.BTHLen + 8 + 1000 + wire.ICRCLen
	var f packetFrame
	if err := parsePacketFrame(rxFrame(gsoSuperPacket(t, 65534, payloads), segSize), 14, &f); err != nil {
		t.Fatal(err)
	}
	if f.segments() != 4 || f.from != frameSrc || f.dst != frameDst {
		t.Fatalf("%d segments from %v to %v", f.segments(), f.from, f.dst)
	}
	var hdr [68]byte
	for i := range f.segments() {
		pkt, ip, udp := f.segment(i, hdr[:])
		if err := wire.CheckICRC(ip, udp, pkt); err != nil {
			t.Fatalf("segment %d (ID %d): %v", i, binary.BigEndian.Uint16(ip[4:]), err)
		}
		if want := wire.BTHLen + 8 + len(payloads[i]) + wire.ICRCLen; len(pkt) != want {
			t.Fatalf("segment %d: %d bytes, want %d", i, len(pkt), want)
		}
	}

	short := rxeDatagram(t, frameSrc, frameDst, 4242, 0x12, nil)
	padded := append(rxFrame(short, 0), make([]byte, 60-14-len(short)+6)...)
	if err := parsePacketFrame(padded, 14, &f); err != nil {
		t.Fatal(err)
	}
	pkt, ip, udp := f.segment(0, hdr[:])
	if f.segments() != 1 || wire.CheckICRC(ip, udp, pkt) != nil {
		t.Fatalf("padded frame: %d segments, ICRC %v", f.segments(), wire.CheckICRC(ip, udp, pkt))
	}
}

// Frames the kernel's IP and UDP receive would not deliver are dropped
// under a reason, never delivered.
func TestPacketFrameRejects(t *testing.T) {
	good := rxeDatagram(t, frameSrc, frameDst, 100, 0x12, make([]byte, 64))
	mod := func(f func(ip []byte)) []byte {
		ip := append([]byte(nil), good...)
		f(ip)
		return ip
	}
	fixSum := func(ip []byte) {
		binary.BigEndian.PutUint16(ip[10:], 0)
		binary.BigEndian.PutUint16(ip[10:], ^checksum.Checksum(ip[:20], 0))
	}
	for _, c := range []struct {
		name   string
		frame  []byte
		netOff int
		want   wire.DropReason
	}{
		{"no aux data", rxFrame(good, 0), -1, wire.DropTruncated},
		{"short", rxFrame(good[:30], 0), 14, wire.DropTruncated},
		{"ipv6", rxFrame(mod(func(ip []byte) { ip[0] = 0x65 }), 0), 14, wire.DropGarbage},
		{"ihl", rxFrame(mod(func(ip []byte) { ip[0] = 0x44; fixSum(ip) }), 0), 14, wire.DropTruncated},
		{"total beyond frame", rxFrame(mod(func(ip []byte) { binary.BigEndian.PutUint16(ip[2:], 2000); fixSum(ip) }), 0), 14, wire.DropTruncated},
		{"tcp", rxFrame(mod(func(ip []byte) { ip[9] = 6; fixSum(ip) }), 0), 14, wire.DropGarbage},
		{"first fragment", rxFrame(mod(func(ip []byte) { ip[6] = 0x20; fixSum(ip) }), 0), 14, wire.DropGarbage},
		{"header checksum", rxFrame(mod(func(ip []byte) { ip[10] ^= 1 }), 0), 14, wire.DropGarbage},
		{"udp length", rxFrame(mod(func(ip []byte) { ip[25]-- }), 0), 14, wire.DropTruncated},
		{"tcp gso", append([]byte{0, 1}, rxFrame(good, 0)[2:]...), 14, wire.DropGarbage},
		{"gso size 0", append([]byte{0, vnetGSOUDPL4}, rxFrame(good, 0)[2:]...), 14, wire.DropTruncated},
		{"too many segments", rxFrame(rxeDatagram(t, frameSrc, frameDst, 1, 0x12, make([]byte, 200)), 1), 14, wire.DropTruncated},
	} {
		var f packetFrame
		if err := parsePacketFrame(c.frame, c.netOff, &f); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}

// FuzzPacketFrame: parsePacketFrame never panics, and a frame it accepts
// splits into segments that cover its payload exactly, each with headers
// whose lengths describe it.
func FuzzPacketFrame(f *testing.F) {
	f.Add(rxFrame(rxeDatagram(f, frameSrc, frameDst, 7, 0x12, make([]byte, 100)), 0), 14)
	f.Add(rxFrame(gsoSuperPacket(f, 9, [][]byte{make([]byte, 40), make([]byte, 40), make([]byte, 7)}), wire.BTHLen+8+40+wire.ICRCLen), 14)
	f.Add(rxeDatagram(f, frameSrc, frameDst, 7, 0x12, nil), 0)
	f.Fuzz(func(t *testing.T, b []byte, netOff int) {
		var fr packetFrame
		if parsePacketFrame(b, netOff, &fr) != nil {
			return
		}
		n := fr.segments()
		if n < 1 || n > maxFrameSegments {
			t.Fatalf("%d segments", n)
		}
		var hdr [68]byte
		total := 0
		for i := range n {
			pkt, ip, udp := fr.segment(i, hdr[:])
			total += len(pkt)
			if int(binary.BigEndian.Uint16(ip[2:])) != len(ip)+len(udp)+len(pkt) || int(binary.BigEndian.Uint16(udp[4:])) != len(udp)+len(pkt) {
				t.Fatalf("segment %d of %d bytes: IP length %d, UDP length %d", i, len(pkt), binary.BigEndian.Uint16(ip[2:]), binary.BigEndian.Uint16(udp[4:]))
			}
			_ = wire.CheckICRC(ip, udp, pkt)
		}
		if total != len(fr.payload) {
			t.Fatalf("segments cover %d of %d payload bytes", total, len(fr.payload))
		}
	})
}
