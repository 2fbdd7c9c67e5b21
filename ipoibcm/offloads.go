package ipoibcm

import (
	"log/slog"
	"sync/atomic"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
	"github.com/ipoibcm/ipoib/offload"
	"github.com/ipoibcm/ipoib/offload/gro"
)

// offloadPath is what the Interface knows about the offloads on both of
// its sides: the host port's (super frames and partial checksums in, and
// what it accepts out) and the HCA's (UD LSO, IP checksum). Set in New,
// read-only afterwards, except the advertised set, which follows the mode
// switch.
type offloadPath struct {
	port OffloadPort  // nil: a plain HostPort, complete MTU-sized frames only
	dev  hca.Offloads // the HCA's, from Limits
	host offload.Caps // what the host accepts from us (HostOffloads)
	// advertised is what SetOffloads put in force: what the host may hand
	// us unfinished (packed by packCaps).
	advertised atomic.Uint32
	// segReserve is the send credits the host reader keeps free per frame
	// it reads when super frames can only be cut in software (an HCA
	// without LSO): a TAP's super frame is at most maxSoftSegments frames.
	// 0 with LSO.
	segReserve int
	ctr        offloadCounters
}

// maxSoftSegments is the most frames a host's super frame is cut into in
// software before the engine waits for credits: the kernel TAP caps its
// super frames at 64 segments (tap.VnetMaxSegments, gso_max_segs). One
// with more is still cut when the credits happen to be there, and dropped
// (tx_gso_no_room) when not.
const maxSoftSegments = 64

// offloadCounters count the offload work, per work request or frame.
type offloadCounters struct {
	txGSOFrames, txLSOWRs, txLSOPackets     atomic.Uint64
	txCsumHW, txCsumSW                      atomic.Uint64
	txSWSegmented, txSWSegments             atomic.Uint64
	rxCsumOK, rxCsumPartial, rxCsumComplete atomic.Uint64
}

func (o *offloadPath) init(host HostPort, dev hca.Device, sendq int) {
	o.dev = dev.Limits().Offloads
	if p, ok := host.(OffloadPort); ok {
		o.port = p
		o.host = p.HostOffloads()
		if o.dev.UDLSOMaxSize == 0 {
			o.segReserve = min(maxSoftSegments, sendq/2)
		}
	}
}

// modeCaps is what the Interface offers the host in mode m (what Linux's
// ipoib_fix_features leaves on). Datagram mode: partial checksums always
// (the HCA fills them, or we do, at 18 GB/s, cheaper than the host
// stack's pass over the payload before the copy), and TCP/UDP super
// frames when the HCA has UD LSO (IB_DEVICE_UD_TSO → NETIF_F_TSO): it
// cuts them into MTU-sized packets, one work request each. Connected
// mode: checksums only; with a 65520-byte MTU a 64 KiB super frame is
// one segment anyway, and RC has no LSO (docs/offloads.md, "Decisions").
func (o *offloadPath) modeCaps(m Mode) offload.Caps {
	c := offload.Caps{Csum: true}
	if m == ModeDatagram && o.dev.UDLSOMaxSize > 0 {
		c.TSO4, c.TSO6, c.USO = true, true, true
	}
	return c
}

// advertise tells the host port what it may hand us in mode m.
func (o *offloadPath) advertise(m Mode, log *slog.Logger) {
	if o.port == nil {
		return
	}
	got, err := o.port.SetOffloads(o.modeCaps(m))
	if err != nil {
		log.Warn("host SetOffloads", "mode", m, "err", err)
	}
	o.advertised.Store(packCaps(got))
}

func packCaps(c offload.Caps) uint32 {
	var v uint32
	for k, b := range []bool{c.Csum, c.TSO4, c.TSO6, c.USO} {
		if b {
			v |= 1 << k
		}
	}
	return v
}

func unpackCaps(v uint32) offload.Caps {
	return offload.Caps{Csum: v&1 != 0, TSO4: v&2 != 0, TSO6: v&4 != 0, USO: v&8 != 0}
}

