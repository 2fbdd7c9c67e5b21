package cm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipoibcm/ipoib/internal/testutil"
)

// roceUDFrame wraps a MAD in Ethernet / IPv4 / UDP 4791 / BTH (UD
// SEND_ONLY to QP1) / DETH (Q_Key 0x80010000, source QP1) / ICRC, as a
// RoCEv2 NIC would put it on the wire. A private builder so this test does
// not depend on package hca/rocev2.
func roceUDFrame(src, dst [4]byte, psn uint32, madBytes []byte) []byte {
	const ipLen, udpLen, bthLen, dethLen, icrcLen = 20, 8, 12, 8, 4
	payload := bthLen + dethLen + len(madBytes) + icrcLen
	f := make([]byte, 14+ipLen+udpLen+payload)
	copy(f[0:6], []byte{0x02, 0, 0, 0, 0, 0x02})
	copy(f[6:12], []byte{0x02, 0, 0, 0, 0, 0x01})
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(ipLen+udpLen+payload))
	binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF, ID 0 (rxe convention)
	ip[8] = 64
	ip[9] = 17
	copy(ip[12:16], src[:])
	copy(ip[16:20], dst[:])
	binary.BigEndian.PutUint16(ip[10:], ^testutil.NaiveSum(ip[:ipLen]))
	udp := ip[ipLen:]
	binary.BigEndian.PutUint16(udp[0:], 0xC001)
	binary.BigEndian.PutUint16(udp[2:], 4791)
	binary.BigEndian.PutUint16(udp[4:], uint16(udpLen+payload))
	bth := udp[udpLen:]
	bth[0] = 0x64 // UD SEND_ONLY
	binary.BigEndian.PutUint16(bth[2:], 0xFFFF)
	put24(bth[5:], 1) // dest QP 1
	put24(bth[9:], psn)
	deth := bth[bthLen:]
	binary.BigEndian.PutUint32(deth[0:], 0x80010000)
	put24(deth[5:], 1) // source QP 1
	copy(deth[dethLen:], madBytes)
	pkt := ip[:len(ip)-icrcLen]
	binary.LittleEndian.PutUint32(ip[len(ip)-icrcLen:], icrc(pkt))
	return f
}

// icrc is the RoCEv2 invariant CRC over an IPv4 packet (docs/wire.md
// §4.6): 8 bytes of 0xFF, then the packet with TOS, TTL, IP checksum, UDP
// checksum and BTH byte 4 set to 0xFF.
func icrc(pkt []byte) uint32 {
	m := append(bytes.Repeat([]byte{0xFF}, 8), pkt...)
	ip := m[8:]
	ip[1], ip[8], ip[10], ip[11] = 0xFF, 0xFF, 0xFF, 0xFF
	ip[20+6], ip[20+7] = 0xFF, 0xFF
	ip[28+4] = 0xFF
	return crc32.ChecksumIEEE(m)
}

