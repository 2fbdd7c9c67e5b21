package tap

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/internal/testutil"
	"github.com/vishvananda/netlink"
)

// hostPort mirrors ipoibcm.HostPort's method set. The real assertion is
// made where the two meet (cmd/ipoib passes a *Device as the Interface's
// Host); this copy keeps tap's tests independent of the engine's build.
type hostPort interface {
	ReadFrames(bufs [][]byte, sizes []int) (int, error)
	WriteFrames(frames [][]byte) (int, error)
	BatchSize() int
	HostMAC() net.HardwareAddr
	SetMTU(mtu int) error
	SetLinkUp(up bool) error
	Close() error
}

var _ hostPort = (*Device)(nil)

var peerMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}

// frameReader runs ReadFrames in a goroutine and hands frames over a
// channel, so a test can wait with a deadline; it ends when the device
// closes.
type frameReader struct {
	frames chan []byte
	done   chan error
}

func startReader(d *Device) *frameReader {
	r := &frameReader{frames: make(chan []byte, 64), done: make(chan error, 1)}
	go func() {
		buf := [][]byte{make([]byte, 65536)}
		sizes := []int{0}
		for {
			n, err := d.ReadFrames(buf, sizes)
			if err != nil {
				close(r.frames)
				r.done <- err
				return
			}
			for i := range n {
				r.frames <- bytes.Clone(buf[i][:sizes[i]])
			}
		}
	}()
	return r
}

// await returns the first frame match accepts; the deadline only bounds a
// failing test.
func (r *frameReader) await(t *testing.T, what string, match func([]byte) bool) []byte {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case f, ok := <-r.frames:
			if !ok {
				t.Fatalf("reader ended while waiting for %s", what)
			}
			if match(f) {
				return f
			}
		case <-deadline:
			t.Fatalf("no %s from the kernel", what)
		}
	}
}

func ethHeader(dst, src net.HardwareAddr, etherType uint16) []byte {
	h := make([]byte, 14)
	copy(h[0:6], dst)
	copy(h[6:12], src)
	binary.BigEndian.PutUint16(h[12:], etherType)
	return h
}

func arpRequest(srcMAC net.HardwareAddr, srcIP, dstIP netip.Addr) []byte {
	f := ethHeader(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, srcMAC, 0x0806)
	f = binary.BigEndian.AppendUint16(f, 1)      // Ethernet
	f = binary.BigEndian.AppendUint16(f, 0x0800) // IPv4
	f = append(f, 6, 4)
	f = binary.BigEndian.AppendUint16(f, 1) // request
	f = append(f, srcMAC...)
	f = append(f, srcIP.AsSlice()...)
	f = append(f, make([]byte, 6)...)
	return append(f, dstIP.AsSlice()...)
}

func icmpEcho(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, id, seq uint16, payload []byte) []byte {
	icmp := []byte{8, 0, 0, 0}
	icmp = binary.BigEndian.AppendUint16(icmp, id)
	icmp = binary.BigEndian.AppendUint16(icmp, seq)
	icmp = append(icmp, payload...)
	binary.BigEndian.PutUint16(icmp[2:], ^testutil.NaiveSum(icmp))
	ip := []byte{0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 1, 0, 0}
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(icmp)))
	ip = append(ip, src.AsSlice()...)
	ip = append(ip, dst.AsSlice()...)
	binary.BigEndian.PutUint16(ip[10:], ^testutil.NaiveSum(ip))
	f := ethHeader(dstMAC, srcMAC, 0x0800)
	f = append(f, ip...)
	return append(f, icmp...)
}

