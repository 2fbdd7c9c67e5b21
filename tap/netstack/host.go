package netstack

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/ipoibcm/ipoib/offload"
)

// nicID is the only NIC of a Host's stack.
const nicID tcpip.NICID = 1

// Host is an in-process host: a gVisor stack whose one NIC is reached
// through ReadFrames and WriteFrames. It implements ipoibcm.HostPort and
// ipoibcm.OffloadPort.
type Host struct {
	cfg      Config
	stack    *stack.Stack
	ep       *endpoint
	counters counters
}

// New builds a host with its addresses, default routes for IPv4 and IPv6
// and the configured TCP tuning. The link starts up.
func New(cfg Config) (*Host, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("netstack config: %w", err)
	}
	h := &Host{cfg: cfg}
	h.ep = newEndpoint(cfg, &h.counters)
	h.stack = stack.New(stack.Options{
		NetworkProtocols: []stack.NetworkProtocolFactory{
			ipv4.NewProtocolWithOptions(ipv4.Options{IGMP: ipv4.IGMPOptions{Enabled: true}}),
			// DAD stays off (zero DADConfigs): addresses are usable at once,
			// as with the kernel's optimistic DAD on a fresh link.
			ipv6.NewProtocolWithOptions(ipv6.Options{MLD: ipv6.MLDOptions{Enabled: true}}),
			arp.NewProtocol,
		},
		TransportProtocols: []stack.TransportProtocolFactory{
			tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4, icmp.NewProtocol6,
		},
	})
	if err := h.configure(); err != nil {
		h.stack.Close()
		h.stack.Wait()
		return nil, err
	}
	return h, nil
}

func (h *Host) configure() error {
	if err := h.tuneTCP(); err != nil {
		return err
	}
	if err := tcpipErr("create NIC", h.stack.CreateNICWithOptions(nicID, h.ep, stack.NICOptions{QDisc: h.ep})); err != nil {
		return err
	}
	linkLocal := header.LinkLocalAddr(h.ep.mac)
	addrs := []tcpip.AddressWithPrefix{{Address: linkLocal, PrefixLen: 64}}
	for _, p := range h.cfg.Addrs {
		addrs = append(addrs, tcpip.AddressWithPrefix{
			Address:   tcpip.AddrFromSlice(p.Addr().WithZone("").AsSlice()),
			PrefixLen: p.Bits(),
		})
	}
	for _, a := range addrs {
		proto := ipv4.ProtocolNumber
		if a.Address.Len() == header.IPv6AddressSize {
			proto = ipv6.ProtocolNumber
		}
		pa := tcpip.ProtocolAddress{Protocol: proto, AddressWithPrefix: a}
		if err := tcpipErr("add address "+a.String(), h.stack.AddProtocolAddress(nicID, pa, stack.AddressProperties{})); err != nil {
			return err
		}
	}
	// Every destination is on-link: the engine (or Link) is the whole
	// network, and ARP/ND find the neighbour.
	h.stack.SetRouteTable([]tcpip.Route{
		{Destination: header.IPv4EmptySubnet, NIC: nicID},
		{Destination: header.IPv6EmptySubnet, NIC: nicID},
	})
	return nil
}

func (h *Host) tuneTCP() error {
	t := h.cfg.TCP
	sack := tcpip.TCPSACKEnabled(!t.DisableSACK)
	recovery := tcpip.TCPRACKLossDetection
	if t.DisableRACK {
		recovery = 0
	}
	cc := tcpip.CongestionControlOption(t.CongestionControl)
	moderate := tcpip.TCPModerateReceiveBufferOption(true)
	send := tcpip.TCPSendBufferSizeRangeOption{Min: tcp.MinBufferSize, Default: t.BufferDefault, Max: t.BufferMax}
	recv := tcpip.TCPReceiveBufferSizeRangeOption{Min: tcp.MinBufferSize, Default: t.BufferDefault, Max: t.BufferMax}
	opts := []struct {
		name string
		opt  tcpip.SettableTransportProtocolOption
	}{
		{"SACK", &sack}, {"recovery", &recovery}, {"congestion control", &cc},
		{"receive buffer moderation", &moderate}, {"send buffer", &send}, {"receive buffer", &recv},
	}
	if t.MinRTO > 0 {
		minRTO := tcpip.TCPMinRTOOption(t.MinRTO)
		opts = append(opts, struct {
			name string
			opt  tcpip.SettableTransportProtocolOption
		}{"min RTO", &minRTO})
	}
	for _, o := range opts {
		if err := tcpipErr("TCP "+o.name, h.stack.SetTransportProtocolOption(tcp.ProtocolNumber, o.opt)); err != nil {
			return err
		}
	}
	return nil
}

// Stack is the host's gVisor stack, for what the helpers do not cover.
func (h *Host) Stack() *stack.Stack { return h.stack }

