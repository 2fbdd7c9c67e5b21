package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// gsoPacket builds a RoCEv2 packet of n payload bytes between two fixed
// IPv4 addresses and returns its headers (IP ID 0) and bytes with the
// ICRC for ID 0.
func gsoPacket(t testing.TB, rng *rand.Rand, n int) (ip, udp, pkt []byte) {
	t.Helper()
	payload := make([]byte, n)
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	pkt = AppendPacket(nil, &PacketSpec{BTH: BTH{Opcode: OpRCSendOnly, PKey: 0xFFFF, DestQP: 0x12, PSN: rng.Uint32() & PSNMask}, Payload: payload})
	var hdr [IPv4HeaderLen + UDPHeaderLen]byte
	PutIPv4Header(hdr[:], netip.MustParseAddr("10.98.0.1"), netip.MustParseAddr("10.98.0.2"), UDPHeaderLen+len(pkt))
	PutUDPHeader(hdr[IPv4HeaderLen:], 4791, 4791, UDPHeaderLen+len(pkt))
	ip, udp = hdr[:IPv4HeaderLen], hdr[IPv4HeaderLen:]
	if err := PutICRC(ip, udp, pkt); err != nil {
		t.Fatal(err)
	}
	return ip, udp, pkt
}

// icrcWithID is the brute-force reference: the ICRC computed over the
// header with the ID written in.
func icrcWithID(t testing.TB, ip, udp, pkt []byte, id uint16) uint32 {
	t.Helper()
	h := append([]byte(nil), ip...)
	binary.BigEndian.PutUint16(h[ipv4IDOffset:], id)
	c, err := ICRC(h, udp, pkt[:len(pkt)-ICRCLen])
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestMultModPAgainstZeroAppend(t *testing.T) {
	// Appending n zero bytes to a raw CRC is multiplication by x^(8n).
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 7, 64, 4111, 8191} {
		msg := make([]byte, 5+n)
		for i := range 5 {
			msg[i] = byte(rng.Uint32())
		}
		if got, want := multModP(x2nModP(uint64(n), 3), rawCRC(msg[:5])), rawCRC(msg); got != want {
			t.Fatalf("zeros %d: %#08x, want %#08x", n, got, want)
		}
	}
	// And the raw CRC is the linear part of the standard one.
	a, b := []byte("abcdefgh"), []byte("01234567")
	x := make([]byte, len(a))
	for i := range a {
		x[i] = a[i] ^ b[i]
	}
	if crc32.ChecksumIEEE(x) != crc32.ChecksumIEEE(a)^rawCRC(b) {
		t.Fatal("crc(a^b) != crc(a)^raw(b)")
	}
}

func TestIDShiftMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 1, 3, 20, 1024, 4084, 4096} {
		ip, udp, pkt := gsoPacket(t, rng, n)
		s := NewIDShift(IPv4HeaderLen, len(pkt))
		ids := []uint16{0, 1, 2, 15, 63, 64, 0x1234, 0xFFFF}
		for _, id := range ids {
			c0 := binary.LittleEndian.Uint32(pkt[len(pkt)-ICRCLen:])
			if got, want := c0^s.Delta(id), icrcWithID(t, ip, udp, pkt, id); got != want {
				t.Fatalf("payload %d ID %#x: shifted %#08x, brute force %#08x", n, id, got, want)
			}
		}
	}
}

