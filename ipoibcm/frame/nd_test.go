package frame

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// buildND makes an IPv6 ND packet whose checksum gVisor computes, so the
// rewriter is checked against an independent implementation.
func buildND(typ uint8, src, dst string, body []byte, opts ...[]byte) []byte {
	msg := append([]byte{typ, 0, 0, 0}, body...)
	for _, o := range opts {
		msg = append(msg, o...)
	}
	pkt := make([]byte, header.IPv6MinimumSize+len(msg))
	s, d := netip.MustParseAddr(src).As16(), netip.MustParseAddr(dst).As16()
	header.IPv6(pkt).Encode(&header.IPv6Fields{
		PayloadLength:     uint16(len(msg)),
		TransportProtocol: header.ICMPv6ProtocolNumber,
		HopLimit:          255,
		SrcAddr:           tcpip.AddrFrom16(s),
		DstAddr:           tcpip.AddrFrom16(d),
	})
	copy(pkt[header.IPv6MinimumSize:], msg)
	setGVisorChecksum(pkt)
	return pkt
}

func gvisorChecksum(pkt []byte) uint16 {
	ip := header.IPv6(pkt)
	return header.ICMPv6Checksum(header.ICMPv6ChecksumParams{
		Header: header.ICMPv6(pkt[header.IPv6MinimumSize : header.IPv6MinimumSize+int(ip.PayloadLength())]),
		Src:    ip.SourceAddress(),
		Dst:    ip.DestinationAddress(),
	})
}

func setGVisorChecksum(pkt []byte) {
	header.ICMPv6(pkt[header.IPv6MinimumSize:]).SetChecksum(gvisorChecksum(pkt))
}

func gvisorChecksumValid(pkt []byte) bool {
	return header.ICMPv6(pkt[header.IPv6MinimumSize:]).Checksum() == gvisorChecksum(pkt)
}

func ethOpt(typ uint8, m MAC) []byte { return append([]byte{typ, 1}, m[:]...) }
func ibOpt(typ uint8, a HWAddr) []byte {
	return append([]byte{typ, 3, 0, 0}, a[:]...)
}

func addrBytes(s string) []byte { a := netip.MustParseAddr(s).As16(); return a[:] }

func nsBody(target string) []byte { return append(make([]byte, 4), addrBytes(target)...) }
func naBody(target string) []byte {
	return append([]byte{0x60, 0, 0, 0}, addrBytes(target)...) // S|O
}

var (
	testOwnHW  = NewHWAddr(FlagRC, 0x48, hcaGID("fe80::ff:fe00:1"))
	testHostMC = MAC{0x52, 0x54, 0x00, 0xaa, 0xbb, 0xcc}
)

func hcaGID(s string) [16]byte { return netip.MustParseAddr(s).As16() }

type ndCase struct {
	name      string
	eth, ib   []byte // the same message in both link forms
	info      NDInfo // what NDToIPoIB reports
	ethBack   []byte // what NDToEthernet makes of ib, if not eth
	hasTarget bool
}

