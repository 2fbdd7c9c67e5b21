package capture

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/ipoibcm"
)

// block is one pcapng block as the tests read it back.
type block struct {
	typ     uint32
	iface   uint32
	data    []byte
	comment string
}

// readPcapng splits a little-endian pcapng file into its blocks: enough
// to check what the writer produced without tshark.
func readPcapng(t *testing.T, b []byte) []block {
	t.Helper()
	var out []block
	for len(b) > 0 {
		if len(b) < 12 {
			t.Fatalf("trailing %d bytes", len(b))
		}
		typ, n := binary.LittleEndian.Uint32(b), int(binary.LittleEndian.Uint32(b[4:]))
		if n < 12 || n%4 != 0 || n > len(b) || binary.LittleEndian.Uint32(b[n-4:]) != uint32(n) {
			t.Fatalf("bad block length %d (of %d left)", n, len(b))
		}
		blk := block{typ: typ}
		body := b[8 : n-4]
		if typ == 6 {
			blk.iface = binary.LittleEndian.Uint32(body)
			capLen := int(binary.LittleEndian.Uint32(body[12:]))
			blk.data = body[20 : 20+capLen]
			opts := body[20+(capLen+3)&^3:]
			for len(opts) >= 4 {
				code, l := binary.LittleEndian.Uint16(opts), int(binary.LittleEndian.Uint16(opts[2:]))
				if code == 0 {
					break
				}
				if code == 1 {
					blk.comment = string(opts[4 : 4+l])
				}
				opts = opts[4+(l+3)&^3:]
			}
		}
		out = append(out, blk)
		b = b[n:]
	}
	return out
}

func gid(k uint32) hca.GID {
	var g hca.GID
	g[0], g[1] = 0xfe, 0x80
	binary.BigEndian.PutUint32(g[12:], k)
	return g
}

func TestFramesCarryValidICRC(t *testing.T) {
	var buf bytes.Buffer
	s, err := NewStream(&buf, StreamConfig{})
	if err != nil {
		t.Fatal(err)
	}
	rc := make([]byte, 10000) // 3 packets at MTU 4096
	for i := range rc {
		rc[i] = byte(i)
	}
	s.Message(&soft.Message{Kind: soft.MessageUD, SrcDev: "h1", SrcGID: gid(1), DstGID: gid(2), SrcQPN: 1, DstQPN: 1, QKey: 0x80010000, PKey: 0xffff, MTU: 4096, Data: make([]byte, 256)})
	s.Message(&soft.Message{Kind: soft.MessageRC, SrcDev: "h1", DstDev: "h2", SrcGID: gid(1), DstGID: gid(2), SrcQPN: 0x20, DstQPN: 0x30, PKey: 0xffff, MTU: 4096, Data: rc})
	s.Message(&soft.Message{Kind: soft.MessageRNRNak, SrcDev: "h2", DstDev: "h1", SrcGID: gid(2), DstGID: gid(1), SrcQPN: 0x30, DstQPN: 0x20, PKey: 0xffff, MTU: 4096})
	s.Event("h2", &ipoibcm.Event{Kind: ipoibcm.EventDrainPosted, At: time.Now(), QPN: 0x30, Peer: gid(1)})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	blocks := readPcapng(t, buf.Bytes())
	var ops []wire.Opcode
	var comments []string
	for _, b := range blocks {
		if b.typ != 6 {
			continue
		}
		if b.iface == ifaceEvents {
			comments = append(comments, b.comment)
			continue
		}
		ip, u, pkt := b.data[:wire.IPv6HeaderLen], b.data[wire.IPv6HeaderLen:wire.IPv6HeaderLen+wire.UDPHeaderLen], b.data[wire.IPv6HeaderLen+wire.UDPHeaderLen:]
		if err := wire.CheckICRC(ip, u, pkt); err != nil {
			t.Fatalf("frame %d: %v", len(ops), err)
		}
		var p wire.Packet
		if err := wire.ParsePacket(pkt, &p); err != nil {
			t.Fatal(err)
		}
		ops = append(ops, p.BTH.Opcode)
	}
	want := []wire.Opcode{wire.OpUDSendOnly, wire.OpRCSendFirst, wire.OpRCSendMiddle, wire.OpRCSendLast, wire.OpRCAck, wire.OpRCAck}
	if fmt.Sprint(ops) != fmt.Sprint(want) {
		t.Fatalf("opcodes %v, want %v", ops, want)
	}
	if len(comments) != 1 || !strings.Contains(comments[0], "h2: drain_posted qpn 0x000030") {
		t.Fatalf("comments %q", comments)
	}
}