// Counters returns a snapshot of the link counters.
func (h *Host) Counters() Counters { return h.counters.snapshot() }

// MTU is the link's current IP MTU.
func (h *Host) MTU() int { return int(h.ep.MTU()) }

// ReadFrames implements ipoibcm.HostPort: it blocks until the stack has sent
// at least one frame, then copies up to len(bufs) frames out. A frame longer
// than its buffer is truncated to it (sizes[i] == len(bufs[i])) and counted.
// After Close it returns an error wrapping net.ErrClosed.
func (h *Host) ReadFrames(bufs [][]byte, sizes []int) (int, error) {
	return h.ep.readFrames(nil, bufs, sizes, nil, offload.Caps{})
}

// ReadFramesContext is ReadFrames that also gives up when ctx is done,
// returning an error wrapping ctx.Err().
func (h *Host) ReadFramesContext(ctx context.Context, bufs [][]byte, sizes []int) (int, error) {
	return h.ep.readFrames(ctx, bufs, sizes, nil, offload.Caps{})
}

// WriteFrames implements ipoibcm.HostPort: it delivers Ethernet frames to
// the stack. Frames that are runts, for another unicast MAC, or of an
// unknown ethertype are dropped and counted; they still count as written.
func (h *Host) WriteFrames(frames [][]byte) (int, error) {
	return h.ep.writeFrames(frames, nil)
}

// BatchSize implements ipoibcm.HostPort.
func (h *Host) BatchSize() int { return h.cfg.BatchSize }

// HostMAC implements ipoibcm.HostPort.
func (h *Host) HostMAC() net.HardwareAddr { return append(net.HardwareAddr(nil), h.cfg.MAC...) }

// SetMTU implements ipoibcm.HostPort. Connections opened afterwards use an
// MSS derived from the new MTU. When the MTU goes down, nothing already
// sent or queued is lost to the change:
//   - TCP segments the stack queued at the old MTU but the reader has not
//     taken yet are cut to the new MTU on their way out (segmenter);
//   - established TCP connections keep their MSS: gVisor fragments their
//     segments to the new MTU (the link gives the fragments unique IP
//     IDs, see fragRenumberer; with GSO, whose super frames gVisor does
//     not fragment, the link cuts them to the new MTU);
//   - a packet-too-big answer reporting an MTU no smaller than the new
//     link MTU (the engine's answer to a frame it read before the change)
//     is dropped, not given to TCP (see isStalePMTU for why).
//
// Anything else queued too big goes out whole, for the engine to answer
// with ICMP frag-needed / packet-too-big.
func (h *Host) SetMTU(mtu int) error {
	if err := checkMTU(mtu); err != nil {
		return fmt.Errorf("netstack set MTU: %w", err)
	}
	if err := h.stack.SetNICMTU(nicID, uint32(mtu)); err != nil {
		return tcpipErr("netstack set MTU", err)
	}
	return nil
}

// SetLinkUp implements ipoibcm.HostPort. Without carrier, frames both ways
// are dropped and counted.
func (h *Host) SetLinkUp(up bool) error { return h.ep.setLinkUp(up) }

// LinkUp reports carrier.
func (h *Host) LinkUp() bool { return h.ep.currentState() == linkUp }

// Close implements ipoibcm.HostPort: it wakes ReadFrames, drops queued
// frames, and stops the stack and all its goroutines before returning.
// Calling it again is a no-op.
func (h *Host) Close() error {
	if !h.ep.shutdown() {
		return nil
	}
	h.stack.Close()
	h.stack.Wait()
	return nil
}

// tcpipErr turns a gVisor error into a Go error with context; nil stays nil.
func tcpipErr(op string, err tcpip.Error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", op, &stackError{err})
}

// stackError wraps a tcpip.Error so errors.As can recover it.
type stackError struct{ err tcpip.Error }

func (e *stackError) Error() string { return e.err.String() }

// Unwrap lets errors.As reach the tcpip.Error.
func (e *stackError) Unwrap() error {
	if err, ok := e.err.(error); ok {
		return err
	}
	return nil
}

// toFullAddress converts ap to a gVisor address on the host's NIC, with the
// matching network protocol.
func toFullAddress(ap netip.AddrPort) (tcpip.FullAddress, tcpip.NetworkProtocolNumber) {
	addr := ap.Addr().Unmap().WithZone("")
	fa := tcpip.FullAddress{NIC: nicID, Port: ap.Port()}
	if addr.IsValid() && !addr.IsUnspecified() {
		fa.Addr = tcpip.AddrFromSlice(addr.AsSlice())
	}
	if addr.Is4() {
		return fa, ipv4.ProtocolNumber
	}
	return fa, ipv6.ProtocolNumber
}