func TestCheckICRCGSOAcceptsExactlyOneID(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	var cache IDShiftCache
	for _, n := range []int{0, 100, 4096} {
		ip, udp, pkt := gsoPacket(t, rng, n)
		for id := range uint16(MaxGSOSegments) {
			p := append([]byte(nil), pkt...)
			SetICRCID(p, IPv4HeaderLen, id, &cache)
			if got := binary.LittleEndian.Uint32(p[len(p)-ICRCLen:]); got != icrcWithID(t, ip, udp, p, id) {
				t.Fatalf("SetICRCID(%d) wrote %#08x, want the ICRC with that ID", id, got)
			}
			// Brute force: exactly one ID in range explains the ICRC.
			matches := 0
			for k := range uint16(MaxGSOSegments) {
				if icrcWithID(t, ip, udp, p, k) == binary.LittleEndian.Uint32(p[len(p)-ICRCLen:]) {
					matches++
				}
			}
			if matches != 1 {
				t.Fatalf("payload %d ID %d: %d IDs match", n, id, matches)
			}
			got, err := CheckICRCGSO(ip, udp, p, &cache)
			if err != nil || got != id {
				t.Fatalf("payload %d: CheckICRCGSO = %d, %v; want %d", n, got, err, id)
			}
		}
		// An ID past the GSO range is not accepted.
		p := append([]byte(nil), pkt...)
		SetICRCID(p, IPv4HeaderLen, MaxGSOSegments, &cache)
		if _, err := CheckICRCGSO(ip, udp, p, &cache); !errors.Is(err, DropBadICRC) {
			t.Fatalf("ID %d accepted: %v", MaxGSOSegments, err)
		}
	}
}

func TestCheckICRCGSORejectsCorruption(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	var cache IDShiftCache
	ip, udp, pkt := gsoPacket(t, rng, 4096)
	SetICRCID(pkt, IPv4HeaderLen, 5, &cache)
	for i := 0; i < 2000; i++ {
		p := append([]byte(nil), pkt...)
		p[rng.IntN(len(p))] ^= byte(1 + rng.IntN(255))
		if _, err := CheckICRCGSO(ip, udp, p, &cache); err == nil {
			t.Fatalf("corruption %d accepted", i)
		}
	}
	// Masked BTH byte 4 does not matter, as for CheckICRC.
	p := append([]byte(nil), pkt...)
	p[4] = 0x3F
	if id, err := CheckICRCGSO(ip, udp, p, &cache); err != nil || id != 5 {
		t.Fatalf("masked byte changed the result: %d, %v", id, err)
	}
	// IPv6 has no ID: only an exact ICRC passes.
	var h6 [IPv6HeaderLen]byte
	PutIPv6Header(h6[:], netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2"), UDPHeaderLen+len(pkt))
	p6 := append([]byte(nil), pkt...)
	if err := PutICRC(h6[:], udp, p6); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckICRCGSO(h6[:], udp, p6, &cache); err != nil {
		t.Fatalf("IPv6: %v", err)
	}
	p6[len(p6)-1] ^= 1
	if _, err := CheckICRCGSO(h6[:], udp, p6, &cache); !errors.Is(err, DropBadICRC) {
		t.Fatalf("IPv6 corrupted: %v", err)
	}
	if _, err := CheckICRCGSO(ip, udp, p[:3], &cache); !errors.Is(err, DropTruncated) {
		t.Fatalf("short packet: %v", err)
	}
}

func TestIDShiftCacheEvicts(t *testing.T) {
	var c IDShiftCache
	first := c.Get(IPv4HeaderLen, 100)
	if c.Get(IPv4HeaderLen, 100) != first {
		t.Fatal("hit returned another entry")
	}
	for n := 101; n < 101+len(c.entries); n++ {
		c.Get(IPv4HeaderLen, n)
	}
	fresh := NewIDShift(IPv4HeaderLen, 100)
	if e := c.Get(IPv4HeaderLen, 100); !e.Matches(IPv4HeaderLen, 100) || e.Delta(1) != fresh.Delta(1) {
		t.Fatal("rebuilt entry wrong")
	}
}

func FuzzCheckICRCGSO(f *testing.F) {
	rng := rand.New(rand.NewPCG(9, 10))
	_, _, pkt := gsoPacket(f, rng, 64)
	f.Add(pkt, uint16(3))
	f.Add([]byte{}, uint16(0))
	f.Fuzz(func(t *testing.T, pkt []byte, id uint16) {
		var hdr [IPv4HeaderLen + UDPHeaderLen]byte
		PutIPv4Header(hdr[:], netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), UDPHeaderLen+len(pkt))
		PutUDPHeader(hdr[IPv4HeaderLen:], 4791, 4791, UDPHeaderLen+len(pkt))
		var cache IDShiftCache
		got, err := CheckICRCGSO(hdr[:IPv4HeaderLen], hdr[IPv4HeaderLen:], pkt, &cache)
		if err != nil {
			if ReasonOf(err) == DropNone {
				t.Fatalf("error %v without a reason", err)
			}
			return
		}
		if got >= MaxGSOSegments || icrcWithID(t, hdr[:IPv4HeaderLen], hdr[IPv4HeaderLen:], pkt, got) != binary.LittleEndian.Uint32(pkt[len(pkt)-ICRCLen:]) {
			t.Fatalf("accepted with ID %d that does not verify", got)
		}
		// Re-stamping for another in-range ID is found again.
		id %= MaxGSOSegments
		p := append([]byte(nil), pkt...)
		SetICRCID(p, IPv4HeaderLen, got^id, &cache)
		if again, err := CheckICRCGSO(hdr[:IPv4HeaderLen], hdr[IPv4HeaderLen:], p, &cache); err != nil || again != id {
			t.Fatalf("re-stamped to %d: got %d, %v", id, again, err)
		}
	})
}