// sendOffload is the offload part of one send work request.
type sendOffload struct {
	flags hca.SendFlags
	mss   int // UD LSO: payload bytes per packet
	segs  int // packets an LSO WR becomes (counted at post)
}

// txMeta is a host frame's offload metadata after checkTxMeta: Meta as
// the host gave it, and the frame's headers where Meta needs them.
type txMeta struct {
	m  offload.Meta
	hd offload.Headers // valid when hwCsum, which every accepted super frame has
	// hwCsum: the partial checksum is a TCP/UDP checksum where an HCA
	// finds it (SendIPCsum can do it); otherwise only software can.
	hwCsum bool
}

// gso reports whether the frame is a super frame.
func (t *txMeta) gso() bool { return t.m.GSO != offload.GSONone }

// segIPLen is the IP length of the largest segment of a super frame.
func (t *txMeta) segIPLen() int { return t.hd.End - frame.EthHdrLen + int(t.m.GSOSize) }

// checkTxMeta checks a host frame's Meta against the frame, as the TAP
// checks the virtio header (tap.VnetHdr.Validate) but for any
// OffloadPort: a Meta that lies is a counted drop (tx_bad_offload) before
// anything trusts it. A DataValid from the host means nothing on TX and
// is ignored.
func checkTxMeta(f []byte, m offload.Meta) (txMeta, bool) {
	t := txMeta{m: m}
	t.m.DataValid = false
	if m.NeedsCsum {
		start, off := int(m.CsumStart), int(m.CsumOffset)
		if start < frame.EthHdrLen || start+off+2 > len(f) {
			return t, false
		}
	}
	hd, err := offload.Parse(f, frame.EthHdrLen)
	parsed := err == nil && hd.Len == len(f)
	if m.NeedsCsum && parsed && int(m.CsumStart) == hd.L4 && int(m.CsumOffset) == hd.CsumOffset() {
		t.hwCsum, t.hd = true, hd
	}
	switch m.GSO {
	case offload.GSONone:
		t.m.GSOSize, t.m.ECN = 0, false
		return t, true
	case offload.GSOTCPv4, offload.GSOTCPv6:
		if !parsed || hd.Proto != offload.ProtoTCP || hd.IPv6 != (m.GSO == offload.GSOTCPv6) {
			return t, false
		}
	case offload.GSOUDPL4:
		if !parsed || hd.Proto != offload.ProtoUDP {
			return t, false
		}
	default:
		return t, false
	}
	// A super frame always carries a partial checksum (the segments'
	// checksums are made from it) at its TCP/UDP header.
	if m.GSOSize == 0 || !t.hwCsum {
		return t, false
	}
	return t, true
}

// finishCsum completes a partial checksum in software: for a send the
// HCA cannot checksum, or one about to be parked or segmented.
func (o *offloadPath) finishCsum(f []byte, t *txMeta) {
	if !t.m.NeedsCsum {
		return
	}
	offload.CompletePartial(f, int(t.m.CsumStart), int(t.m.CsumOffset))
	t.m.NeedsCsum, t.hwCsum = false, false
	o.ctr.txCsumSW.Add(1)
}

// csumOffload is the send flag for a plain (non-GSO) frame: SendIPCsum
// when the HCA can fill its partial checksum, else the checksum is
// completed here.
func (o *offloadPath) csumOffload(f []byte, t *txMeta) sendOffload {
	if !t.m.NeedsCsum {
		return sendOffload{}
	}
	if t.hwCsum && o.dev.IPCsum {
		return sendOffload{flags: hca.SendIPCsum}
	}
	o.finishCsum(f, t)
	return sendOffload{}
}

