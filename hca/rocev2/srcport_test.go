package rocev2

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// TestSourcePortPerQP: each RC QP sends from rdma_get_udp_sport of its QP
// pair, a UD QP from rxe's hash of its QPN, all to the fabric port, with
// an ICRC over the ports actually used; the sockets close with their QPs.
func TestSourcePortPerQP(t *testing.T) {
	f := newTestFabric(t, 33, Faults{})
	d := f.newDevice(t)
	peerAddr := netip.AddrFrom4([4]byte{127, 33, 0, 200})
	peer, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(peerAddr, f.port)))
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	cq := newWaitCQ(t, d, 64)
	mem, err := d.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	// recv reads the next datagram at the peer and checks its ICRC as
	// the wire carried it, source port included.
	recv := func() netip.AddrPort {
		t.Helper()
		buf := make([]byte, 2048)
		if err := peer.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Fatal(err)
		}
		n, from, err := peer.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("peer read: %v", err)
		}
		var hdr [wire.IPv6HeaderLen + wire.UDPHeaderLen]byte
		udpLen := wire.UDPHeaderLen + n
		h := wire.PutIPHeader(hdr[:], from.Addr(), peerAddr, udpLen)
		wire.PutUDPHeader(hdr[h:], from.Port(), f.port, udpLen)
		if err := wire.CheckICRC(hdr[:h], hdr[h:h+wire.UDPHeaderLen], buf[:n]); err != nil {
			t.Fatalf("ICRC of a datagram from %v: %v", from, err)
		}
		return from
	}

	var qps []hca.QP
	ports := make(map[uint16]bool)
	for _, dest := range []hca.QPN{0x100, 0x2345} {
		qp, err := d.CreateQP(hca.QPConfig{Type: hca.QPTypeRC, SendCQ: cq.CQ, RecvCQ: cq.CQ, MaxSendWR: 4, MaxRecvWR: 4})
		if err != nil {
			t.Fatal(err)
		}
		qps = append(qps, qp)
		if n := d.Stats().SourcePorts; n != uint64(len(ports)) {
			t.Fatalf("an RC QP without a peer opened a socket: %d open", n)
		}
		mustModify(t, qp, hca.QPAttr{State: hca.QPStateInit})
		mustModify(t, qp, hca.QPAttr{State: hca.QPStateRTR, DestQPN: dest, DestGID: hca.GIDFromAddr(peerAddr), PathMTU: hca.MTU1024})
		mustModify(t, qp, hca.QPAttr{State: hca.QPStateRTS}) // no transport timer: one datagram
		if _, err := qp.PostSend([]hca.SendWR{{ID: 1, Data: mem[:64]}}); err != nil {
			t.Fatal(err)
		}
		from := recv()
		if want := wire.UDPSourcePort(uint32(qp.QPN()), uint32(dest)); from.Port() != want {
			t.Fatalf("RC QP %#x -> %#x sent from port %#x, want rdma_get_udp_sport %#x", qp.QPN(), dest, from.Port(), want)
		}
		ports[from.Port()] = true
	}
	if len(ports) != 2 {
		t.Fatalf("two QP pairs, source ports %v", ports)
	}

	ud, err := d.CreateQP(hca.QPConfig{Type: hca.QPTypeUD, SendCQ: cq.CQ, RecvCQ: cq.CQ, MaxSendWR: 4, MaxRecvWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []hca.QPState{hca.QPStateInit, hca.QPStateRTR, hca.QPStateRTS} {
		mustModify(t, ud, hca.QPAttr{State: s, QKey: 0x1234})
	}
	ah, err := d.CreateAH(hca.GIDFromAddr(peerAddr))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ud.PostSend([]hca.SendWR{{ID: 2, Data: mem[:32], AH: ah, RemoteQPN: 0x77, RemoteQKey: 0x1234}}); err != nil {
		t.Fatal(err)
	}
	if from, want := recv(), wire.QPSourcePort(uint32(ud.QPN())); from.Port() != want {
		t.Fatalf("UD QP %#x sent from port %#x, want %#x", ud.QPN(), from.Port(), want)
	}
	if s := d.Stats(); s.SourcePorts != 3 || s.SourcePortFallbacks != 0 {
		t.Fatalf("source ports %d, fallbacks %d; want 3, 0", s.SourcePorts, s.SourcePortFallbacks)
	}
	for _, qp := range append(qps, ud) {
		if err := qp.Destroy(); err != nil {
			t.Fatal(err)
		}
	}
	if n := d.Stats().SourcePorts; n != 0 {
		t.Fatalf("%d source sockets open after every QP was destroyed", n)
	}
}

// TestSourcePortTakenFallsBack: a port some other socket holds leaves the
// QP on the fabric port, counted, and its packets still verify.
func TestSourcePortTakenFallsBack(t *testing.T) {
	f := newTestFabric(t, 34, Faults{})
	d := f.newDevice(t)
	cq := newWaitCQ(t, d, 64)
	q, err := d.CreateQP(hca.QPConfig{Type: hca.QPTypeRC, SendCQ: cq.CQ, RecvCQ: cq.CQ, MaxSendWR: 4, MaxRecvWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	const dest = 0x321
	want := wire.UDPSourcePort(uint32(q.QPN()), dest)
	squat, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(d.LocalAddr().Addr(), want)))
	if err != nil {
		t.Skipf("cannot hold port %d for the test: %v", want, err)
	}
	defer squat.Close()
	mustModify(t, q, hca.QPAttr{State: hca.QPStateInit})
	mustModify(t, q, hca.QPAttr{State: hca.QPStateRTR, DestQPN: dest, DestGID: hca.GIDFromAddr(netip.AddrFrom4([4]byte{127, 34, 0, 200})), PathMTU: hca.MTU1024})
	if s := d.Stats(); s.SourcePortFallbacks != 1 {
		t.Fatalf("fallbacks %d, want 1", s.SourcePortFallbacks)
	}
	d.mu.Lock()
	src := q.(*qp).src
	d.mu.Unlock()
	if src != d.sock {
		t.Fatalf("QP sends from port %d, want the fabric port %d", src.port, d.sock.port)
	}
}