// writePcap writes frames as a classic pcap with LINKTYPE_ETHERNET.
func writePcap(path string, frames [][]byte) error {
	var b bytes.Buffer
	hdr := make([]byte, 24)
	binary.LittleEndian.PutUint32(hdr[0:], 0xa1b2c3d4)
	binary.LittleEndian.PutUint16(hdr[4:], 2)
	binary.LittleEndian.PutUint16(hdr[6:], 4)
	binary.LittleEndian.PutUint32(hdr[16:], 65535)
	binary.LittleEndian.PutUint32(hdr[20:], 1)
	b.Write(hdr)
	for i, f := range frames {
		rec := make([]byte, 16)
		binary.LittleEndian.PutUint32(rec[0:], uint32(1700000000+i))
		binary.LittleEndian.PutUint32(rec[8:], uint32(len(f)))
		binary.LittleEndian.PutUint32(rec[12:], uint32(len(f)))
		b.Write(rec)
		b.Write(f)
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

// TestICRCMasking checks the test's ICRC builder: variant fields are
// masked, everything else is covered.
func TestICRCMasking(t *testing.T) {
	a := roceUDFrame([4]byte{127, 0, 0, 1}, [4]byte{127, 0, 0, 2}, 1, make([]byte, MADSize))
	ip := a[14 : len(a)-4]
	want := icrc(ip)
	ip[1], ip[8], ip[32] = 0xB8, 1, 0xC0 // TOS, TTL, FECN/BECN: masked
	if got := icrc(ip); got != want {
		t.Fatalf("ICRC changed with masked fields: %#x != %#x", got, want)
	}
	ip[12] ^= 1 // source address: covered
	if icrc(ip) == want {
		t.Fatal("ICRC ignores the source address")
	}
}

func TestTsharkDecodesCM(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not in PATH: apt-get install tshark")
	}
	a, b := [4]byte{127, 0, 0, 1}, [4]byte{127, 0, 0, 2}
	req := goldenREQ()
	req.Primary.FlowLabel, req.Primary.PacketRate = 0, 0
	req.StartingPSN = 0x123456
	rep := &REP{TransactionID: req.TransactionID, LocalCommID: 0x2b2b2b2b, RemoteCommID: 0x1a1a1a1a,
		LocalQPN: 0x202, StartingPSN: 0xABCD, ResponderResources: 4, SRQ: true, LocalCAGUID: 0x0200000000000002}
	copy(rep.PrivateData[:], []byte{0, 0, 0, 0x49, 0, 0, 0xff, 0xf4})
	rtu := &RTU{TransactionID: req.TransactionID, LocalCommID: 0x1a1a1a1a, RemoteCommID: 0x2b2b2b2b}
	dreq := &DREQ{TransactionID: 0x0000000100000002, LocalCommID: 0x1a1a1a1a, RemoteCommID: 0x2b2b2b2b, RemoteQPN: 0x202}
	drep := &DREP{TransactionID: dreq.TransactionID, LocalCommID: 0x2b2b2b2b, RemoteCommID: 0x1a1a1a1a}
	rej := &REJ{TransactionID: 0x0000000100000003, LocalCommID: 0, RemoteCommID: 0x3c3c3c3c,
		MessageRejected: RespondsToREQ, Reason: RejectStaleConn}
	rej.PrivateData[0] = 0x5a
	msgs := []struct {
		m        Message
		src, dst [4]byte
	}{{req, a, b}, {rep, b, a}, {rtu, a, b}, {dreq, a, b}, {drep, b, a}, {rej, b, a}}
	var frames [][]byte
	var icrcs []uint32
	for i, x := range msgs {
		buf := make([]byte, MADSize)
		if err := x.m.Marshal(buf); err != nil {
			t.Fatal(err)
		}
		f := roceUDFrame(x.src, x.dst, uint32(i+1), buf)
		frames = append(frames, f)
		icrcs = append(icrcs, binary.BigEndian.Uint32(f[len(f)-4:]))
	}
	path := filepath.Join(t.TempDir(), "cm.pcap")
	if err := writePcap(path, frames); err != nil {
		t.Fatal(err)
	}
	fields := []string{
		"infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.deth.q_key", "infiniband.deth.srcqp",
		"infiniband.mad.mgmtclass", "infiniband.mad.method", "infiniband.mad.attributeid", "infiniband.mad.transactionid",
		"infiniband.cm.req", "infiniband.cm.req.serviceid", "infiniband.cm.req.localqpn", "infiniband.cm.req.startpsn",
		"infiniband.cm.req.pppmtu", "infiniband.cm.req.maxcmretr", "infiniband.cm.req.srq", "infiniband.cm.req.private",
		"infiniband.cm.rep", "infiniband.cm.rep.remotecommid", "infiniband.cm.rep.localqpn", "infiniband.cm.rep.startpsn", "infiniband.cm.rep.private",
		"infiniband.cm.rtu.localcommid", "infiniband.cm.rtu.remotecommid",
		"infiniband.cm.dreq.localcommid", "infiniband.cm.dreq.remotecommid", "infiniband.cm.req.remoteqpneecn",
		"infiniband.cm.drsp.localcommid", "infiniband.cm.drsp.remotecommid",
		"infiniband.cm.rej.remotecommid", "infiniband.cm.rej.msgrej", "infiniband.cm.rej.reason", "infiniband.cm.rej.private",
		"infiniband.invariant.crc", "_ws.expert.message",
	}
	args := []string{"-n", "-o", "ip.check_checksum:TRUE", "-r", path, "-T", "fields", "-E", "separator=|", "-E", "occurrence=f"}
	for _, f := range fields {
		args = append(args, "-e", f)
	}
	out, err := exec.Command(tshark, args...).Output()
	if err != nil {
		t.Fatalf("tshark: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) != len(frames) {
		t.Fatalf("tshark printed %d lines for %d frames:\n%s", len(lines), len(frames), out)
	}
	rows := make([]map[string]string, len(lines))
	for i, l := range lines {
		vals := strings.Split(l, "|")
		if len(vals) != len(fields) {
			t.Fatalf("line %d has %d fields: %q", i+1, len(vals), l)
		}
		rows[i] = map[string]string{}
		for j, f := range fields {
			rows[i][f] = vals[j]
		}
	}
	pdHex := func(prefix string, n int) string { return prefix + strings.Repeat("0", 2*n-len(prefix)) }
	want := []map[string]string{
		{"infiniband.mad.attributeid": "0x0010", "infiniband.mad.transactionid": "0x0000000100000001",
			"infiniband.cm.req": "0x1a1a1a1a", "infiniband.cm.req.serviceid": "0x1000000000000049",
			"infiniband.cm.req.localqpn": "0x000101", "infiniband.cm.req.startpsn": "0x123456",
			"infiniband.cm.req.pppmtu": "0x03", "infiniband.cm.req.maxcmretr": "0x0f", "infiniband.cm.req.srq": "0x01",
			"infiniband.cm.req.private": pdHex("000000480000fff4", REQPrivateDataSize)},
		{"infiniband.mad.attributeid": "0x0013", "infiniband.mad.transactionid": "0x0000000100000001",
			"infiniband.cm.rep": "0x2b2b2b2b", "infiniband.cm.rep.remotecommid": "0x1a1a1a1a",
			"infiniband.cm.rep.localqpn": "0x000202", "infiniband.cm.rep.startpsn": "0x00abcd",
			"infiniband.cm.rep.private": pdHex("000000490000fff4", REPPrivateDataSize)},
		{"infiniband.mad.attributeid": "0x0014", "infiniband.cm.rtu.localcommid": "0x1a1a1a1a", "infiniband.cm.rtu.remotecommid": "0x2b2b2b2b"},
		{"infiniband.mad.attributeid": "0x0015", "infiniband.mad.transactionid": "0x0000000100000002",
			"infiniband.cm.dreq.localcommid": "0x1a1a1a1a", "infiniband.cm.dreq.remotecommid": "0x2b2b2b2b",
			"infiniband.cm.req.remoteqpneecn": "0x000202"},
		{"infiniband.mad.attributeid": "0x0016", "infiniband.mad.transactionid": "0x0000000100000002",
			"infiniband.cm.drsp.localcommid": "0x2b2b2b2b", "infiniband.cm.drsp.remotecommid": "0x1a1a1a1a"},
		{"infiniband.mad.attributeid": "0x0012", "infiniband.cm.rej.remotecommid": "0x3c3c3c3c",
			"infiniband.cm.rej.msgrej": "0x00", "infiniband.cm.rej.reason": "0x000a",
			"infiniband.cm.rej.private": pdHex("5a", REJPrivateDataSize)},
	}
	for i, row := range rows {
		common := map[string]string{
			"infiniband.bth.opcode": "100", "infiniband.bth.destqp": "0x000001",
			"infiniband.deth.q_key": "0x0000000080010000", "infiniband.deth.srcqp": "0x00000001",
			"infiniband.mad.mgmtclass": "0x07", "infiniband.mad.method": "0x03",
			"infiniband.invariant.crc": fmt.Sprintf("0x%08x", icrcs[i]), "_ws.expert.message": "",
		}
		for k, v := range want[i] {
			common[k] = v
		}
		for k, v := range common {
			if got := row[k]; !strings.EqualFold(got, v) {
				t.Errorf("frame %d %s = %q, want %q", i+1, k, got, v)
			}
		}
	}
}
