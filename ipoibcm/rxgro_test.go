package ipoibcm

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
	"github.com/ipoibcm/ipoib/offload"
)

// tcpSegment is the IPv4 packet of one TCP segment of a flow: sequence
// number seq, payload bytes of value seq, the IPv4 ID counting up with
// seq as a sender's does, checksums complete.
func tcpSegment(t *testing.T, seq uint32, payload int) []byte {
	t.Helper()
	f := make([]byte, frame.EthHdrLen+40+payload)
	ip := f[frame.EthHdrLen:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(40+payload))
	binary.BigEndian.PutUint16(ip[4:], uint16(seq/1000))
	ip[6] = 0x40 // DF
	ip[8], ip[9] = 64, 6
	copy(ip[12:16], []byte{10, 0, 0, 5})
	copy(ip[16:20], []byte{10, 0, 0, 9})
	tcp := ip[20:]
	binary.BigEndian.PutUint16(tcp[0:], 40000)
	binary.BigEndian.PutUint16(tcp[2:], 5201)
	binary.BigEndian.PutUint32(tcp[4:], seq)
	binary.BigEndian.PutUint32(tcp[8:], 1)
	tcp[12], tcp[13] = 5<<4, 0x10 // ACK
	binary.BigEndian.PutUint16(tcp[14:], 512)
	for i := range payload {
		tcp[20+i] = byte(seq)
	}
	if _, err := offload.FillChecksums(f, frame.EthHdrLen); err != nil {
		t.Fatal(err)
	}
	return ip
}

// TestGROKeptAcrossExhaustedPolls: a batch of a whole RX budget leaves
// its flow's open chain, and the UD buffers it holds, for the next batch,
// whose segments join it (Linux's GRO lists across polls that used their
// budget); a batch under budget flushes, and so does a poll that finds
// nothing (napi's Complete). Copying and gathering host ports alike get
// one super frame of every segment, where a flush per batch would cut the
// flow in two.
func TestGROKeptAcrossExhaustedPolls(t *testing.T) {
	const budget, mss = 4, 1000
	for _, gather := range []bool{false, true} {
		for _, emptyPoll := range []bool{false, true} {
			mp := newMetaPort(1, allCaps)
			var port HostPort = mp
			if gather {
				port = &gatherPort{metaPort: mp}
			}
			u := newUDBatchOn(t, port, func(c *Config) { c.RXBudget = budget })
			gid := hca.GID{0xfe, 0x80, 15: 0x44}
			for k := range budget {
				u.add(gid, 0x100, frame.EtherTypeIPv4, tcpSegment(t, uint32(k*mss), mss))
			}
			u.run()
			// A gathering chain keeps every segment's buffer; a copying
			// one has copied them into its own.
			wantHeld := 0
			if gather {
				wantHeld = budget
			}
			if n := len(u.ifc.rx.udHeld); n != wantHeld {
				t.Fatalf("gather %v: %d UD buffers held after a whole budget, want %d", gather, n, wantHeld)
			}
			select {
			case f := <-mp.out:
				t.Fatalf("gather %v: a frame of %d bytes reached the host while its chain was open", gather, len(f.b))
			default:
			}
			want := budget
			if emptyPoll {
				// A poll that finds the CQ empty completes, and flushes.
				u.ifc.rxNAPI.Schedule()
			} else {
				u.add(gid, 0x100, frame.EtherTypeIPv4, tcpSegment(t, uint32(budget*mss), mss))
				u.add(gid, 0x100, frame.EtherTypeIPv4, tcpSegment(t, uint32((budget+1)*mss), mss/2))
				u.run()
				want = budget + 2
			}
			var f metaFrame
			select {
			case f = <-mp.out:
			case <-time.After(10 * time.Second):
				t.Fatalf("gather %v, empty poll %v: nothing reached the host", gather, emptyPoll)
			}
			payload := want * mss
			if !emptyPoll {
				payload -= mss / 2
			}
			if got := len(f.b) - frame.EthHdrLen - 40; got != payload || f.m.GSO != offload.GSOTCPv4 || int(f.m.GSOSize) != mss {
				t.Fatalf("gather %v, empty poll %v: first frame carries %d payload bytes, meta %+v; want one super frame of %d", gather, emptyPoll, got, f.m, payload)
			}
			for k := range want {
				seg := f.b[frame.EthHdrLen+40+k*mss:]
				if seg[0] != byte(k*mss) {
					t.Fatalf("gather %v, empty poll %v: segment %d's payload is %#x, want %#x (its buffer reused while held?)", gather, emptyPoll, k, seg[0], byte(k*mss))
				}
			}
			u.ifc.rxNAPI.Sync(func() {})
			if n := len(u.ifc.rx.udHeld); n != 0 {
				t.Fatalf("gather %v, empty poll %v: %d UD buffers still held after the flush", gather, emptyPoll, n)
			}
			if st := u.ifc.Stats().Offloads; st.RxGROFrames != 1 || st.RxGROSegments != uint64(want) {
				t.Fatalf("gather %v, empty poll %v: %d GRO frames of %d segments, want 1 of %d", gather, emptyPoll, st.RxGROFrames, st.RxGROSegments, want)
			}
		}
	}
}
