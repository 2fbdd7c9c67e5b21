package rocev2

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// vethWire is a private network namespace with a veth pair: the device
// binds an address of rx0, and frames written to tx0 with a packet
// socket arrive on rx0 from the wire, byte for byte as built.
type vethWire struct {
	rx0, tx0 netlink.Link
	fd       int // AF_PACKET SOCK_DGRAM socket on tx0
}

// enterVethWire moves the test goroutine's thread (locked for the rest
// of the test, so the namespace ends with it) into a new network
// namespace with rx0 carrying addr.
func enterVethWire(t *testing.T, addr netip.Addr) *vethWire {
	t.Helper()
	runtime.LockOSThread() // never unlocked, on purpose
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		t.Skipf("needs a private network namespace (CAP_SYS_ADMIN): %v", err)
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "rx0", MTU: 9000}, PeerName: "tx0"}); err != nil {
		t.Skipf("needs veth: %v", err)
	}
	w := &vethWire{}
	for _, name := range []string{"lo", "tx0", "rx0"} {
		l, err := h.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
		switch name {
		case "rx0":
			w.rx0 = l
		case "tx0":
			w.tx0 = l
		}
	}
	na := &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(24, 32)}, Flags: unix.IFA_F_NODAD}
	if err := h.AddrAdd(w.rx0, na); err != nil {
		t.Fatal(err)
	}
	if err := awaitLocal(addr); err != nil {
		t.Fatal(err)
	}
	if w.fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_IP))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(w.fd) })
	w.awaitWire(t)
	return w
}

// probeEtherType is IEEE 802's local experimental EtherType.
const probeEtherType = 0x88B5

// awaitWire returns once a frame written to tx0 arrives on rx0. Until
// the kernel's link watcher has seen both ends up, tx0 has no queueing
// discipline and drops what it is given (the first datagrams of a fresh
// pair were lost), so the wire is tried rather than trusted.
func (w *vethWire) awaitWire(t *testing.T) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(htons(probeEtherType)))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(probeEtherType), Ifindex: w.rx0.Attrs().Index}); err != nil {
		t.Fatal(err)
	}
	tv := unix.NsecToTimeval((10 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	sa := &unix.SockaddrLinklayer{Ifindex: w.tx0.Attrs().Index, Protocol: htons(probeEtherType), Halen: 6}
	copy(sa.Addr[:], w.rx0.Attrs().HardwareAddr)
	var buf [64]byte
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		if err := unix.Sendto(w.fd, buf[:46], 0, sa); err != nil {
			t.Fatal(err)
		}
		if _, _, err := unix.Recvfrom(fd, buf[:], 0); err == nil {
			return
		}
	}
	t.Fatal("frames written to tx0 do not reach rx0 after 5 s")
}

// send writes an IPv4 packet onto tx0, addressed to rx0's MAC.
func (w *vethWire) send(t *testing.T, ip []byte) {
	t.Helper()
	sa := &unix.SockaddrLinklayer{Ifindex: w.tx0.Attrs().Index, Protocol: htons(unix.ETH_P_IP), Halen: 6}
	copy(sa.Addr[:], w.rx0.Attrs().HardwareAddr)
	if err := unix.Sendto(w.fd, ip, 0, sa); err != nil {
		t.Fatal(err)
	}
}

// rxeDatagram is an IPv4 packet as Linux rxe sends a UD SEND_ONLY: IPv4
// ID id (rxe takes it from the kernel's ident generator), DF, UDP
// checksum 0, and the ICRC over that header.
func rxeDatagram(t testing.TB, src, dst netip.AddrPort, id uint16, destQP hca.QPN, payload []byte) []byte {
	t.Helper()
	s := wire.PacketSpec{BTH: wire.BTH{Opcode: wire.OpUDSendOnly, PKey: 0xFFFF, DestQP: uint32(destQP), PSN: uint32(id)},
		DETH: wire.DETH{QKey: testQKey, SrcQP: 0x11}, Payload: payload}
	f, err := wire.AppendFrame(nil, src, dst, wire.AppendPacket(nil, &s), false)
	if err != nil {
		t.Fatal(err)
	}
	ip, udp := f[:wire.IPv4HeaderLen], f[wire.IPv4HeaderLen:wire.IPv4HeaderLen+wire.UDPHeaderLen]
	binary.BigEndian.PutUint16(ip[4:], id)
	binary.BigEndian.PutUint16(ip[10:], 0)
	binary.BigEndian.PutUint16(ip[10:], ^checksum.Checksum(ip, 0))
	udp[6], udp[7] = 0, 0
	if err := wire.PutICRC(ip, udp, f[wire.IPv4HeaderLen+wire.UDPHeaderLen:]); err != nil {
		t.Fatal(err)
	}
	return f
}

