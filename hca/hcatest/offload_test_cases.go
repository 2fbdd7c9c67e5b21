package hcatest

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/offload"
)

// ipoibPacket writes into b an IPoIB datagram: the 4-byte encapsulation
// header, IPv4 or IPv6, TCP or UDP, and a payload, with checksum fields
// holding garbage (what the device must fill or refuse to vouch for). It
// returns the packet's length.
func ipoibPacket(b []byte, v6, tcp bool, payload int) int {
	l4len := 8
	proto := byte(offload.ProtoUDP)
	if tcp {
		l4len, proto = 20, offload.ProtoTCP
	}
	l3 := hca.OffloadL3Offset
	iplen := 20
	if v6 {
		iplen = 40
		binary.BigEndian.PutUint16(b[0:], 0x86DD)
	} else {
		binary.BigEndian.PutUint16(b[0:], 0x0800)
	}
	b[2], b[3] = 0, 0
	ip := b[l3 : l3+iplen]
	clear(ip)
	if v6 {
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(l4len+payload))
		ip[6], ip[7] = proto, 64
		copy(ip[8:], []byte{0xfd, 0, 15: 1})
		copy(ip[24:], []byte{0xfd, 0, 15: 2})
	} else {
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(iplen+l4len+payload))
		binary.BigEndian.PutUint16(ip[4:], 0x1234)
		ip[8], ip[9] = 64, proto
		ip[10], ip[11] = 0xBA, 0xD0
		copy(ip[12:], []byte{10, 0, 0, 1, 10, 0, 0, 2})
	}
	l4 := b[l3+iplen : l3+iplen+l4len]
	clear(l4)
	binary.BigEndian.PutUint16(l4[0:], 40000)
	binary.BigEndian.PutUint16(l4[2:], 5201)
	if tcp {
		binary.BigEndian.PutUint32(l4[4:], 1000)
		l4[12], l4[13] = 5<<4, 0x18 // ACK|PSH
		l4[16], l4[17] = 0xBA, 0xD0
	} else {
		binary.BigEndian.PutUint16(l4[4:], uint16(8+payload))
		l4[6], l4[7] = 0xBA, 0xD0
	}
	n := l3 + iplen + l4len + payload
	fill(b[l3+iplen+l4len:n], payload)
	return n
}

// offloadsOrSkip returns the device's offloads, skipping when it has the
// one the test needs not.
func offloadsOrSkip(t *testing.T, dev hca.Device, lso bool) hca.Offloads {
	o := dev.Limits().Offloads
	if !o.IPCsum {
		t.Skip("device reports no IP checksum offload")
	}
	if lso && o.UDLSOMaxSize == 0 {
		t.Skip("device reports no UD LSO")
	}
	return o
}

// checkOffloaded checks a received message the sender asked checksum
// offload for: the device either verified it (WCIPCsumOK, and then the
// bytes are exactly the sent packet with valid checksums) or passed it on
// unfinished (WCCsumPartial, and then completing the checksums gives
// exactly those bytes). With unflagged allowed (RC, whose receives a
// device need not verify) a message without either flag must carry
// exactly the right checksums: the device filled them before the wire.
func checkOffloaded(t *testing.T, f Fabric, wc hca.WC, got, want []byte, unflagged bool) {
	t.Helper()
	if !unflagged {
		expectOffloadFlag(t, f, wc)
	}
	wantFilled := bytes.Clone(want)
	if _, err := offload.FillChecksums(wantFilled, hca.OffloadL3Offset); err != nil {
		t.Fatalf("test packet does not parse: %v", err)
	}
	switch {
	case wc.Flags&hca.WCIPCsumOK != 0:
		if !offload.VerifyChecksums(got, hca.OffloadL3Offset) || !bytes.Equal(got, wantFilled) {
			t.Fatalf("WCIPCsumOK on a message whose checksums are not the right ones")
		}
	case wc.Flags&hca.WCCsumPartial != 0:
		g := bytes.Clone(got)
		if _, err := offload.FillChecksums(g, hca.OffloadL3Offset); err != nil || !bytes.Equal(g, wantFilled) {
			t.Fatalf("partial message differs from the sent one beyond its checksums")
		}
	case unflagged:
		if !bytes.Equal(got, wantFilled) {
			t.Fatalf("checksum-offloaded send arrived without the right checksums")
		}
	default:
		t.Fatalf("checksum-offloaded send arrived with flags %v: neither verified nor partial", wc.Flags)
	}
}

