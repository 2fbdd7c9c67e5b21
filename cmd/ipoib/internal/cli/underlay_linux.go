package cli

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/ipoibcm/ipoib/hca/rocev2"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
	"github.com/vishvananda/netlink"
)

// ibMTUs are the IB MTUs 'ipoib up' offers, largest first.
var ibMTUs = [...]int{4096, 2048, 1024}

// underlayLen is the IP packet one RoCEv2 datagram carrying a full
// ibMTU-byte payload needs: IP and UDP headers, BTH, DETH (UD is the
// largest opcode IPoIB sends), pad and ICRC.
func underlayLen(bind netip.Addr, ibMTU int) int {
	ip := wire.IPv6HeaderLen
	if bind.Is4() {
		ip = wire.IPv4HeaderLen
	}
	return ip + wire.UDPHeaderLen + wire.PacketLen(wire.OpUDSendOnly, ibMTU)
}

// routeMTU is the MTU of the route toward dst: the route's own mtu
// attribute if set, else its device's.
func routeMTU(dst netip.Addr) (mtu int, dev string, err error) {
	routes, err := netlink.RouteGet(net.IP(dst.AsSlice()))
	if err != nil {
		return 0, "", fmt.Errorf("route to %v: %w", dst, err)
	}
	if len(routes) == 0 {
		return 0, "", fmt.Errorf("route to %v: none", dst)
	}
	r := routes[0]
	link, err := netlink.LinkByIndex(r.LinkIndex)
	if err != nil {
		return 0, "", fmt.Errorf("route to %v: device %d: %w", dst, r.LinkIndex, err)
	}
	mtu = link.Attrs().MTU
	if r.MTU > 0 {
		mtu = r.MTU
	}
	return mtu, link.Attrs().Name, nil
}

// checkUnderlay refuses an IB MTU the route toward a configured peer
// cannot carry, or with multicast the link of the bind address, where
// multicast leaves. The socket sends with DF, so such datagrams would
// fail with EMSGSIZE (or vanish at a smaller hop) and every large IP
// packet with them: a black hole that ping of small packets does not
// show.
func checkUnderlay(bind netip.Addr, peers []netip.Addr, multicast bool, ibMTU int) error {
	need := underlayLen(bind, ibMTU)
	type hop struct {
		p   netip.Addr
		mtu int
		dev string
	}
	var hops []hop
	for _, p := range peers {
		mtu, dev, err := routeMTU(p)
		if err != nil {
			return err
		}
		hops = append(hops, hop{p, mtu, dev})
	}
	if multicast {
		mtu, dev, err := linkMTU(bind)
		switch {
		case errors.Is(err, errNotLocal):
			// Opening the device says so, as the kernel words it.
		case err != nil:
			return err
		default:
			hops = append(hops, hop{netip.Addr{}, mtu, dev})
		}
	}
	for _, h := range hops {
		p, mtu, dev := h.p, h.mtu, h.dev
		if mtu >= need {
			continue
		}
		fit := "none of 1024, 2048, 4096 fits"
		for _, m := range ibMTUs {
			if underlayLen(bind, m) <= mtu {
				fit = fmt.Sprintf("use --ib-mtu %d", m)
				break
			}
		}
		what := fmt.Sprintf("peer %v: the route", p)
		if !p.IsValid() {
			what = "multicast: the link"
		}
		return fmt.Errorf("%s via %s carries %d-byte packets, --ib-mtu %d needs %d (%s, or raise the MTU of %s to %d)",
			what, dev, mtu, ibMTU, need, fit, dev, need)
	}
	return nil
}

// errNotLocal: no interface holds the bind address.
var errNotLocal = errors.New("not an address of this host")

// linkMTU is the MTU of the interface holding addr: multicast leaves
// there (IP_MULTICAST_IF).
// A link without multicast (a tun device, WireGuard) cannot carry it:
// that is --multicast=off's case, said at start-up rather than found as
// silence.
func linkMTU(addr netip.Addr) (mtu int, dev string, err error) {
	ifc, err := rocev2.BindInterface(addr)
	if err != nil {
		return 0, "", fmt.Errorf("--bind %v: %w: %w", addr, errNotLocal, err)
	}
	if ifc.Flags&(net.FlagMulticast|net.FlagLoopback) == 0 {
		return 0, "", fmt.Errorf("--bind %v is on %s, which has no multicast: use --multicast=off (and --peers)", addr, ifc.Name)
	}
	return ifc.MTU, ifc.Name, nil
}
