package ipoibcm

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// Malformed input on both sides is counted per reason and never reaches
// the other side.
func TestMalformedInputCountedAndDropped(t *testing.T) {
	fab := soft.NewFabric(soft.Config{Seed: 8})
	defer fab.Close()
	dev, err := fab.NewDevice("engine")
	if err != nil {
		t.Fatal(err)
	}
	written := make(chan [][]byte, 64)
	port := newMemPort(1, func(f [][]byte) {
		c := make([][]byte, len(f))
		for k := range f {
			c[k] = append([]byte(nil), f[k]...)
		}
		written <- c
	})
	ifc, err := New(Config{Device: dev, Host: port, Mode: ModeConnected, CM: fastCM()})
	if err != nil {
		t.Fatal(err)
	}
	if err := ifc.Start(); err != nil {
		t.Fatal(err)
	}
	defer ifc.Close()

	// Host side.
	eth := func(et uint16, payload []byte) []byte {
		b := make([]byte, frame.EthHdrLen+len(payload))
		frame.PutEthernet(b, frame.EthHeader{Dst: frame.MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, Src: frame.MAC(port.mac), EtherType: et})
		copy(b[frame.EthHdrLen:], payload)
		return b
	}
	vlan := eth(0x8100, make([]byte, 40))
	host := map[string][]byte{
		"tx_truncated":         {1, 2, 3},
		"tx_vlan":              vlan,
		"tx_unknown_ethertype": eth(0x88B5, make([]byte, 40)),
		"tx_bad_arp":           eth(frame.EtherTypeARP, make([]byte, 10)),
		"tx_not_ip":            eth(frame.EtherTypeIPv4, make([]byte, 40)), // version 0
		"tx_oversize":          eth(frame.EtherTypeIPv4, make([]byte, 65536)),
		"tx_unknown_neighbour": unicastIPv4(port.mac),
	}
	for _, f := range host {
		port.in <- f
	}

	// Wire side: raw UD messages from another device to the engine's UD QP.
	rdev, err := fab.NewDevice("raw")
	if err != nil {
		t.Fatal(err)
	}
	cq, err := rdev.CreateCQ(hca.CQConfig{Size: 64})
	if err != nil {
		t.Fatal(err)
	}
	qp, err := rdev.CreateQP(hca.QPConfig{Type: hca.QPTypeUD, SendCQ: cq, RecvCQ: cq, MaxSendWR: 32, MaxRecvWR: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []hca.QPAttr{{State: hca.QPStateInit, QKey: frame.QKeyIPoIB}, {State: hca.QPStateRTR}, {State: hca.QPStateRTS}} {
		if err := qp.Modify(st); err != nil {
			t.Fatal(err)
		}
	}
	ah, err := rdev.CreateAH(dev.Port().GID)
	if err != nil {
		t.Fatal(err)
	}
	encap := func(et uint16, payload []byte) []byte {
		b := make([]byte, 4+len(payload))
		frame.PutEncap(b, et)
		copy(b[4:], payload)
		return b
	}
	badIP := make([]byte, 40)
	badIP[0] = 0x45
	binary.BigEndian.PutUint16(badIP[2:4], 200) // total length beyond the packet
	wire := map[string][]byte{
		"rx_truncated_header":  {0x08},
		"rx_unknown_ethertype": encap(0x88B5, make([]byte, 20)),
		"rx_bad_arp":           encap(frame.EtherTypeARP, make([]byte, 12)),
		"rx_bad_ip":            encap(frame.EtherTypeIPv4, badIP),
	}
	var wrs []hca.SendWR
	for _, m := range wire {
		buf, _ := rdev.Alloc(len(m))
		copy(buf, m)
		wrs = append(wrs, hca.SendWR{ID: 1, Data: buf, AH: ah, RemoteQPN: ifc.HWAddr().QPN(), RemoteQKey: frame.QKeyIPoIB})
	}
	if _, err := qp.PostSend(wrs); err != nil {
		t.Fatal(err)
	}

	deadline := time.Now().Add(10 * time.Second)
	for {
		st := ifc.Stats()
		missing := ""
		for reason := range host {
			if st.Drops[reason] != 1 {
				missing = reason
			}
		}
		for reason := range wire {
			if st.Drops[reason] != 1 {
				missing = reason
			}
		}
		// The Linux counter of a drop is bumped just after its reason, and
		// Stats is not one atomic snapshot: wait for both.
		fed := st.Counters.TxDropped >= uint64(len(host)) && st.Counters.RxDropped >= uint64(len(wire))
		if missing == "" && fed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("drop %q not counted once (%v), or Linux counters not fed: %+v", missing, st.Drops, st.Counters)
		}
		ifc.rxNAPI.Sync(func() {}) // let the pollers catch up, then look again
		ifc.tx.napi.Sync(func() {})
	}
	select {
	case f := <-written:
		t.Fatalf("host got a frame from malformed input: % x", f[0])
	default:
	}
}

// unicastIPv4 is a valid IPv4 frame to a MAC nobody mapped.
func unicastIPv4(src []byte) []byte {
	b := make([]byte, frame.EthHdrLen+28)
	frame.PutEthernet(b, frame.EthHeader{Dst: frame.MAC{0x02, 9, 9, 9, 9, 9}, Src: frame.MAC(src), EtherType: frame.EtherTypeIPv4})
	ip := b[frame.EthHdrLen:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:4], 28)
	ip[8] = 64
	ip[9] = 17
	copy(ip[12:16], []byte{10, 0, 0, 1})
	copy(ip[16:20], []byte{10, 0, 0, 9})
	return b
}