func TestFilter(t *testing.T) {
	cm := soft.Message{Kind: soft.MessageUD, SrcDev: "h1", DstDev: "h2", SrcQPN: 1, DstQPN: 1}
	data := soft.Message{Kind: soft.MessageRC, SrcDev: "h2", DstDev: "h3", SrcQPN: 0x40, DstQPN: 0x41}
	for _, c := range []struct {
		f        Filter
		cm, data bool
	}{
		{Filter{}, true, true},
		{Filter{Kind: KindCM}, true, false},
		{Filter{Kind: KindData}, false, true},
		{Filter{Host: "h1"}, true, false},
		{Filter{Host: "h3"}, false, true},
		{Filter{Host: "h2"}, true, true},
		{Filter{QPN: 0x41}, false, true},
	} {
		if c.f.passMessage(&cm) != c.cm || c.f.passMessage(&data) != c.data {
			t.Errorf("%v: cm %v data %v, want %v %v", c.f, c.f.passMessage(&cm), c.f.passMessage(&data), c.cm, c.data)
		}
	}
	ud := wire.AppendPacket(nil, &wire.PacketSpec{BTH: wire.BTH{Opcode: wire.OpUDSendOnly, DestQP: 1}, DETH: wire.DETH{SrcQP: 1}, Payload: make([]byte, 256)})
	rc := wire.AppendPacket(nil, &wire.PacketSpec{BTH: wire.BTH{Opcode: wire.OpRCSendOnly, DestQP: 0x41}, Payload: []byte{8, 0, 0, 0}})
	for _, c := range []struct {
		f      Filter
		cm, rc bool
	}{
		{Filter{}, true, true},
		{Filter{Kind: KindCM}, true, false},
		{Filter{Kind: KindData}, false, true},
		{Filter{QPN: 0x41}, false, true},
		{Filter{Host: "elsewhere"}, true, true}, // a device's capture is of that device
	} {
		if c.f.passDatagram(ud) != c.cm || c.f.passDatagram(rc) != c.rc {
			t.Errorf("datagram %v: cm %v rc %v, want %v %v", c.f, c.f.passDatagram(ud), c.f.passDatagram(rc), c.cm, c.rc)
		}
	}
	e := ipoibcm.Event{Kind: ipoibcm.EventReaped, QPN: 0x41}
	f1, f2, f3 := Filter{Host: "h3", QPN: 0x41}, Filter{Host: "h1"}, Filter{QPN: 7}
	if !f1.passEvent("h3", &e) || f2.passEvent("h3", &e) || f3.passEvent("h3", &e) {
		t.Error("event filter")
	}
}

// slowWriter takes every write only when told, so the stream's queue
// fills; entered closes at the first write that waits.
type slowWriter struct {
	gate    chan struct{}
	entered chan struct{}
	once    sync.Once
}

func (w *slowWriter) Write(b []byte) (int, error) {
	w.once.Do(func() { close(w.entered) })
	<-w.gate
	return len(b), nil
}

