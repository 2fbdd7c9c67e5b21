package netstack

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// frame builds an Ethernet frame with the given addresses, type and payload.
func frame(dst, src net.HardwareAddr, etherType uint16, payload []byte) []byte {
	f := make([]byte, ethernetHeaderLen+len(payload))
	copy(f[0:6], dst)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:14], etherType)
	copy(f[14:], payload)
	return f
}

func TestWriteFramesFilter(t *testing.T) {
	mac := net.HardwareAddr{0x02, 0, 0, 0, 0, 1}
	peer := net.HardwareAddr{0x02, 0, 0, 0, 0, 2}
	h := newTestHost(t, Config{MAC: mac, Addrs: []netip.Prefix{addrA4}})
	drain(t, h) // MLD reports for the link-local address

	// A valid ARP request for our address from the peer.
	arp := make([]byte, header.ARPSize)
	a := header.ARP(arp)
	a.SetIPv4OverEthernet()
	a.SetOp(header.ARPRequest)
	copy(a.HardwareAddressSender(), peer)
	copy(a.ProtocolAddressSender(), []byte{10, 0, 0, 2})
	copy(a.ProtocolAddressTarget(), addrA4.Addr().AsSlice())
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

	frames := [][]byte{
		frame(bcast, peer, uint16(header.ARPProtocolNumber), arp),       // delivered
		frame(net.HardwareAddr{0x02, 9, 9, 9, 9, 9}, peer, 0x0800, nil), // other host
		{1, 2, 3}, // runt
		frame(mac, peer, 0x88b5, []byte{1, 2, 3, 4}), // unknown ethertype
	}
	n, err := h.WriteFrames(frames)
	if err != nil || n != len(frames) {
		t.Fatalf("WriteFrames = %d, %v", n, err)
	}
	c := h.Counters()
	c.TxPackets, c.TxBytes = 0, 0 // from the drain above
	want := Counters{RxPackets: 1, RxBytes: uint64(len(frames[0])), RxDroppedOtherHost: 1, RxDroppedRunt: 1, RxDroppedEtherType: 1}
	if c != want {
		t.Fatalf("counters = %+v, want %+v", c, want)
	}
	if c.RxDropped() != 3 {
		t.Fatalf("RxDropped = %d, want 3", c.RxDropped())
	}

	// The stack answers the ARP request: one unicast reply to the peer.
	out := drain(t, h)
	if len(out) != 1 {
		t.Fatalf("got %d frames back, want 1 ARP reply", len(out))
	}
	eh, err := parseEthernet(out[0])
	if err != nil {
		t.Fatal(err)
	}
	if eh.proto != header.ARPProtocolNumber || net.HardwareAddr(eh.dst[:]).String() != peer.String() || net.HardwareAddr(eh.src[:]).String() != mac.String() {
		t.Fatalf("reply header %+v", eh)
	}
	reply := header.ARP(out[0][ethernetHeaderLen:])
	if !reply.IsValid() || reply.Op() != header.ARPReply || string(reply.HardwareAddressSender()) != string(mac) {
		t.Fatalf("ARP reply %x", out[0])
	}
}