func BenchmarkCheckICRCGSO(b *testing.B) {
	rng := rand.New(rand.NewPCG(11, 12))
	ip, udp, pkt := gsoPacket(b, rng, 4096)
	var cache IDShiftCache
	SetICRCID(pkt, IPv4HeaderLen, 37, &cache)
	b.SetBytes(int64(len(pkt)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := CheckICRCGSO(ip, udp, pkt, &cache); err != nil {
			b.Fatal(err)
		}
	}
}

// TestPutICRCSplitMatchesContiguous: a packet held as head, payload and
// tail (a zero-copy send) gets the ICRC the contiguous packet has, for
// every cut, and SetICRCIDTail shifts it as SetICRCID does.
func TestPutICRCSplitMatchesContiguous(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	var shifts IDShiftCache
	for _, n := range []int{0, 1, 3, 100, 4095, 4096} {
		ip, udp, pkt := gsoPacket(t, rng, n)
		want := binary.LittleEndian.Uint32(pkt[len(pkt)-ICRCLen:])
		for range 20 {
			a := BTHLen + rng.IntN(len(pkt)-BTHLen-ICRCLen+1)
			b := a + rng.IntN(len(pkt)-ICRCLen-a+1)
			head := append([]byte(nil), pkt[:a]...)
			tail := append([]byte(nil), pkt[b:]...)
			clear(tail[len(tail)-ICRCLen:])
			if err := PutICRCSplit(ip, udp, head, pkt[a:b], tail); err != nil {
				t.Fatal(err)
			}
			if got := binary.LittleEndian.Uint32(tail[len(tail)-ICRCLen:]); got != want {
				t.Fatalf("%d bytes cut at %d/%d: ICRC %#x, contiguous %#x", len(pkt), a, b, got, want)
			}
			whole := append([]byte(nil), pkt...)
			SetICRCID(whole, IPv4HeaderLen, 5, &shifts)
			SetICRCIDTail(tail[len(tail)-ICRCLen:], len(pkt), IPv4HeaderLen, 5, &shifts)
			if !bytes.Equal(tail[len(tail)-ICRCLen:], whole[len(whole)-ICRCLen:]) {
				t.Fatalf("ID shift of a split packet differs")
			}
		}
	}
	if err := PutICRCSplit(nil, nil, make([]byte, BTHLen-1), nil, make([]byte, ICRCLen)); err == nil {
		t.Fatal("head shorter than the BTH accepted")
	}
}

// TestUpdateSmallMatchesCRC32: the slicing-by-8 small-buffer CRC is
// crc32.Update for every length and starting state.
func TestUpdateSmallMatchesCRC32(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	b := make([]byte, 100)
	for n := range len(b) {
		for range 20 {
			for i := range b[:n] {
				b[i] = byte(rng.Uint32())
			}
			c := rng.Uint32()
			if got, want := updateSmall(c, b[:n]), crc32.Update(c, crc32.IEEETable, b[:n]); got != want {
				t.Fatalf("%d bytes from %#x: %#x, crc32 %#x", n, c, got, want)
			}
		}
	}
}