// Once the writer is stuck (its file buffer full and the file not taking
// more), the stream queues at most its budget and drops the rest, and
// Message never blocks.
func TestStreamDropsWhenBehindAndSaysSo(t *testing.T) {
	w := &slowWriter{gate: make(chan struct{}), entered: make(chan struct{})}
	const budget = 64 << 10
	s, err := NewStream(w, StreamConfig{Budget: budget})
	if err != nil {
		t.Fatal(err)
	}
	release := sync.OnceFunc(func() { close(w.gate) })
	t.Cleanup(release) // a failed test must not leave the writer stuck
	m := soft.Message{Kind: soft.MessageUD, SrcGID: gid(1), DstGID: gid(2), SrcQPN: 9, DstQPN: 10, Data: make([]byte, 4000)}
	// Until the writer's buffer fills it keeps up, however fast this
	// feeds it; after that only the queue holds what comes.
	for fed := 0; ; fed++ {
		select {
		case <-w.entered:
		default:
			if fed == 100000 {
				t.Fatal("the writer never wrote to the file")
			}
			s.Message(&m)
			continue
		}
		break
	}
	rec0, drop0 := s.Counts()
	for range 1000 {
		s.Message(&m) // never blocks, whatever the writer does
	}
	rec, dropped := s.Counts()
	rec, dropped = rec-rec0, dropped-drop0
	if rec+dropped != 1000 || rec > budget/4000 || dropped < 1000-budget/4000 {
		t.Fatalf("with the writer stuck: recorded %d dropped %d of 1000 with a %d-byte budget", rec, dropped, budget)
	}
	if b := s.Backlog(); b > budget {
		t.Fatalf("backlog %d over the budget %d", b, budget)
	}
	release()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestStreamMaxPackets: MaxPackets counts what the file holds, as
// tcpdump -c does: packet blocks of either interface, so an RC message
// is its frames and ACK, an event one record, and the last message is
// cut at the limit.
func TestStreamMaxPackets(t *testing.T) {
	ud := soft.Message{Kind: soft.MessageUD, SrcGID: gid(1), DstGID: gid(2), SrcQPN: 9, DstQPN: 10, Data: []byte{8, 6, 0, 0}}
	rc := soft.Message{Kind: soft.MessageRC, SrcGID: gid(1), DstGID: gid(2), SrcQPN: 0x20, DstQPN: 0x30, MTU: 4096, Data: make([]byte, 10000)}
	ev := ipoibcm.Event{Kind: ipoibcm.EventReaped, QPN: 0x41}
	for _, tc := range []struct {
		name           string
		max            uint64
		feed           func(s *Stream)
		fabric, events int
	}{
		{"five UD, three kept", 3, func(s *Stream) {
			for range 5 {
				s.Message(&ud)
			}
		}, 3, 0},
		// 3 frames and an ACK, an event, then 2 of the next message's 4.
		{"RC cut at the limit", 7, func(s *Stream) {
			s.Message(&rc)
			s.Event("h1", &ev)
			s.Message(&rc)
			s.Message(&ud)
		}, 6, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			s, err := NewStream(&buf, StreamConfig{MaxPackets: tc.max})
			if err != nil {
				t.Fatal(err)
			}
			tc.feed(s)
			select {
			case <-s.Done():
			case <-time.After(10 * time.Second):
				t.Fatalf("Done not closed with %d packets", tc.max)
			}
			s.Message(&ud) // after Done: not recorded
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			fabric, events := 0, 0
			for _, b := range readPcapng(t, buf.Bytes()) {
				switch {
				case b.typ == 6 && b.iface == ifaceFabric:
					fabric++
				case b.typ == 6:
					events++
				}
			}
			if fabric != tc.fabric || events != tc.events {
				t.Fatalf("file holds %d frames and %d event records, want %d and %d (MaxPackets %d)",
					fabric, events, tc.fabric, tc.events, tc.max)
			}
		})
	}
}