func ndCases() []ndCase {
	raBody := []byte{64, 0, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0} // hop limit, flags, lifetime 1800, times
	prefix := append([]byte{3, 4, 64, 0xc0, 0, 0, 0x0e, 0x10, 0, 0, 0x0e, 0x10, 0, 0, 0, 0}, addrBytes("2001:db8::")...)
	mtuOpt := []byte{5, 1, 0, 0, 0, 0, 0x07, 0xfc}
	redirBody := append(append(make([]byte, 4), addrBytes("fe80::2")...), addrBytes("2001:db8::99")...)
	redirHdr := []byte{4, 1, 0, 0, 0, 0, 0, 0} // Redirected Header, no data
	return []ndCase{
		{
			name: "NS with SLLA",
			eth:  buildND(135, "fe80::1", "ff02::1:ff00:2", nsBody("fe80::2"), ethOpt(1, testHostMC)),
			ib:   buildND(135, "fe80::1", "ff02::1:ff00:2", nsBody("fe80::2"), ibOpt(1, testOwnHW)),
			info: NDInfo{Type: 135, Target: netip.MustParseAddr("fe80::2"), HasSourceLL: true, SourceMAC: testHostMC, SourceHW: testOwnHW},
		},
		{
			name: "NA with TLLA",
			eth:  buildND(136, "fe80::1", "fe80::2", naBody("fe80::1"), ethOpt(2, testHostMC)),
			ib:   buildND(136, "fe80::1", "fe80::2", naBody("fe80::1"), ibOpt(2, testOwnHW)),
			info: NDInfo{Type: 136, Target: netip.MustParseAddr("fe80::1"), HasTargetLL: true, TargetMAC: testHostMC, TargetHW: testOwnHW},
		},
		{
			name: "RS with SLLA",
			eth:  buildND(133, "fe80::1", "ff02::2", make([]byte, 4), ethOpt(1, testHostMC)),
			ib:   buildND(133, "fe80::1", "ff02::2", make([]byte, 4), ibOpt(1, testOwnHW)),
			info: NDInfo{Type: 133, HasSourceLL: true, SourceMAC: testHostMC, SourceHW: testOwnHW},
		},
		{
			name: "RA with SLLA, prefix and MTU",
			eth:  buildND(134, "fe80::1", "ff02::1", raBody, ethOpt(1, testHostMC), prefix, mtuOpt),
			ib:   buildND(134, "fe80::1", "ff02::1", raBody, ibOpt(1, testOwnHW), prefix, mtuOpt),
			info: NDInfo{Type: 134, HasSourceLL: true, SourceMAC: testHostMC, SourceHW: testOwnHW},
		},
		{
			name: "DAD NS without options",
			eth:  buildND(135, "::", "ff02::1:ff00:1", nsBody("fe80::1")),
			ib:   buildND(135, "::", "ff02::1:ff00:1", nsBody("fe80::1")),
			info: NDInfo{Type: 135, Target: netip.MustParseAddr("fe80::1")},
		},
		{
			name:    "Redirect drops the host's TLLA",
			eth:     buildND(137, "fe80::1", "fe80::3", redirBody, ethOpt(2, LocalMAC(9)), redirHdr),
			ib:      buildND(137, "fe80::1", "fe80::3", redirBody, redirHdr),
			info:    NDInfo{Type: 137, Target: netip.MustParseAddr("fe80::2")},
			ethBack: buildND(137, "fe80::1", "fe80::3", redirBody, redirHdr),
		},
	}
}

func macOfOwn(want HWAddr, mac MAC) func(HWAddr) (MAC, bool) {
	return func(a HWAddr) (MAC, bool) { return mac, a == want }
}

func TestNDRoundTrips(t *testing.T) {
	for _, c := range ndCases() {
		t.Run(c.name, func(t *testing.T) {
			if !IsND(c.eth) || !IsND(c.ib) {
				t.Fatal("IsND false for a test packet")
			}
			buf := make([]byte, 1500)
			n, info, err := NDToIPoIB(buf, c.eth, testOwnHW)
			if err != nil {
				t.Fatalf("NDToIPoIB: %v", err)
			}
			// Byte equality with the gVisor-checksummed IPoIB form checks
			// options, payload length and checksum at once.
			if !bytes.Equal(buf[:n], c.ib) {
				t.Fatalf("NDToIPoIB:\n got % x\nwant % x", buf[:n], c.ib)
			}
			if !gvisorChecksumValid(buf[:n]) {
				t.Fatal("gVisor rejects the checksum")
			}
			if info != c.info {
				t.Fatalf("info = %+v\nwant %+v", info, c.info)
			}

			back := make([]byte, 1500)
			m, binfo, err := NDToEthernet(back, buf[:n], macOfOwn(testOwnHW, testHostMC))
			if err != nil {
				t.Fatalf("NDToEthernet: %v", err)
			}
			want := c.eth
			if c.ethBack != nil {
				want = c.ethBack
			}
			if !bytes.Equal(back[:m], want) {
				t.Fatalf("NDToEthernet:\n got % x\nwant % x", back[:m], want)
			}
			if binfo.HasSourceLL != info.HasSourceLL || binfo.HasTargetLL != info.HasTargetLL ||
				binfo.SourceHW != info.SourceHW || binfo.TargetHW != info.TargetHW || binfo.Target != info.Target {
				t.Fatalf("NDToEthernet info = %+v, want the IB side of %+v", binfo, info)
			}
		})
	}
}