func TestTAPInNetnsTalksToKernel(t *testing.T) {
	requireRoot(t)
	o := testOwner(t)
	ns := createNetns(t, o, "tap")
	hostAddr := netip.MustParsePrefix("10.99.0.1/24")
	peerIP := netip.MustParseAddr("10.99.0.2")

	d, err := Open(Config{Name: "ibt0", Netns: ns, Link: LinkConfig{
		MTU: 9000, Addrs: []netip.Prefix{hostAddr}, Up: true,
	}})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer d.Close()

	// Verify the configuration through netlink in that namespace.
	h, err := ns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName("ibt0")
	if err != nil {
		t.Fatalf("link not in netns: %v", err)
	}
	if got := l.Attrs(); got.MTU != 9000 || got.TxQLen != DefaultTxQueueLen || got.Flags&net.FlagUp == 0 {
		t.Fatalf("link mtu %d txqlen %d flags %v, want 9000 %d up", got.MTU, got.TxQLen, got.Flags, DefaultTxQueueLen)
	}
	if !bytes.Equal(l.Attrs().HardwareAddr, d.HostMAC()) {
		t.Fatalf("HostMAC %v, kernel MAC %v", d.HostMAC(), l.Attrs().HardwareAddr)
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 || addrs[0].IPNet.String() != hostAddr.String() {
		t.Fatalf("addresses %v (%v), want %s", addrs, err, hostAddr)
	}
	if _, err := netlink.LinkByName("ibt0"); err == nil {
		t.Fatal("TAP visible in the root namespace")
	}
	if d.BatchSize() != 1 {
		t.Fatalf("BatchSize %d, want 1", d.BatchSize())
	}

	r := startReader(d)

	// ARP: the kernel answers for its own address.
	if n, err := d.WriteFrames([][]byte{arpRequest(peerMAC, peerIP, hostAddr.Addr())}); n != 1 || err != nil {
		t.Fatalf("write arp: %d, %v", n, err)
	}
	reply := r.await(t, "ARP reply", func(f []byte) bool {
		return len(f) >= 42 && binary.BigEndian.Uint16(f[12:]) == 0x0806 && binary.BigEndian.Uint16(f[20:]) == 2
	})
	if !bytes.Equal(reply[22:28], d.HostMAC()) || !bytes.Equal(reply[28:32], hostAddr.Addr().AsSlice()) {
		t.Fatalf("ARP reply sender %x/%x, want %v/%v", reply[22:28], reply[28:32], d.HostMAC(), hostAddr.Addr())
	}
	if !bytes.Equal(reply[0:6], peerMAC) {
		t.Fatalf("ARP reply to %x, want %v", reply[0:6], peerMAC)
	}

	// ICMP echo to the kernel's address comes back with our payload.
	payload := []byte("ipoib tap echo test")
	echo := icmpEcho(d.HostMAC(), peerMAC, peerIP, hostAddr.Addr(), 0x1234, 7, payload)
	if n, err := d.WriteFrames([][]byte{echo}); n != 1 || err != nil {
		t.Fatalf("write echo: %d, %v", n, err)
	}
	er := r.await(t, "ICMP echo reply", func(f []byte) bool {
		return len(f) >= 42 && binary.BigEndian.Uint16(f[12:]) == 0x0800 && f[23] == 1 && f[34] == 0
	})
	if id, seq := binary.BigEndian.Uint16(er[38:]), binary.BigEndian.Uint16(er[40:]); id != 0x1234 || seq != 7 {
		t.Fatalf("echo reply id %#x seq %d, want 0x1234 7", id, seq)
	}
	if !bytes.Equal(er[42:], payload) {
		t.Fatalf("echo reply payload %q, want %q", er[42:], payload)
	}

	// The HostPort setters act on the kernel link.
	if err := d.SetMTU(1500); err != nil {
		t.Fatalf("SetMTU: %v", err)
	}
	if err := d.SetLinkUp(false); err != nil {
		t.Fatalf("SetLinkUp(false): %v", err)
	}
	l, err = h.LinkByName("ibt0")
	if err != nil {
		t.Fatal(err)
	}
	if l.Attrs().MTU != 1500 || l.Attrs().Flags&net.FlagUp != 0 {
		t.Fatalf("after setters: mtu %d flags %v, want 1500 down", l.Attrs().MTU, l.Attrs().Flags)
	}
	if err := d.SetLinkUp(true); err != nil {
		t.Fatalf("SetLinkUp(true): %v", err)
	}

	// Close unblocks the reader with net.ErrClosed and removes the device.
	if err := d.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := <-r.done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("ReadFrames after Close: %v, want net.ErrClosed", err)
	}
	if _, err := d.WriteFrames([][]byte{echo}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("WriteFrames after Close: %v, want net.ErrClosed", err)
	}
	if err := d.SetMTU(1400); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("SetMTU after Close: %v, want net.ErrClosed", err)
	}
	if _, err := h.LinkByName("ibt0"); err == nil {
		t.Fatal("TAP still exists after Close")
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

func TestReadFramesTruncatesToBuffer(t *testing.T) {
	requireRoot(t)
	o := testOwner(t)
	ns := createNetns(t, o, "trunc")
	hostAddr := netip.MustParsePrefix("10.99.1.1/24")
	peerIP := netip.MustParseAddr("10.99.1.2")
	d, err := Open(Config{Name: "ibt1", Netns: ns, Link: LinkConfig{Addrs: []netip.Prefix{hostAddr}, Up: true}})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer d.Close()
	if _, err := d.WriteFrames([][]byte{arpRequest(peerMAC, peerIP, hostAddr.Addr())}); err != nil {
		t.Fatal(err)
	}
	// Read with a 20-byte buffer until the 42-byte ARP reply arrives cut.
	buf := [][]byte{make([]byte, 20)}
	sizes := []int{0}
	for range 64 {
		n, err := d.ReadFrames(buf, sizes)
		if err != nil || n != 1 {
			t.Fatalf("read: %d, %v", n, err)
		}
		if sizes[0] > 20 {
			t.Fatalf("size %d exceeds the 20-byte buffer", sizes[0])
		}
		if binary.BigEndian.Uint16(buf[0][12:]) == 0x0806 && binary.BigEndian.Uint16(buf[0][18:]) == 0x0604 {
			if sizes[0] != 20 {
				t.Fatalf("truncated ARP reply size %d, want 20", sizes[0])
			}
			return
		}
	}
	t.Fatal("no ARP reply among 64 frames")
}

// linkLocals lists the fe80::/64 addresses of the link.
func linkLocals(t *testing.T, ns *Netns, name string) []netip.Addr {
	t.Helper()
	h, err := ns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	as, err := h.AddrList(l, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.IsLinkLocalUnicast() {
			out = append(out, ip)
		}
	}
	return out
}

// TestLinkLocalReplacesMACDerived: after SetLinkLocal the link carries
// that fe80:: address and not the one the kernel derives from the MAC,
// across the link going down and up again.
func TestLinkLocalReplacesMACDerived(t *testing.T) {
	ll := netip.MustParseAddr("fe80::200:ffff:a63:1")
	ns, d := linkLocalDevice(t, "ll", "ibt2", ll)
	for _, up := range []bool{true, false, true} {
		if err := d.SetLinkUp(up); err != nil {
			t.Fatal(err)
		}
		got := linkLocals(t, ns, "ibt2")
		// Down, the kernel flushes IPv6 addresses; up, ours is back and
		// nothing derived from the MAC came with it.
		if up && (len(got) != 1 || got[0] != ll) || !up && len(got) != 0 {
			t.Fatalf("link up=%t: link-local addresses %v, want %v (MAC %v)", up, got, ll, d.mac)
		}
	}
	if err := d.SetLinkLocal(netip.MustParseAddr("2001:db8::1")); err == nil {
		t.Fatal("a global address accepted as link-local")
	}
}
