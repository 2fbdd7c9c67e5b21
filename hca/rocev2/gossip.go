package rocev2

import (
	crand "crypto/rand"
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// This file spreads the head-end replication set on a fabric without
// multicast (Config.Gossip): a device that knows one member comes to know
// every member, and every member comes to know it, so a late joiner
// converges. The messages are membership MADs (wire/member.go) to QP 1.
//
// A device asks a host for its member list (a Get, "hello") when it
// learns of the host from a configured peer or from another member's
// list, and once per gossipInterval asks a member picked at random (anti-
// entropy: a lost message or a restarted host is caught up). The answer
// (a GetResp) carries one page of the responder's members; the asker
// pages on to the end of the list. The responder learns the asker from
// the request itself (a host heard from joins, as before), so asking is
// also announcing.
//
// No amplification: a Get, which any source inside Config.Allow can send,
// is answered with exactly one GetResp of the same size. A GetResp is
// accepted only from the address a Get with its transaction ID went to
// (a return-routability check: an off-path spoofer cannot feed lists),
// and the Gets it triggers leave through a token bucket (gossipRate,
// gossipBurst) from a queue bounded by Config.MaxMembers. Learned
// addresses obey Config.Allow and Config.MaxMembers like hosts heard
// from.

const (
	// gossipRate and gossipBurst bound the Gets a device sends: a new
	// host learning a 1024-member fabric reaches all of it in about 5 s.
	gossipRate  = 200 // per second
	gossipBurst = 64
	// gossipTick paces the token bucket and the pending Gets' expiry.
	gossipTick = 50 * time.Millisecond
	// gossipInterval is the anti-entropy period; getTimeout is how long
	// a Get waits for its answer before the host may be asked again.
	gossipInterval = time.Second
	getTimeout     = time.Second
)

// gossip is a device's membership-spreading state; guarded by Device.mu.
type gossip struct {
	pending map[netip.Addr]pendingGet
	queue   []netip.Addr // hosts to ask, waiting for tokens
	queued  map[netip.Addr]struct{}
	tokens  float64
	last    time.Time // of the last refill
	nextAE  time.Time // of the next anti-entropy Get
	rng     *rand.Rand
	mad     wire.MemberMAD // parse scratch
	page    []netip.Addr   // encode scratch
}

// pendingGet is a Get awaiting its GetResp.
type pendingGet struct {
	tid    uint64
	offset uint32
	sent   time.Time
}

func newGossip(now time.Time) *gossip {
	// Transaction IDs are the return-routability check: unpredictable.
	var seed [32]byte
	_, _ = crand.Read(seed[:]) // never fails on Linux
	return &gossip{
		pending: make(map[netip.Addr]pendingGet),
		queued:  make(map[netip.Addr]struct{}),
		tokens:  gossipBurst,
		last:    now,
		nextAE:  now.Add(gossipInterval),
		rng:     rand.New(rand.NewChaCha8(seed)),
		mad:     wire.MemberMAD{Addrs: make([]netip.Addr, 0, wire.MaxMemberAddrs(false))},
	}
}

// askHost queues a Get for a's members: sent at once while tokens last,
// else when the bucket refills. mu held.
func (d *Device) askHost(a netip.Addr, now time.Time) {
	g := d.gossip
	if a == d.local.Addr() {
		return
	}
	if _, ok := g.queued[a]; ok {
		return
	}
	if p, ok := g.pending[a]; ok && now.Sub(p.sent) < getTimeout {
		return
	}
	if g.tokens >= 1 && len(g.queue) == 0 {
		g.tokens--
		d.sendGet(a, 0, now)
		return
	}
	if len(g.queue) >= d.cfg.MaxMembers {
		d.ctr.gossipDropped.Add(1)
		return
	}
	g.queued[a] = struct{}{}
	g.queue = append(g.queue, a)
}

// sendGet asks a for its members from index offset; mu held.
func (d *Device) sendGet(a netip.Addr, offset uint32, now time.Time) {
	g := d.gossip
	tid := g.rng.Uint64()
	g.pending[a] = pendingGet{tid: tid, offset: offset, sent: now}
	d.ctr.gossipRequests.Add(1)
	d.sendMemberMAD(a, &wire.MemberMAD{Method: wire.MemberGet, TID: tid, Offset: offset, V6: !d.local.Addr().Is4()})
}

// sendMemberMAD sends m to QP 1 of a, from the fabric port; mu held.
func (d *Device) sendMemberMAD(a netip.Addr, m *wire.MemberMAD) {
	buf := d.getBuf()
	spec := wire.PacketSpec{
		BTH:  wire.BTH{Opcode: wire.OpUDSendOnly, PKey: uint16(d.pkeyAt(0)), DestQP: uint32(hca.QPNGSI)},
		DETH: wire.DETH{QKey: uint32(hca.QKeyGSI), SrcQP: uint32(hca.QPNGSI)},
	}
	h := wire.EncodeHeaders(buf, &spec, wire.MemberMADLen)
	n := wire.PutMemberMAD(buf[h:], m) // a multiple of 4: no pad
	d.queuePacket(nil, a, buf[:h+n+wire.ICRCLen])
}

// receiveMemberMAD answers a Get or takes in the members of a GetResp
// from; mu held.
func (d *Device) receiveMemberMAD(p *wire.Packet, from netip.Addr) {
	g := d.gossip
	m := &g.mad
	if p.DETH.QKey != uint32(hca.QKeyGSI) || wire.ParseMemberMAD(p.Payload, m) != nil || m.V6 == d.local.Addr().Is4() {
		d.ctr.gossipDropped.Add(1)
		return
	}
	now := time.Now()
	if m.Method == wire.MemberGet {
		// One answer per request, of the request's size.
		end := min(int(m.Offset)+wire.MaxMemberAddrs(m.V6), len(d.members))
		g.page = g.page[:0]
		if int(m.Offset) < end {
			g.page = append(g.page, d.members[m.Offset:end]...)
		}
		d.ctr.gossipReplies.Add(1)
		d.sendMemberMAD(from, &wire.MemberMAD{Method: wire.MemberGetResp, TID: m.TID, Offset: m.Offset,
			Total: uint16(min(len(d.members), 0xFFFF)), V6: m.V6, Addrs: g.page})
		return
	}
	if pg, ok := g.pending[from]; !ok || pg.tid != m.TID || pg.offset != m.Offset {
		// Unsolicited, stale, or not the page asked for (which would
		// keep us paging in place).
		d.ctr.gossipDropped.Add(1)
		return
	}
	delete(g.pending, from)
	for _, a := range m.Addrs {
		a = a.Unmap()
		if !a.IsValid() || a == d.local.Addr() || a.Is4() != d.local.Addr().Is4() || !a.IsGlobalUnicast() && !a.IsLoopback() || !d.allowed(a) {
			continue
		}
		if _, known := d.memberSet[a]; known {
			continue
		}
		d.addMember(a)
		if _, added := d.memberSet[a]; added {
			d.ctr.gossipLearned.Add(1)
			d.askHost(a, now)
		}
	}
	if next := int(m.Offset) + len(m.Addrs); len(m.Addrs) > 0 && next < int(m.Total) && next < d.cfg.MaxMembers {
		d.sendGet(from, uint32(next), now)
	}
}

// gossipLoop refills the token bucket, sends queued Gets, expires
// unanswered ones and asks a random member now and then.
func (d *Device) gossipLoop() {
	defer d.wg.Done()
	t := time.NewTicker(gossipTick)
	defer t.Stop()
	for {
		select {
		case <-d.done:
			return
		case now := <-t.C:
			d.mu.Lock()
			if d.closed {
				d.mu.Unlock()
				return
			}
			d.gossipTick(now)
			d.unlock()
		}
	}
}

// gossipTick is one round of gossipLoop; mu held.
func (d *Device) gossipTick(now time.Time) {
	g := d.gossip
	g.tokens = min(gossipBurst, g.tokens+now.Sub(g.last).Seconds()*gossipRate)
	g.last = now
	for len(g.queue) > 0 && g.tokens >= 1 {
		a := g.queue[0]
		g.queue = g.queue[1:]
		delete(g.queued, a)
		g.tokens--
		d.sendGet(a, 0, now)
	}
	for a, p := range g.pending {
		if now.Sub(p.sent) >= getTimeout {
			delete(g.pending, a)
		}
	}
	if now.Before(g.nextAE) {
		return
	}
	g.nextAE = now.Add(gossipInterval)
	if len(d.members) > 1 {
		// members[0] is this device.
		d.askHost(d.members[1+g.rng.IntN(len(d.members)-1)], now)
	}
}