func TestRingKeepsLastAndFreezesAfterTrigger(t *testing.T) {
	g := NewRing(Filter{}, 100, 1<<30)
	m := soft.Message{Kind: soft.MessageUD, SrcGID: gid(1), DstGID: gid(2), SrcQPN: 9, DstQPN: 10}
	for k := range 1000 {
		m.Data = []byte(strconv.Itoa(k))
		g.Message(&m)
	}
	g.Trigger("VIOLATION x")
	for k := range 1000 {
		m.Data = []byte("after" + strconv.Itoa(k))
		g.Message(&m)
	}
	var buf bytes.Buffer
	if _, err := g.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	var first, last string
	var notes []string
	n := 0
	for _, b := range readPcapng(t, buf.Bytes()) {
		if b.typ != 6 {
			continue
		}
		if b.iface == ifaceEvents {
			notes = append(notes, b.comment)
			continue
		}
		payload := string(b.data[wire.IPv6HeaderLen+wire.UDPHeaderLen+wire.BTHLen+wire.DETHLen:])
		payload = strings.TrimRight(payload[:len(payload)-wire.ICRCLen], "\x00")
		if n == 0 {
			first = payload
		}
		last = payload
		n++
	}
	// 100 records: the last 50 before the trigger, its note and 49 after,
	// then frozen.
	if n != 99 || first != "950" || last != "after48" {
		t.Fatalf("%d packets, first %q last %q", n, first, last)
	}
	if len(notes) != 2 || !strings.Contains(notes[0], "older records not kept") || notes[1] != "VIOLATION x" {
		t.Fatalf("notes %q", notes)
	}
}

func TestRingByteBound(t *testing.T) {
	g := NewRing(Filter{}, 1<<20, 1<<20)
	m := soft.Message{Kind: soft.MessageRC, SrcGID: gid(1), DstGID: gid(2), SrcQPN: 9, DstQPN: 10, Data: make([]byte, 64<<10)}
	for range 100 {
		g.Message(&m)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.bytes > 1<<20 || len(g.recs) > 16 || g.evicted == 0 {
		t.Fatalf("%d bytes in %d records, %d evicted", g.bytes, len(g.recs), g.evicted)
	}
}

// rssKiB reads this process's resident set size (and its peak).
func rssKiB(t *testing.T) (cur, peak int) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status: %v", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "VmRSS:":
			cur = v
		case "VmHWM:":
			peak = v
		}
	}
	return cur, peak
}

// rssBoundMiB is the stated bound: a million-packet capture grows the
// resident set by at most this much (the queue's 32 MiB budget, the
// writer's 256 KiB buffer and the garbage collector's headroom).
const rssBoundMiB = 32

// countWriter counts what it is given and keeps none of it.
type countWriter struct{ n int64 }

func (w *countWriter) Write(b []byte) (int, error) { w.n += int64(len(b)); return len(b), nil }