func udPair(t *testing.T, f Fabric) (a, b *endpoint, ah hca.AH) {
	t.Helper()
	skipLossy(t, f)
	da, db := f.NewDevice(t), f.NewDevice(t)
	a = newEndpoint(t, f, da, hca.QPTypeUD, qpOpts{ctx: "a"})
	b = newEndpoint(t, f, db, hca.QPTypeUD, qpOpts{ctx: "b", maxRecv: 512})
	udUp(t, a, testQKey, 0)
	udUp(t, b, testQKey, 0)
	return a, b, createAH(t, da, db.Port().GID)
}

// expectOffloadFlag checks the backend's declared verdict.
func expectOffloadFlag(t *testing.T, f Fabric, wc hca.WC) {
	t.Helper()
	if want := f.Properties().OffloadedRecv; want != 0 && wc.Flags&(hca.WCIPCsumOK|hca.WCCsumPartial) != want {
		t.Fatalf("offloaded receive with flags %v, this backend gives %v", wc.Flags, want)
	}
}

// testOffloadCaps: an LSO device can at least fill one MTU.
func testOffloadCaps(t *testing.T, f Fabric) {
	d := f.NewDevice(t)
	o := d.Limits().Offloads
	if o.UDLSOMaxSize != 0 && o.UDLSOMaxSize < int(d.Port().ActiveMTU) {
		t.Fatalf("UD LSO maximum %d below the %d-byte MTU", o.UDLSOMaxSize, d.Port().ActiveMTU)
	}
	if o.UDLSOMaxSize != 0 && !o.IPCsum {
		t.Fatalf("UD LSO without checksum offload: every segment needs checksums")
	}
}

// testUDCsumOffload: SendIPCsum on IPv4/IPv6 TCP/UDP datagrams arrives
// verified or honestly partial, never silently wrong.
func testUDCsumOffload(t *testing.T, f Fabric) {
	a, b, ah := udPair(t, f)
	offloadsOrSkip(t, a.dev, false)
	mtu := int(b.dev.Port().ActiveMTU)
	id := uint64(1)
	for _, v6 := range []bool{false, true} {
		for _, tcp := range []bool{false, true} {
			buf := alloc(t, b.dev, mtu)
			postRecv(t, b.qp, hca.RecvWR{ID: id, Buf: buf})
			msg := alloc(t, a.dev, mtu)
			n := ipoibPacket(msg, v6, tcp, 1000)
			sent := bytes.Clone(msg[:n])
			postSend(t, a.qp, hca.SendWR{ID: id, Data: msg[:n], AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: testQKey, Flags: hca.SendIPCsum})
			expectWC(t, a.sendCQ.wait(t, 1)[0], id, hca.StatusSuccess, hca.WCSend)
			wc := b.recvCQ.wait(t, 1)[0]
			expectWC(t, wc, id, hca.StatusSuccess, hca.WCRecv)
			if wc.ByteLen != n {
				t.Fatalf("v6=%t tcp=%t: %d bytes, sent %d", v6, tcp, wc.ByteLen, n)
			}
			checkOffloaded(t, f, wc, buf[:n], sent, false)
			id++
		}
	}
}