// ipoibEcho is an IPoIB packet (the 4-byte encapsulation header, then
// IPv4) carrying an ICMP echo request with sequence number seq.
func ipoibEcho(src, dst netip.Addr, seq uint16) []byte {
	const icmpLen = 8 + 56
	b := make([]byte, 4+20+icmpLen)
	binary.BigEndian.PutUint16(b, 0x0800)
	ip := b[4:24]
	ip[0], ip[8], ip[9] = 0x45, 64, 1
	binary.BigEndian.PutUint16(ip[2:], 20+icmpLen)
	binary.BigEndian.PutUint16(ip[6:], 0x4000)
	copy(ip[12:], src.AsSlice())
	copy(ip[16:], dst.AsSlice())
	binary.BigEndian.PutUint16(ip[10:], ^checksum.Checksum(ip, 0))
	icmp := b[24:]
	icmp[0] = 8 // echo request
	binary.BigEndian.PutUint16(icmp[4:], 0x1d1d)
	binary.BigEndian.PutUint16(icmp[6:], seq)
	for i := 8; i < len(icmp); i++ {
		icmp[i] = byte(i)
	}
	binary.BigEndian.PutUint16(icmp[2:], ^checksum.Checksum(icmp, 0))
	return b
}

// TestRxeIPv4IDsDelivered sends what Linux rxe sends over IPv4 onto a
// veth from outside the host's stack: 20 UD SEND_ONLY datagrams carrying
// an IPoIB ICMP echo, IPv4 IDs spread over 64..65535, UDP checksum 0,
// valid ICRCs over the real header. Through the packet socket all 20
// arrive, and the same datagrams with one ICRC bit flipped are all
// dropped as bad_icrc; the UDP socket, which hides the ID, loses all 20
// good ones (the reason for the packet socket). The UDP socket's queue
// stays empty while the packet socket receives.
func TestRxeIPv4IDsDelivered(t *testing.T) {
	local := netip.MustParseAddr("10.23.0.1")
	w := enterVethWire(t, local)
	peer := netip.AddrPortFrom(netip.MustParseAddr("10.23.0.2"), 49152)
	const n = 20
	ids := make([]uint16, n)
	for k := range ids {
		ids[k] = uint16(64 + k*(65535-64)/(n-1))
	}
	for _, c := range []struct {
		name       string
		udpReceive bool
		wantGood   int
	}{
		{"packet socket", false, n},
		{"udp socket", true, 0},
	} {
		// Not subtests: their goroutines would run outside this
		// thread's namespace.
		func() {
			f := newTestFabric(t, 0, Faults{})
			d := f.open(t, Config{Bind: netip.AddrPortFrom(local, wire.RoCEv2Port), UDPReceive: c.udpReceive, Name: t.Name()})
			defer func() {
				if err := d.Close(); err != nil {
					t.Error(err)
				}
				f.devs = nil
			}()
			if (d.psock != nil) == c.udpReceive {
				t.Fatalf("%s: packet socket open: %v, want %v", c.name, d.psock != nil, !c.udpReceive)
			}
			e := newUDEnd(t, d, 2*n)
			payloads := make([][]byte, n)
			for k, id := range ids {
				payloads[k] = ipoibEcho(netip.MustParseAddr("192.168.23.2"), netip.MustParseAddr("192.168.23.1"), uint16(k))
				w.send(t, rxeDatagram(t, peer, d.LocalAddr(), id, e.qp.QPN(), payloads[k]))
			}
			f.waitRx(t, d, func(s Stats) bool { return s.RxPackets == n })
			good := 0
			var wc [2 * n]hca.WC
			for _, x := range wc[:e.cq.Poll(wc[:])] {
				if x.Status == hca.StatusSuccess && bytes.Equal(e.buf[x.ID][:x.ByteLen], payloads[good]) && x.SrcQPN == 0x11 {
					good++
				}
			}
			if good != c.wantGood || d.Stats().Dropped(wire.DropBadICRC) != uint64(n-c.wantGood) {
				t.Fatalf("%s: rxe-style datagrams with IDs %d..%d: %d/%d delivered intact, %d bad_icrc; want %d delivered",
					c.name, ids[0], ids[n-1], good, n, d.Stats().Dropped(wire.DropBadICRC), c.wantGood)
			}
			t.Logf("%s: valid ICRC, IDs 64..65535: %d/%d delivered", c.name, good, n)
			before := d.Stats().Dropped(wire.DropBadICRC)
			for k, id := range ids {
				pkt := rxeDatagram(t, peer, d.LocalAddr(), id, e.qp.QPN(), payloads[k])
				pkt[len(pkt)-1-k%4] ^= 1 << (k % 8) // one bit of the ICRC
				w.send(t, pkt)
			}
			f.waitRx(t, d, func(s Stats) bool { return s.RxPackets == 2*n })
			if k := e.cq.Poll(wc[:]); k != 0 || d.Stats().Dropped(wire.DropBadICRC) != before+n {
				t.Fatalf("%s: one ICRC bit flipped: %d delivered, %d more bad_icrc; want 0 and %d", c.name, k, d.Stats().Dropped(wire.DropBadICRC)-before, n)
			}
			t.Logf("%s: one ICRC bit flipped: 0/%d delivered, %d counted bad_icrc", c.name, n, n)
			if q, ok := d.sock.queued(); !c.udpReceive && (!ok || q != 0) {
				t.Fatalf("UDP socket queue holds %d bytes (known %v) while the packet socket receives", q, ok)
			}
		}()
	}
}
