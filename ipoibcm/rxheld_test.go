package ipoibcm

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/internal/packet"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
	"github.com/ipoibcm/ipoib/offload"
)

// countingQP is the UD QP as the RX path's reposts reach it: every
// buffer handed back is recorded, and written over, so that a frame
// still built from it afterwards carries the scribble.
type countingQP struct {
	hca.QP
	bufs   [][]byte
	posted []bool
	double int
}

func (q *countingQP) PostRecv(wrs []hca.RecvWR) (int, error) {
	for _, wr := range wrs {
		k := wrIndex(wr.ID)
		if q.posted[k] {
			q.double++
		}
		q.posted[k] = true
		for j := range q.bufs[k][headroom:] {
			q.bufs[k][headroom+j] = 0xee
		}
	}
	return len(wrs), nil
}

// countUDReposts puts a countingQP in front of u's UD QP, with the whole
// ring posted, for the rest of the test.
func countUDReposts(t *testing.T, u *udBatch) *countingQP {
	t.Helper()
	q := &countingQP{QP: u.ifc.ud.qp, bufs: u.ifc.ud.bufs, posted: make([]bool, len(u.ifc.ud.bufs))}
	for k := range q.posted {
		q.posted[k] = true
	}
	u.ifc.rxNAPI.Sync(func() { u.ifc.ud.qp = q })
	t.Cleanup(func() { u.ifc.rxNAPI.Sync(func() { u.ifc.ud.qp = q.QP }) })
	return q
}

// flowSegment is an IPv4 TCP segment of flow (its source port 40000+flow)
// at seq; each payload byte names its flow and stream offset.
func flowSegment(t *testing.T, flow int, seq uint32, payload int, psh bool) []byte {
	t.Helper()
	f := make([]byte, frame.EthHdrLen+40+payload)
	ip := f[frame.EthHdrLen:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(40+payload))
	ip[6] = 0x40 // DF
	ip[8], ip[9] = 64, 6
	copy(ip[12:16], []byte{10, 0, 0, 5})
	copy(ip[16:20], []byte{10, 0, 0, 9})
	tcp := ip[20:]
	binary.BigEndian.PutUint16(tcp[0:], uint16(40000+flow))
	binary.BigEndian.PutUint16(tcp[2:], 5201)
	binary.BigEndian.PutUint32(tcp[4:], seq)
	binary.BigEndian.PutUint32(tcp[8:], 1)
	tcp[12], tcp[13] = 5<<4, 0x10 // ACK
	if psh {
		tcp[13] |= 0x08
	}
	binary.BigEndian.PutUint16(tcp[14:], 512)
	for i := range payload {
		tcp[20+i] = streamByte(flow, seq+uint32(i))
	}
	if _, err := offload.FillChecksums(f, frame.EthHdrLen); err != nil {
		t.Fatal(err)
	}
	return ip
}

func streamByte(flow int, off uint32) byte { return byte(uint32(flow)*37 + off*7 + off>>8) }

// TestUDHeldBuffersAccounted: over many batches of random sizes (whole
// budgets among them) carrying several TCP flows, UDP packets and ARP
// requests, every UD buffer goes back to the ring exactly once after its
// completion, never while a GRO chain still holds it, and each flow's
// bytes reach the host whole and in order.
func TestUDHeldBuffersAccounted(t *testing.T) {
	const budget, mss, flows, batches = 16, 1000, 3, 400
	for _, gather := range []bool{false, true} {
		mp := newMetaPort(1, allCaps)
		var port HostPort = mp
		if gather {
			port = &gatherPort{metaPort: mp}
		}
		u := newUDBatchOn(t, port, func(c *Config) { c.RXBudget = budget; c.UDRecvQueueSize = 256 })
		ring := len(u.ifc.ud.bufs)
		q := countUDReposts(t, u)

		rng := rand.New(rand.NewPCG(7, 9))
		gid := hca.GID{0xfe, 0x80, 15: 0x44}
		var next [flows]uint32
		var got [flows]uint32 // bytes of each flow the host got in order
		maxHeld := 0
		drain := func() {
			for {
				select {
				case f := <-mp.out:
					ip := f.b[frame.EthHdrLen:]
					if len(ip) < 40 || ip[9] != 6 {
						continue
					}
					tcp := ip[20:]
					fl := int(binary.BigEndian.Uint16(tcp[0:])) - 40000
					seq := binary.BigEndian.Uint32(tcp[4:])
					pl := tcp[20 : binary.BigEndian.Uint16(ip[2:])-20]
					if seq != got[fl] {
						t.Fatalf("gather %v: flow %d: segment at %d reached the host after %d bytes (reordered or lost)", gather, fl, seq, got[fl])
					}
					for i, b := range pl {
						if want := streamByte(fl, seq+uint32(i)); b != want {
							t.Fatalf("gather %v: flow %d: byte %d is %#x, want %#x (buffer reposted while held?)", gather, fl, seq+uint32(i), b, want)
						}
					}
					got[fl] += uint32(len(pl))
				default:
					return
				}
			}
		}
		// take fills the next buffer that the ring has (from the RX
		// path's side: posted), as the fabric would.
		take := func() {
			for !q.posted[u.next%ring] {
				u.next++
			}
			q.posted[u.next%ring] = false
		}
		for range batches {
			n := budget
			if rng.IntN(3) == 0 {
				n = 1 + rng.IntN(budget)
			}
			for range n {
				take()
				switch r := rng.IntN(10); {
				case r == 0:
					u.addIPv4(gid, 0x100, netip.MustParseAddr("10.0.0.5"))
				case r == 1:
					u.addARP(gid, 0x100, netip.MustParseAddr("10.0.0.5"))
				default:
					fl := rng.IntN(flows)
					pl := mss
					psh := rng.IntN(8) == 0
					if psh {
						pl = mss / 2
					}
					u.add(gid, 0x100, frame.EtherTypeIPv4, flowSegment(t, fl, next[fl], pl, psh))
					next[fl] += uint32(pl)
				}
			}
			u.run()
			drain()
			var held, posted int
			u.ifc.rxNAPI.Sync(func() { held = len(u.ifc.rx.udHeld) })
			for _, p := range q.posted {
				if p {
					posted++
				}
			}
			maxHeld = max(maxHeld, held)
			if q.double != 0 {
				t.Fatalf("gather %v: %d UD buffers posted twice", gather, q.double)
			}
			if posted+held != ring {
				t.Fatalf("gather %v: %d UD buffers posted and %d held, of %d", gather, posted, held, ring)
			}
		}
		if gather && maxHeld == 0 {
			t.Fatalf("no batch kept a chain open")
		}
		u.ifc.rxNAPI.Sync(u.ifc.rx.complete)
		drain()
		for fl := range flows {
			if got[fl] != next[fl] {
				t.Fatalf("gather %v: flow %d: host got %d of %d bytes", gather, fl, got[fl], next[fl])
			}
		}
		u.ifc.rxNAPI.Sync(func() {
			if n := len(u.ifc.rx.udHeld); n != 0 {
				t.Fatalf("gather %v: %d UD buffers held after the last flush", gather, n)
			}
		})
	}
}

