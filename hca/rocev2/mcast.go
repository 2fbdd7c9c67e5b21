package rocev2

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// This file is multicast the RoCEv2 way (Config.Multicast): a UD send to
// an MGID goes to the IP group GroupAddr maps it to and the network
// replicates it; AttachMcast joins that group through the kernel and
// DetachMcast leaves it, as rxe does (rxe_mcast.c, rxe_net.c).

// maxGroups bounds the IP groups a device joins: each is a socket and a
// receive goroutine. An attach beyond fails with hca.ErrNoResources.
const maxGroups = 256

// group is one joined IP multicast group: its socket and the QPs attached
// to MGIDs that map to it, with how many of each QP's MGIDs do. Guarded by
// Device.mu; the socket's reader owns the buffer.
type group struct {
	addr     netip.Addr
	conn     *net.UDPConn
	attached map[*qp]int
	closed   bool
}

// attachGroup records q's attachment to mgid and joins its IP group on
// the first attachment; mu held, mgid not yet attached to q.
func (d *Device) attachGroup(q *qp, mgid hca.GID) error {
	if !d.cfg.Multicast {
		return nil
	}
	addr, _ := GroupAddr(mgid, d.local.Addr().Is4())
	g := d.groups[addr]
	if g == nil {
		if len(d.groups) >= maxGroups {
			return fmt.Errorf("rocev2: attach to %v: %d groups joined already: %w", mgid, maxGroups, hca.ErrNoResources)
		}
		conn, err := openGroupSocket(addr, d.local.Port(), d.ifi)
		if err != nil {
			return fmt.Errorf("rocev2: attach to %v: %w", mgid, err)
		}
		g = &group{addr: addr, conn: conn, attached: make(map[*qp]int)}
		d.groups[addr] = g
		d.ctr.mcastJoins.Add(1)
		d.wg.Add(1)
		go d.groupLoop(g)
	}
	g.attached[q]++
	return nil
}

// detachGroup undoes attachGroup and leaves the IP group with its last
// attachment; mu held, mgid attached to q.
func (d *Device) detachGroup(q *qp, mgid hca.GID) error {
	if !d.cfg.Multicast {
		return nil
	}
	addr, _ := GroupAddr(mgid, d.local.Addr().Is4())
	g := d.groups[addr]
	if g == nil {
		return nil
	}
	if g.attached[q]--; g.attached[q] <= 0 {
		delete(g.attached, q)
	}
	if len(g.attached) > 0 {
		return nil
	}
	delete(d.groups, addr)
	d.ctr.mcastLeaves.Add(1)
	return g.leave(d.ifi.Index)
}

// leave drops the membership (the kernel reports the leave to the
// network) and closes the socket, which ends its reader; mu held.
func (g *group) leave(ifindex int) error {
	g.closed = true
	err := groupMembership(g.conn, g.addr, ifindex, false)
	return errors.Join(err, g.conn.Close())
}

// groupLoop receives g's datagrams until its socket closes. Multicast is
// ARP, ND and IP multicast: one datagram per read is plenty.
func (d *Device) groupLoop(g *group) {
	defer d.wg.Done()
	buf := make([]byte, rxBufSize)
	var p wire.Packet
	for {
		n, from, err := g.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			d.cfg.Logger.Debug("rocev2: group receive", "dev", d.cfg.Name, "group", g.addr, "err", err)
			continue
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		d.mu.Lock()
		if d.closed || g.closed {
			d.mu.Unlock()
			return
		}
		d.ctr.rxPackets.Add(1)
		d.ctr.rxBytes.Add(uint64(n))
		switch {
		case !d.allowed(from.Addr()):
			d.ctr.drop(wire.DropNotAllowed)
		case n > d.maxPacket:
			d.ctr.drop(wire.DropTruncated)
			d.warnOversize(from, n)
		default:
			d.receiveGroup(buf[:n], from, g, &p)
		}
		d.unlock()
	}
}

// receiveGroup validates a datagram sent to g's address and delivers it
// to every QP attached to g, never to one that is not. mu held.
func (d *Device) receiveGroup(b []byte, from netip.AddrPort, g *group, p *wire.Packet) {
	if !d.accept(b, from, g.addr, p) {
		return
	}
	if p.BTH.Opcode != wire.OpUDSendOnly || hca.QPN(p.BTH.DestQP) != hca.QPNMulticast {
		// IBA: a packet to a multicast group is a UD send to QP 0xFFFFFF.
		d.ctr.drop(wire.DropBadMcast)
		return
	}
	if len(p.Payload) > int(d.cfg.MTU) {
		d.ctr.dropUD(wire.DropBadLength)
		return
	}
	info := udInfo{srcQPN: hca.QPN(p.DETH.SrcQP), srcGID: hca.GIDFromAddr(from.Addr()), pkey: hca.PKey(p.BTH.PKey)}
	delivered, otherPartition := false, false
	for q := range g.attached {
		if uint32(q.qkey) != p.DETH.QKey || q.state < hca.QPStateRTR || q.state == hca.QPStateError {
			continue
		}
		if !info.pkey.Matches(q.pkey()) {
			otherPartition = true
			continue
		}
		delivered = true
		d.ctr.mcastDelivered.Add(1)
		q.deliverUD(p, &info)
	}
	switch {
	case delivered:
	case otherPartition:
		// Attached, but in another partition (groups of partitions
		// that map to one IPv4 group share it).
		d.ctr.dropUD(wire.DropBadPKey)
	default:
		d.ctr.dropUD(wire.DropNotAttached)
	}
}

// closeGroups leaves every group; mu held, the device closing.
func (d *Device) closeGroups() error {
	var err error
	for addr, g := range d.groups {
		delete(d.groups, addr)
		d.ctr.mcastLeaves.Add(1)
		err = errors.Join(err, g.leave(d.ifi.Index))
	}
	return err
}

// Groups returns the IP multicast groups the device has joined.
func (d *Device) Groups() []netip.Addr {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]netip.Addr, 0, len(d.groups))
	for a := range d.groups {
		out = append(out, a)
	}
	return out
}