func TestNDToEthernetReportsPeer(t *testing.T) {
	peer := NewHWAddr(FlagRC, 0x49, hcaGID("fe80::ff:fe00:2"))
	in := buildND(136, "fe80::2", "fe80::1", naBody("fe80::2"), ibOpt(2, peer))
	var asked []HWAddr
	macOf := func(a HWAddr) (MAC, bool) { asked = append(asked, a); return LocalMAC(5), true }
	out := make([]byte, 200)
	n, info, err := NDToEthernet(out, in, macOf)
	if err != nil {
		t.Fatal(err)
	}
	if len(asked) != 1 || asked[0] != peer {
		t.Fatalf("macOf asked for %v", asked)
	}
	if !info.HasTargetLL || info.TargetHW != peer || info.TargetMAC != LocalMAC(5) || !info.TargetHW.Connected() {
		t.Fatalf("info %+v", info)
	}
	want := buildND(136, "fe80::2", "fe80::1", naBody("fe80::2"), ethOpt(2, LocalMAC(5)))
	if !bytes.Equal(out[:n], want) {
		t.Fatalf("got % x\nwant % x", out[:n], want)
	}
}

func TestNDErrors(t *testing.T) {
	ns := buildND(135, "fe80::1", "ff02::1:ff00:2", nsBody("fe80::2"), ethOpt(1, testHostMC))
	nsIB := buildND(135, "fe80::1", "ff02::1:ff00:2", nsBody("fe80::2"), ibOpt(1, testOwnHW))
	edit := func(p []byte, f func([]byte)) []byte { p = bytes.Clone(p); f(p); return p }
	toIB := func(p []byte) error { _, _, err := NDToIPoIB(make([]byte, 1500), p, testOwnHW); return err }
	toEth := func(p []byte) error {
		_, _, err := NDToEthernet(make([]byte, 1500), p, macOfOwn(testOwnHW, testHostMC))
		return err
	}
	for _, c := range []struct {
		name string
		err  error
		want error
	}{
		{"bad checksum", toIB(edit(ns, func(p []byte) { p[42] ^= 1 })), ErrChecksum},
		{"hop limit 64", toIB(edit(ns, func(p []byte) { p[7] = 64 })), ErrNotND},
		{"echo request", toIB(edit(ns, func(p []byte) { p[40] = 128 })), ErrNotND},
		{"code 1", toIB(edit(ns, func(p []byte) { p[41] = 1 })), ErrNotND},
		{"hop-by-hop header", toIB(edit(ns, func(p []byte) { p[6] = 0 })), ErrNotND},
		{"IPv4", toIB(edit(ns, func(p []byte) { p[0] = 0x45 })), ErrNotND},
		{"payload length beyond buffer", toIB(ns[:len(ns)-1]), ErrTruncated},
		{"NS shorter than its target", toIB(edit(ns, func(p []byte) { binary.BigEndian.PutUint16(p[4:6], 20) })), ErrTruncated},
		{"zero-length option", toIB(buildND(135, "fe80::1", "ff02::1", nsBody("fe80::2"), []byte{1, 0, 0, 0, 0, 0, 0, 0})), ErrNDOption},
		{"option overruns", toIB(buildND(135, "fe80::1", "ff02::1", nsBody("fe80::2"), []byte{3, 2, 0, 0, 0, 0, 0, 0})), ErrNDOption},
		{"odd trailing byte", toIB(buildND(135, "fe80::1", "ff02::1", nsBody("fe80::2"), []byte{3})), ErrNDOption},
		{"IB option from host", toIB(nsIB), ErrNDOption},
		{"Ethernet option from IB", toEth(ns), ErrNDOption},
		{"unmapped hwaddr", func() error {
			_, _, err := NDToEthernet(make([]byte, 1500), nsIB, func(HWAddr) (MAC, bool) { return MAC{}, false })
			return err
		}(), ErrUnmappedHW},
		{"dst too small", func() error { _, _, err := NDToIPoIB(make([]byte, len(ns)+15), ns, testOwnHW); return err }(), ErrNoSpace},
	} {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, c.err, c.want)
		}
	}
	if IsND(edit(ns, func(p []byte) { p[7] = 1 })) || IsND(ns[:39]) {
		t.Error("IsND accepted a non-ND packet")
	}
}