// TestUDHeldBounded: eight flows of small segments, each chain growing
// over many whole-budget batches toward 64 KiB, keep at most holdMax UD
// buffers out of the ring (two budgets); without the bound a gathering
// GRO held all 4096 of them by the 257th batch, leaving the fabric no
// receive to deliver into.
func TestUDHeldBounded(t *testing.T) {
	const budget, pl, flows = 16, 100, 8
	mp := newMetaPort(1, allCaps)
	u := newUDBatchOn(t, &gatherPort{metaPort: mp}, func(c *Config) { c.RXBudget = budget })
	ring := len(u.ifc.ud.bufs)
	q := countUDReposts(t, u)
	gid := hca.GID{0xfe, 0x80, 15: 0x44}
	var next [flows]uint32
	limit := min(2*budget, ring/2)
	maxHeld := 0
	for b := range 600 {
		for k := range budget {
			fl := (b*budget + k) / 50 % flows
			for tries := 0; !q.posted[u.next%ring]; tries++ {
				if tries > ring {
					t.Fatalf("batch %d: no UD buffer left in the ring", b)
				}
				u.next++
			}
			q.posted[u.next%ring] = false
			u.add(gid, 0x100, frame.EtherTypeIPv4, flowSegment(t, fl, next[fl], pl, false))
			next[fl] += pl
		}
		u.run()
		for len(mp.out) > 0 {
			<-mp.out
		}
		var held int
		u.ifc.rxNAPI.Sync(func() { held = len(u.ifc.rx.udHeld) })
		if held > limit {
			t.Fatalf("batch %d: %d UD buffers held by GRO, want at most %d", b, held, limit)
		}
		maxHeld = max(maxHeld, held)
	}
	if maxHeld == 0 {
		t.Fatal("no batch kept a chain open")
	}
}

// TestUDHeldChainNotOvertaken: a flow's segment that GRO cannot
// coalesce (here an IPv4 first fragment) arriving in the poll after one
// that kept the flow's chain open reaches the host after that chain:
// the batch that carries it flushes with the chain still open when it
// too is a whole budget, and the fragment must not be written first.
func TestUDHeldChainNotOvertaken(t *testing.T) {
	const budget, mss = 16, 1000
	for _, gather := range []bool{false, true} {
		mp := newMetaPort(1, allCaps)
		var port HostPort = mp
		if gather {
			port = &gatherPort{metaPort: mp}
		}
		u := newUDBatchOn(t, port, func(c *Config) { c.RXBudget = budget })
		gid := hca.GID{0xfe, 0x80, 15: 0x44}
		var seq uint32
		for range budget {
			u.add(gid, 0x100, frame.EtherTypeIPv4, flowSegment(t, 0, seq, mss, false))
			seq += mss
		}
		u.run()
		var open int
		u.ifc.rxNAPI.Sync(func() { open = u.ifc.rx.gro.Pending() })
		if open == 0 {
			t.Fatalf("gather %v: the first batch kept no chain open", gather)
		}
		frag := flowSegment(t, 0, seq, mss, false)
		binary.BigEndian.PutUint16(frag[6:], 0x2000) // MF, offset 0
		packet.PutIPv4Checksum(frag[:20])
		u.add(gid, 0x100, frame.EtherTypeIPv4, frag)
		for k := range budget - 1 {
			u.add(gid, 0x100, frame.EtherTypeIPv4, flowSegment(t, 1, uint32(k*mss), mss, false))
		}
		u.run()
		u.ifc.rxNAPI.Sync(u.ifc.rx.complete)
		var seqs []uint32
		for len(mp.out) > 0 {
			f := <-mp.out
			ip := f.b[frame.EthHdrLen:]
			if len(ip) < 40 || ip[9] != 6 || binary.BigEndian.Uint16(ip[20:]) != 40000 {
				continue
			}
			seqs = append(seqs, binary.BigEndian.Uint32(ip[24:]))
		}
		if want := []uint32{0, seq}; !slices.Equal(seqs, want) {
			t.Fatalf("gather %v: flow 0 reached the host at seqs %v, want %v (its chain, then the fragment)", gather, seqs, want)
		}
	}
}