// testUDCsumOKOnlyVerified: without SendIPCsum a datagram with a wrong
// TCP checksum never completes with WCIPCsumOK (nor WCCsumPartial), and
// one completed WCIPCsumOK really has valid checksums.
func testUDCsumOKOnlyVerified(t *testing.T, f Fabric) {
	a, b, ah := udPair(t, f)
	mtu := int(b.dev.Port().ActiveMTU)
	for i, good := range []bool{false, true} {
		buf := alloc(t, b.dev, mtu)
		postRecv(t, b.qp, hca.RecvWR{ID: uint64(i), Buf: buf})
		msg := alloc(t, a.dev, mtu)
		n := ipoibPacket(msg, false, true, 700)
		if good {
			if _, err := offload.FillChecksums(msg[:n], hca.OffloadL3Offset); err != nil {
				t.Fatal(err)
			}
		}
		postSend(t, a.qp, hca.SendWR{ID: uint64(i), Data: msg[:n], AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: testQKey})
		a.sendCQ.wait(t, 1)
		wc := b.recvCQ.wait(t, 1)[0]
		expectWC(t, wc, uint64(i), hca.StatusSuccess, hca.WCRecv)
		if wc.Flags&hca.WCCsumPartial != 0 {
			t.Fatalf("WCCsumPartial on a send that asked for no offload")
		}
		if wc.Flags&hca.WCIPCsumOK != 0 && !offload.VerifyChecksums(buf[:wc.ByteLen], hca.OffloadL3Offset) {
			t.Fatalf("good=%t: WCIPCsumOK on invalid checksums", good)
		}
		if verifies := f.Properties().OffloadedRecv == hca.WCIPCsumOK; verifies && good && wc.Flags&hca.WCIPCsumOK == 0 {
			t.Fatalf("a verifying device did not report WCIPCsumOK for valid checksums")
		}
		if !bytes.Equal(buf[:n], msg[:n]) {
			t.Fatalf("good=%t: datagram changed in flight", good)
		}
	}
}

// testUDLSO: one LSO send of a TCP (IPv4, IPv6) or UDP super packet
// arrives as MTU-sized datagrams that are exactly what software
// segmentation makes of it, checksums verified or honestly partial, with
// one send completion.
func testUDLSO(t *testing.T, f Fabric) {
	a, b, ah := udPair(t, f)
	o := offloadsOrSkip(t, a.dev, true)
	mtu := int(b.dev.Port().ActiveMTU)
	id := uint64(100)
	for _, c := range []struct{ v6, tcp bool }{{false, true}, {true, true}, {false, false}, {true, false}} {
		msg := alloc(t, a.dev, o.UDLSOMaxSize)
		n := ipoibPacket(msg, c.v6, c.tcp, 20000)
		h, err := offload.Parse(msg[:n], hca.OffloadL3Offset)
		if err != nil {
			t.Fatal(err)
		}
		mss := mtu - h.End
		want := make([][]byte, h.Segments(mss))
		for i := range want {
			want[i] = make([]byte, mtu)
		}
		if _, err := offload.Segment(msg[:n], hca.OffloadL3Offset, mss, want); err != nil {
			t.Fatal(err)
		}
		bufs := alloc(t, b.dev, len(want)*mtu)
		for i := range want {
			postRecv(t, b.qp, hca.RecvWR{ID: uint64(i), Buf: bufs[i*mtu : (i+1)*mtu]})
		}
		postSend(t, a.qp, hca.SendWR{ID: id, Data: msg[:n], AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: testQKey, MSS: mss})
		if wcs := a.sendCQ.wait(t, 1); len(wcs) != 1 {
			t.Fatalf("%d send completions for one LSO send", len(wcs))
		} else {
			expectWC(t, wcs[0], id, hca.StatusSuccess, hca.WCSend)
		}
		wcs := b.recvCQ.wait(t, len(want))
		for i, wc := range wcs {
			expectWC(t, wc, uint64(i), hca.StatusSuccess, hca.WCRecv)
			if wc.ByteLen > mtu || wc.ByteLen != len(want[i]) {
				t.Fatalf("v6=%t tcp=%t segment %d: %d bytes, want %d (MTU %d)", c.v6, c.tcp, i, wc.ByteLen, len(want[i]), mtu)
			}
			got := bufs[i*mtu : i*mtu+wc.ByteLen]
			expectOffloadFlag(t, f, wc)
			switch {
			case wc.Flags&hca.WCIPCsumOK != 0:
				if !bytes.Equal(got, want[i]) {
					t.Fatalf("segment %d differs from software segmentation", i)
				}
			case wc.Flags&hca.WCCsumPartial != 0:
				g := bytes.Clone(got)
				if _, err := offload.FillChecksums(g, hca.OffloadL3Offset); err != nil || !bytes.Equal(g, want[i]) {
					t.Fatalf("partial segment %d differs from software segmentation beyond checksums", i)
				}
			default:
				t.Fatalf("LSO segment %d with flags %v", i, wc.Flags)
			}
		}
		if extra := b.recvCQ.pollNow(); len(extra) != 0 {
			t.Fatalf("%d completions beyond the %d segments", len(extra), len(want))
		}
		id++
	}
}