func FuzzNDToIPoIB(f *testing.F) {
	for _, c := range ndCases() {
		f.Add(c.eth)
	}
	f.Fuzz(func(t *testing.T, pkt []byte) {
		out := make([]byte, len(pkt)*3+64)
		n, info, err := NDToIPoIB(out, pkt, testOwnHW)
		if err != nil {
			return
		}
		ib := out[:n]
		if !IsND(ib) || !gvisorChecksumValid(ib) {
			t.Fatalf("output is not valid ND: % x", ib)
		}
		// Back to Ethernet and forth again gives the same IPoIB packet.
		eth := make([]byte, n)
		m, binfo, err := NDToEthernet(eth, ib, macOfOwn(testOwnHW, info.SourceMAC))
		if err != nil {
			t.Fatalf("IB form rejected: %v", err)
		}
		if binfo.HasSourceLL != info.HasSourceLL || binfo.HasTargetLL != info.HasTargetLL {
			t.Fatalf("link-layer options lost: %+v vs %+v", binfo, info)
		}
		again := make([]byte, len(out))
		k, _, err := NDToIPoIB(again, eth[:m], testOwnHW)
		if err != nil || !bytes.Equal(again[:k], ib) {
			t.Fatalf("second round trip: %v\n got % x\nwant % x", err, again[:k], ib)
		}
	})
}

func FuzzNDToEthernet(f *testing.F) {
	for _, c := range ndCases() {
		f.Add(c.ib)
	}
	f.Fuzz(func(t *testing.T, pkt []byte) {
		mac := LocalMAC(1)
		eth := make([]byte, len(pkt)+64)
		n, info, err := NDToEthernet(eth, pkt, func(HWAddr) (MAC, bool) { return mac, true })
		if err != nil {
			return
		}
		if n > len(pkt) || !IsND(eth[:n]) || !gvisorChecksumValid(eth[:n]) {
			t.Fatalf("output is not valid ND: % x", eth[:n])
		}
		if (info.HasSourceLL && info.SourceMAC != mac) || (info.HasTargetLL && info.TargetMAC != mac) {
			t.Fatalf("info %+v", info)
		}
		ib := make([]byte, len(pkt)+64)
		k, iinfo, err := NDToIPoIB(ib, eth[:n], testOwnHW)
		if err != nil {
			t.Fatalf("Ethernet form rejected: %v", err)
		}
		if iinfo.HasSourceLL != info.HasSourceLL {
			t.Fatalf("SLLA lost: %+v vs %+v", iinfo, info)
		}
		back := make([]byte, n)
		m, _, err := NDToEthernet(back, ib[:k], func(HWAddr) (MAC, bool) { return mac, true })
		redirectTLLDropped := info.Type == ICMPv6Redirect && info.HasTargetLL
		if err != nil || (!redirectTLLDropped && !bytes.Equal(back[:m], eth[:n])) {
			t.Fatalf("round trip: %v\n got % x\nwant % x", err, back[:m], eth[:n])
		}
	})
}