// sendMulticastUDP makes h's stack emit n UDP datagrams to a multicast
// group, which needs no neighbour resolution.
func sendMulticastUDP(t *testing.T, h *Host, n int) {
	t.Helper()
	c, err := h.DialUDP(netip.MustParseAddrPort("239.9.9.9:9"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range n {
		c.Write([]byte("x")) // errors are the point once the queue is full
	}
}

func TestQueueFullDropsAndCounts(t *testing.T) {
	h := newTestHost(t, Config{Addrs: []netip.Prefix{addrA4}, QueueLen: 2})
	drain(t, h)
	before := h.Counters()
	sendMulticastUDP(t, h, 5)
	queued := drain(t, h)
	c := h.Counters()
	if len(queued) != 2 {
		t.Fatalf("read %d frames, want the queue's 2", len(queued))
	}
	if got := c.TxDroppedQueueFull - before.TxDroppedQueueFull; got != 3 {
		t.Fatalf("TxDroppedQueueFull grew by %d, want 3", got)
	}
}

func TestReadFramesTruncates(t *testing.T) {
	h := newTestHost(t, Config{Addrs: []netip.Prefix{addrA4}})
	drain(t, h)
	sendMulticastUDP(t, h, 1)
	bufs, sizes := [][]byte{make([]byte, 20)}, []int{0}
	n, err := h.ReadFrames(bufs, sizes)
	if err != nil || n != 1 {
		t.Fatalf("ReadFrames = %d, %v", n, err)
	}
	if sizes[0] != 20 {
		t.Fatalf("sizes[0] = %d, want the buffer's 20", sizes[0])
	}
	if h.Counters().TxTruncated != 1 {
		t.Fatalf("TxTruncated = %d, want 1", h.Counters().TxTruncated)
	}
	// The 20 bytes are the frame's head: group MAC 01:00:5e:09:09:09, IPv4.
	if got := net.HardwareAddr(bufs[0][:6]).String(); got != "01:00:5e:09:09:09" {
		t.Fatalf("destination %s", got)
	}
	if binary.BigEndian.Uint16(bufs[0][12:14]) != 0x0800 {
		t.Fatalf("ethertype %x", bufs[0][12:14])
	}
}

func TestReadFramesBatch(t *testing.T) {
	h := newTestHost(t, Config{Addrs: []netip.Prefix{addrA4}, BatchSize: 4})
	drain(t, h)
	sendMulticastUDP(t, h, 6)
	bufs := make([][]byte, 8)
	for i := range bufs {
		bufs[i] = make([]byte, 1514)
	}
	sizes := make([]int, 8)
	n, err := h.ReadFrames(bufs, sizes)
	if err != nil || n != 6 {
		t.Fatalf("ReadFrames = %d, %v; want all 6 in one batch", n, err)
	}
	for i := range n {
		// 14 Ethernet + 20 IPv4 + 8 UDP + 1 byte of payload.
		if sizes[i] != 43 || bufs[i][42] != 'x' {
			t.Fatalf("frame %d: %d bytes %x", i, sizes[i], bufs[i][:sizes[i]])
		}
	}
}

func TestReadFramesContextCancel(t *testing.T) {
	h := newTestHost(t, Config{})
	drain(t, h)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := h.ReadFramesContext(ctx, [][]byte{make([]byte, 100)}, []int{0})
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("ReadFramesContext = %v, want context.Canceled", err)
	}
}

func TestCopyPacketMultiView(t *testing.T) {
	// A packet whose bytes span a header view and two payload views.
	var payload buffer.Buffer
	payload.Append(buffer.NewViewWithData([]byte("hello ")))
	payload.Append(buffer.NewViewWithData([]byte("world")))
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{ReserveHeaderBytes: 32, Payload: payload})
	defer pkt.DecRef()
	copy(pkt.LinkHeader().Push(4), "hdr:")
	dst := make([]byte, 64)
	copied, full := copyPacket(dst, pkt)
	if copied != 15 || full != 15 || string(dst[:copied]) != "hdr:hello world" {
		t.Fatalf("copyPacket = %d/%d %q", copied, full, dst[:copied])
	}
	copied, full = copyPacket(dst[:7], pkt)
	if copied != 7 || full != 15 || string(dst[:7]) != "hdr:hel" {
		t.Fatalf("short copyPacket = %d/%d %q", copied, full, dst[:7])
	}
}

func TestLinkStateString(t *testing.T) {
	for s, want := range map[linkState]string{linkUp: "up", linkDown: "down", linkClosed: "closed", 9: "linkState(9)"} {
		if s.String() != want {
			t.Errorf("%d.String() = %q, want %q", int(s), s.String(), want)
		}
	}
}