// TestMillionPacketsBoundedRSS records a million UD messages twice: paced
// so the writer keeps up (every one is written), and as fast as the tap
// can be called (the queue fills and records are dropped). Either way the
// resident set stays within rssBoundMiB of where it started.
func TestMillionPacketsBoundedRSS(t *testing.T) {
	if testing.Short() {
		t.Skip("a million packets")
	}
	runtime.GC()
	before, _ := rssKiB(t)
	peak := before
	sample := func() {
		cur, _ := rssKiB(t)
		peak = max(peak, cur)
	}
	m := soft.Message{Kind: soft.MessageUD, SrcDev: "h1", DstDev: "h2", SrcGID: gid(1), DstGID: gid(2), SrcQPN: 0x11, DstQPN: 0x12,
		QKey: 0x0b1b, PKey: 0xffff, MTU: 4096, Data: make([]byte, 64)}
	const n = 1_000_000
	for _, paced := range []bool{true, false} {
		w := &countWriter{}
		s, err := NewStream(w, StreamConfig{})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		for k := range n {
			for paced && s.Backlog() > DefaultBudget/2 {
				runtime.Gosched() // let the writer drain: this phase wants every packet
			}
			s.Message(&m)
			if k%50_000 == 0 {
				sample()
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		sample()
		rec, dropped := s.Counts()
		t.Logf("paced %v: %d messages in %v: %d recorded, %d dropped, %d MiB of pcapng",
			paced, n, time.Since(start).Round(time.Millisecond), rec, dropped, w.n>>20)
		if rec+dropped != n || paced && rec != n || rec == 0 {
			t.Fatalf("recorded %d + dropped %d of %d", rec, dropped, n)
		}
		// Each UD frame: 40 IPv6 + 8 UDP + 12 BTH + 8 DETH + 64 + 4 ICRC, in
		// a 28-byte block with no comment.
		if min := int64(rec) * (136 + 28); w.n < min {
			t.Fatalf("%d bytes written for %d records, want at least %d", w.n, rec, min)
		}
	}
	t.Logf("RSS %d MiB before, peak %d MiB: growth %d MiB, bound %d MiB", before>>10, peak>>10, (peak-before)>>10, rssBoundMiB)
	if raceEnabled {
		t.Log("race detector on: its shadow memory makes RSS no measure of the capture; bound not checked")
		return
	}
	if growth := (peak - before) >> 10; growth > rssBoundMiB {
		t.Fatalf("RSS grew %d MiB, bound %d MiB", growth, rssBoundMiB)
	}
}

// TestTapNeverDropsTraffic: a capture that drops records (its writer is
// stuck) leaves every UD message of the fabric delivered.
func TestTapNeverDropsTraffic(t *testing.T) {
	var mux Mux
	fab := soft.NewFabric(soft.Config{Seed: 1, Tap: &mux})
	defer fab.Close()
	w := &slowWriter{gate: make(chan struct{}), entered: make(chan struct{})}
	s, err := NewStream(w, StreamConfig{Budget: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	detach := mux.Attach(s)
	const n = 2000
	delivered := udFlood(t, fab, n)
	detach()
	rec, dropped := s.Counts()
	close(w.gate)
	s.Close()
	if delivered != n || dropped == 0 || rec+dropped != n {
		t.Fatalf("%d of %d delivered; capture recorded %d dropped %d", delivered, n, rec, dropped)
	}
}

// udFlood sends n UD messages from one soft device to another, one at a
// time with a receive posted for each, and returns how many arrived.
func udFlood(t *testing.T, fab *soft.Fabric, n int) int {
	t.Helper()
	var qps [2]hca.QP
	var cqs [2]hca.CQ
	var devs [2]*soft.Device
	for k := range 2 {
		dev, err := fab.NewDevice(fmt.Sprintf("flood%d", k))
		devs[k] = dev
		if err != nil {
			t.Fatal(err)
		}
		cq, err := dev.CreateCQ(hca.CQConfig{Size: 64})
		if err != nil {
			t.Fatal(err)
		}
		qp, err := dev.CreateQP(hca.QPConfig{Type: hca.QPTypeUD, SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 16})
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range []hca.QPState{hca.QPStateInit, hca.QPStateRTR, hca.QPStateRTS} {
			if err := qp.Modify(hca.QPAttr{State: st, QKey: 0x1234}); err != nil {
				t.Fatal(err)
			}
		}
		qps[k], cqs[k] = qp, cq
	}
	ah, err := devs[0].CreateAH(devs[1].Port().GID)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	data := make([]byte, 1000)
	wcs := make([]hca.WC, 16)
	got := 0
	for k := range n {
		if _, err := qps[1].PostRecv([]hca.RecvWR{{ID: uint64(k), Buf: buf}}); err != nil {
			t.Fatal(err)
		}
		if _, err := qps[0].PostSend([]hca.SendWR{{ID: uint64(k), Data: data, AH: ah, RemoteQPN: qps[1].QPN(), RemoteQKey: 0x1234}}); err != nil {
			t.Fatal(err)
		}
		for done := false; !done; {
			for _, wc := range wcs[:cqs[1].Poll(wcs)] {
				if wc.Opcode == hca.WCRecv && wc.Status == hca.StatusSuccess {
					got++
					done = true
				}
			}
			cqs[0].Poll(wcs) // send completions
		}
	}
	return got
}
