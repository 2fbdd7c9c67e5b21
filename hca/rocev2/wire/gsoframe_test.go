package wire

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// superFrame builds what a capture on veth records for one GSO send: the
// segments' bytes (segment j's ICRC for IPv4 ID j) behind one IP/UDP
// header with ID 0 and the total length.
func superFrame(t testing.TB, src, dst netip.AddrPort, sizes []int) []byte {
	t.Helper()
	var payload []byte
	var cache IDShiftCache
	for j, n := range sizes {
		spec := PacketSpec{BTH: BTH{Opcode: OpRCSendMiddle, PKey: 0xFFFF, DestQP: 0x11, PSN: uint32(100 + j)}, Payload: bytes.Repeat([]byte{byte(j)}, n)}
		pkt := AppendPacket(nil, &spec)
		var hdr [IPv6HeaderLen + UDPHeaderLen]byte
		hl := PutIPHeader(hdr[:], src.Addr(), dst.Addr(), UDPHeaderLen+len(pkt))
		PutUDPHeader(hdr[hl:], src.Port(), dst.Port(), UDPHeaderLen+len(pkt))
		if err := PutICRC(hdr[:hl], hdr[hl:hl+UDPHeaderLen], pkt); err != nil {
			t.Fatal(err)
		}
		if src.Addr().Is4() {
			SetICRCID(pkt, IPv4HeaderLen, uint16(j), &cache)
		}
		payload = append(payload, pkt...)
	}
	icrc := bytes.Clone(payload[len(payload)-ICRCLen:])
	f, err := AppendFrame(nil, src, dst, payload, true)
	if err != nil {
		t.Fatal(err)
	}
	copy(f[len(f)-ICRCLen:], icrc) // AppendFrame stamped one ICRC over all
	return f
}

func TestCheckPcapICRCSplitsGSOSuperFrames(t *testing.T) {
	for _, fam := range []struct{ src, dst string }{{"10.0.0.1:4791", "10.0.0.2:4791"}, {"[fd00::1]:4791", "[fd00::2]:4791"}} {
		src, dst := netip.MustParseAddrPort(fam.src), netip.MustParseAddrPort(fam.dst)
		full := superFrame(t, src, dst, []int{4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096})
		tail := superFrame(t, src, dst, []int{1024, 1024, 500})
		bad := bytes.Clone(tail)
		bad[len(bad)-600] ^= 0x10 // inside the second segment
		var buf bytes.Buffer
		if err := WritePcap(&buf, LinkTypeEthernet, [][]byte{full, tail, bad}); err != nil {
			t.Fatal(err)
		}
		rep, err := CheckPcapICRC(&buf, RoCEv2Port)
		if err != nil {
			t.Fatal(err)
		}
		if rep.RoCEv2 != 3 || rep.Good != 2 || rep.Bad != 1 || rep.GSOFrames != 2 || rep.GSOSegments != 18 || rep.FirstBad != "frame 3: ICRC mismatch" {
			t.Fatalf("%s: %v", src.Addr(), rep)
		}
	}
}

func TestCheckGSOSuperFrameRejectsNonRuns(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	ip, udp, pkt := gsoPacket(t, rng, 64)
	if _, err := CheckGSOSuperFrame(ip, udp, pkt); !errors.Is(err, DropBadICRC) {
		t.Fatalf("single packet taken for a run: %v", err)
	}
	junk := make([]byte, 9000)
	for i := range junk {
		junk[i] = byte(rng.Uint32())
	}
	if _, err := CheckGSOSuperFrame(ip, udp, junk); !errors.Is(err, DropBadICRC) {
		t.Fatalf("junk accepted: %v", err)
	}
	if _, err := CheckGSOSuperFrame(ip[:3], udp, junk); !errors.Is(err, DropBadICRC) {
		t.Fatalf("short header: %v", err)
	}
}

func FuzzCheckGSOSuperFrame(f *testing.F) {
	f.Add(superFrame(f, netip.MustParseAddrPort("10.0.0.1:4791"), netip.MustParseAddrPort("10.0.0.2:4791"), []int{64, 64, 10})[14+28:])
	f.Fuzz(func(t *testing.T, pkt []byte) {
		var hdr [IPv4HeaderLen + UDPHeaderLen]byte
		PutIPv4Header(hdr[:], netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), UDPHeaderLen+len(pkt))
		PutUDPHeader(hdr[IPv4HeaderLen:], 4791, 4791, UDPHeaderLen+len(pkt))
		n, err := CheckGSOSuperFrame(hdr[:IPv4HeaderLen], hdr[IPv4HeaderLen:], pkt)
		if err == nil && (n < 2 || n > len(pkt)/(BTHLen+ICRCLen)) {
			t.Fatalf("%d segments in %d bytes", n, len(pkt))
		}
	})
}
