package ipoibcm

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/offload"
)

// fuzzMeta decodes 9 fuzz bytes into the Meta a host port could claim.
func fuzzMeta(b []byte) offload.Meta {
	var m offload.Meta
	if len(b) < 9 {
		return m
	}
	m.GSO = offload.GSO(b[0] & 7)
	m.ECN = b[1]&1 != 0
	m.NeedsCsum = b[1]&2 != 0
	m.DataValid = b[1]&4 != 0
	m.GSOSize = binary.BigEndian.Uint16(b[2:])
	m.CsumStart = binary.BigEndian.Uint16(b[4:])
	m.CsumOffset = binary.BigEndian.Uint16(b[6:])
	return m
}

// FuzzEngineInput feeds arbitrary bytes to both translation paths of a
// running Interface: as a host frame (txFrameLocked) and as a UD message
// from the wire (handleRX), with whatever offload metadata the host port
// claims for the frame and whatever checksum verdict the HCA gives the
// message. Neither may panic; everything is either handled or counted.
func FuzzEngineInput(f *testing.F) {
	fab := soft.NewFabric(soft.Config{Seed: 9})
	defer fab.Close()
	dev, err := fab.NewDevice("fuzz")
	if err != nil {
		f.Fatal(err)
	}
	port := newMemPort(2, nil)
	ifc, err := New(Config{Device: dev, Host: port, Mode: ModeConnected, CM: fastCM()})
	if err != nil {
		f.Fatal(err)
	}
	if err := ifc.Start(); err != nil {
		f.Fatal(err)
	}
	defer ifc.Close()
	f.Add(unicastIPv4(port.mac), []byte{0x08, 0, 0, 0, 0x45}, []byte{}, byte(0))
	f.Add(buildIGMPv2([4]byte{239, 0, 0, 1}), []byte{0x08, 0x06, 0, 0, 0, 32}, []byte{1, 2, 0, 100, 0, 34, 0, 16, 0}, byte(1))
	f.Add(unicastIPv4(port.mac), []byte{0x08, 0, 0, 0, 0x45}, []byte{5, 2, 0, 1, 0, 34, 0, 6, 0}, byte(2))
	peer := hca.GID{0xfe, 0x80, 15: 0x77}
	r := newHostReader(ifc, ifc.queues[0])
	f.Fuzz(func(tt *testing.T, host, wire, meta []byte, wcFlags byte) {
		var idx [1]int
		if ifc.tx.pool.take(idx[:]) == 1 {
			n := copy(ifc.tx.pool.bufs[idx[0]], host)
			r.t.replies = r.t.replies[:0]
			used := r.frame(idx[0], n, fuzzMeta(meta), time.Now())
			if !used {
				ifc.tx.pool.put1(idx[0])
			}
		}
		b := ifc.ud.bufs[0]
		n := copy(b[headroom:], wire)
		wcs := []hca.WC{{ID: wrID(wrKindUDRecv, 0), Opcode: hca.WCRecv, ByteLen: n, SrcQPN: 0x77, SrcGID: peer, Context: &udQP{}, Flags: hca.WCFlags(wcFlags & 3)}}
		ifc.rxNAPI.Sync(func() { ifc.rx.handleRX(wcs) })
	})
}