// rxMeta maps a receive completion's offload verdict onto the Ethernet
// frame for the host: WCIPCsumOK → DataValid (CHECKSUM_UNNECESSARY),
// WCCsumPartial → NeedsCsum at the TCP/UDP checksum (offsets count the
// Ethernet header), passed on only when the host takes partial checksums
// and completed here otherwise. hd and l4 are offload.ReadHeaders'
// reading of f at the Ethernet header's end, which the RX path took for
// its own checks (rxPath.deliverIP).
func (o *offloadPath) rxMeta(f []byte, flags hca.WCFlags, hd *offload.Headers, l4 bool) offload.Meta {
	switch {
	case flags&hca.WCCsumPartial != 0:
		if !l4 {
			return offload.Meta{}
		}
		if o.port != nil && o.host.Csum {
			o.ctr.rxCsumPartial.Add(1)
			return offload.Meta{NeedsCsum: true, CsumStart: uint16(hd.L4), CsumOffset: uint16(hd.CsumOffset())}
		}
		offload.CompletePartial(f[:hd.Len], hd.L4, hd.CsumOffset())
		o.ctr.rxCsumComplete.Add(1)
	case flags&hca.WCIPCsumOK != 0:
		o.ctr.rxCsumOK.Add(1)
		if o.port != nil {
			return offload.Meta{DataValid: true}
		}
	}
	return offload.Meta{}
}

// OffloadStats count the offload work of an Interface.
type OffloadStats struct {
	// HostPort: the host port carries offload metadata (an OffloadPort).
	HostPort bool `json:"host_port"`
	// Advertised is what the host may hand us unfinished in this mode.
	Advertised offload.Caps `json:"advertised"`
	// Device is the HCA's.
	DeviceIPCsum     bool `json:"device_ip_csum"`
	DeviceLSOMaxSize int  `json:"device_lso_max_size"`

	TxGSOFrames   uint64 `json:"tx_gso_frames"`     // super frames from the host
	TxLSOWRs      uint64 `json:"tx_lso_wrs"`        // UD LSO work requests posted
	TxLSOPackets  uint64 `json:"tx_lso_packets"`    // packets those carry
	TxCsumHW      uint64 `json:"tx_csum_hw"`        // sends posted with SendIPCsum
	TxCsumSW      uint64 `json:"tx_csum_sw"`        // partial checksums completed in software
	TxSWSegmented uint64 `json:"tx_sw_segmented"`   // super frames cut in software
	TxSWSegments  uint64 `json:"tx_sw_segments"`    // frames they became
	RxCsumOK      uint64 `json:"rx_csum_ok"`        // receives the HCA verified (DataValid)
	RxCsumPartial uint64 `json:"rx_csum_partial"`   // partial checksums passed to the host
	RxCsumDone    uint64 `json:"rx_csum_completed"` // partial checksums completed for the host
	RxGROFrames   uint64 `json:"rx_gro_frames"`     // coalesced frames written to the host
	RxGROSegments uint64 `json:"rx_gro_segments"`   // received packets they hold
	RxGROBadCsum  uint64 `json:"rx_gro_bad_csum"`   // segments GRO verified in software and found bad: passed on unmerged, for the host to drop
}

// stats is the offloads' part of Stats; coalescer is the RX path's GRO
// (nil when the host takes no super frames).
func (o *offloadPath) stats(coalescer *gro.Coalescer) OffloadStats {
	c := &o.ctr
	var g gro.Stats
	if coalescer != nil {
		g = coalescer.Stats()
	}
	return OffloadStats{
		HostPort: o.port != nil, Advertised: unpackCaps(o.advertised.Load()),
		DeviceIPCsum: o.dev.IPCsum, DeviceLSOMaxSize: o.dev.UDLSOMaxSize,
		TxGSOFrames: c.txGSOFrames.Load(), TxLSOWRs: c.txLSOWRs.Load(), TxLSOPackets: c.txLSOPackets.Load(),
		TxCsumHW: c.txCsumHW.Load(), TxCsumSW: c.txCsumSW.Load(),
		TxSWSegmented: c.txSWSegmented.Load(), TxSWSegments: c.txSWSegments.Load(),
		RxCsumOK: c.rxCsumOK.Load(), RxCsumPartial: c.rxCsumPartial.Load(), RxCsumDone: c.rxCsumComplete.Load(),
		RxGROFrames: g.Frames, RxGROSegments: g.Segments, RxGROBadCsum: g.BadCsum,
	}
}