// testLSORejects: an LSO send above the device maximum, or with an MSS
// the MTU cannot hold, fails at PostSend with a clear error and sends
// nothing.
func testLSORejects(t *testing.T, f Fabric) {
	a, b, ah := udPair(t, f)
	o := offloadsOrSkip(t, a.dev, true)
	mtu := int(b.dev.Port().ActiveMTU)
	buf := alloc(t, b.dev, mtu)
	postRecv(t, b.qp, hca.RecvWR{ID: 1, Buf: buf})
	big := alloc(t, a.dev, o.UDLSOMaxSize+1)
	ipoibPacket(big, false, true, 1000)
	wr := hca.SendWR{ID: 7, Data: big, AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: testQKey, MSS: 1000}
	if n, err := a.qp.PostSend([]hca.SendWR{wr}); n != 0 || !isErr(err, hca.ErrLSOTooLarge) || !isErr(err, hca.ErrInvalidArgument) {
		t.Fatalf("LSO of %d bytes, max %d: posted %d, err %v; want ErrLSOTooLarge", len(big), o.UDLSOMaxSize, n, err)
	}
	n := ipoibPacket(big, false, true, 3000)
	wr.Data, wr.MSS = big[:n], mtu
	if k, err := a.qp.PostSend([]hca.SendWR{wr}); k != 0 || !isErr(err, hca.ErrInvalidArgument) {
		t.Fatalf("LSO with MSS %d = MTU: posted %d, err %v; want ErrInvalidArgument", mtu, k, err)
	}
	wr.Data, wr.MSS = []byte{1, 2, 3, 4, 5}, 100
	if k, err := a.qp.PostSend([]hca.SendWR{wr}); k != 0 || !isErr(err, hca.ErrInvalidArgument) {
		t.Fatalf("LSO of a non-IP message: posted %d, err %v; want ErrInvalidArgument", k, err)
	}
	if got := a.sendCQ.pollNow(); len(got) != 0 {
		t.Fatalf("%d send completions for rejected sends", len(got))
	}
	if got := b.recvCQ.pollNow(); len(got) != 0 {
		t.Fatalf("rejected LSO sends delivered %d datagrams", len(got))
	}
}

// testRCCsumOffload: SendIPCsum on an RC message (connected mode's
// checksum path) arrives verified, honestly partial, or with the right
// checksums filled in.
func testRCCsumOffload(t *testing.T, f Fabric) {
	a, b := rcPair(t, f, qpOpts{}, qpOpts{})
	offloadsOrSkip(t, a.dev, false)
	buf := alloc(t, b.dev, 65536)
	postRecv(t, b.qp, hca.RecvWR{ID: 1, Buf: buf})
	msg := alloc(t, a.dev, 65536)
	n := ipoibPacket(msg, false, true, 60000)
	sent := bytes.Clone(msg[:n])
	postSend(t, a.qp, hca.SendWR{ID: 2, Data: msg[:n], Flags: hca.SendIPCsum})
	expectWC(t, a.sendCQ.wait(t, 1)[0], 2, hca.StatusSuccess, hca.WCSend)
	wc := b.recvCQ.wait(t, 1)[0]
	expectWC(t, wc, 1, hca.StatusSuccess, hca.WCRecv)
	checkOffloaded(t, f, wc, buf[:wc.ByteLen], sent, true)
	if k, err := a.qp.PostSend([]hca.SendWR{{ID: 3, Data: msg[:n], MSS: 1000}}); k != 0 || !isErr(err, hca.ErrInvalidArgument) {
		t.Fatalf("LSO on RC: posted %d, err %v; want ErrInvalidArgument", k, err)
	}
}
