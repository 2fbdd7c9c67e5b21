package cm

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/ipoibcm/ipoib/hca"
)

// mad hand-builds a 256-byte CM MAD: the common header for attr and tid,
// then each (offset in MAD data, hex bytes) pair from the IBTA tables.
func mad(t *testing.T, attr uint16, tid string, fields ...any) []byte {
	t.Helper()
	b := make([]byte, MADSize)
	copy(b, []byte{0x01, 0x07, 0x02, 0x03, 0, 0, 0, 0})
	copy(b[8:], unhex(t, tid))
	b[16], b[17] = byte(attr>>8), byte(attr)
	for i := 0; i < len(fields); i += 2 {
		off := fields[i].(int)
		copy(b[24+off:], unhex(t, fields[i+1].(string)))
	}
	return b
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	s = string(bytes.ReplaceAll([]byte(s), []byte(" "), nil))
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return b
}

func gid4(s string) hca.GID { return hca.GIDFromAddr(netip.MustParseAddr(s)) }

// goldenREQ is the REQ of a worked example connection from A=127.0.0.1 to
// B=127.0.0.2 (docs/wire.md, "§3 IB CM MADs"), with a flow label and
// packet rate to pin the bit fields of the path.
func goldenREQ() *REQ {
	r := &REQ{
		TransactionID:           0x0000000100000001,
		LocalCommID:             0x1a1a1a1a,
		ServiceID:               0x1000000000000049,
		LocalCAGUID:             0x0200000000000001,
		LocalQPN:                0x101,
		ResponderResources:      4,
		RemoteCMResponseTimeout: 20,
		StartingPSN:             0,
		LocalCMResponseTimeout:  20,
		PKey:                    0xFFFF,
		PathMTU:                 hca.MTU1024,
		MaxCMRetries:            15,
		SRQ:                     true,
		Primary: Path{
			LocalGID:        gid4("127.0.0.1"),
			RemoteGID:       gid4("127.0.0.2"),
			FlowLabel:       0x12345,
			PacketRate:      3,
			HopLimit:        0x40,
			SubnetLocal:     true,
			LocalACKTimeout: 14,
		},
	}
	copy(r.PrivateData[:], []byte{0, 0, 0, 0x48, 0, 0, 0xff, 0xf4})
	return r
}

func TestREQGolden(t *testing.T) {
	want := mad(t, 0x0010, "0000000100000001",
		0, "1a1a1a1a",
		8, "1000000000000049",
		16, "0200000000000001",
		32, "000101 04",
		43, "a0", // remote CM response timeout 20, RC, no E2E flow control
		44, "000000 a0", // starting PSN 0, local CM response timeout 20, retry 0
		48, "ffff",
		50, "30", // MTU 1024 (3), no RDC, RNR retry 0
		51, "f8", // max CM retries 15, SRQ
		56, "00000000000000000000ffff7f000001",
		72, "00000000000000000000ffff7f000002",
		88, "12345003", // flow label 0x12345, packet rate 3
		93, "40",
		94, "08", // SL 0, subnet local
		95, "70", // local ACK timeout 14
		140, "000000480000fff4",
	)
	got := make([]byte, MADSize)
	if err := goldenREQ().Marshal(got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("REQ bytes:\n got %x\nwant %x", got, want)
	}
	m, err := DecodeMAD(want)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(m, goldenREQ()) {
		t.Fatalf("decoded %+v\nwant %+v", m, goldenREQ())
	}
}

// TestREQBitFieldsGolden sets every REQ bit field to a distinctive value
// and checks where each lands.
func TestREQBitFieldsGolden(t *testing.T) {
	r := &REQ{
		TransactionID:           0x1122334455667788,
		LocalCommID:             0xdeadbeef,
		ServiceID:               0x0100000000000049,
		LocalQKey:               0x0b1b0b1b,
		LocalQPN:                0xabcdef,
		ResponderResources:      0x11,
		LocalEECN:               0x123456,
		InitiatorDepth:          0x22,
		RemoteEECN:              0x654321,
		RemoteCMResponseTimeout: 0x1F,
		TransportServiceType:    TransportUC,
		EndToEndFlowControl:     true,
		StartingPSN:             0xfedcba,
		LocalCMResponseTimeout:  0x15,
		RetryCount:              6,
		PKey:                    0x8001,
		PathMTU:                 hca.MTU4096,
		RDCExists:               true,
		RNRRetryCount:           5,
		MaxCMRetries:            9,
		SRQ:                     false,
		ExtendedTransportType:   3,
		Alternate: Path{
			LocalLID: 0x0102, RemoteLID: 0x0304,
			FlowLabel: 0xFFFFF, PacketRate: 0x3F, TrafficClass: 0xb8, HopLimit: 0xff,
			SL: 0xF, SubnetLocal: false, LocalACKTimeout: 0x1F,
		},
	}
	want := mad(t, 0x0010, "1122334455667788",
		0, "deadbeef",
		8, "0100000000000049",
		28, "0b1b0b1b abcdef 11 123456 22 654321",
		43, "fb", // 11111 01 1
		44, "fedcba ae", // 10101 110
		48, "8001",
		50, "5d", // 0101 1 101
		51, "93", // 1001 0 011
		96, "0102 0304",
		132, "fffff03f b8 ff f0 f8",
	)
	got := make([]byte, MADSize)
	if err := r.Marshal(got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("REQ bytes:\n got %x\nwant %x", got, want)
	}
	var back REQ
	if err := back.Unmarshal(want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&back, r) {
		t.Fatalf("decoded %+v\nwant %+v", back, *r)
	}
}

func TestGoldenMessages(t *testing.T) {
	rep := &REP{
		TransactionID: 0x0000000100000001, LocalCommID: 0x2b2b2b2b, RemoteCommID: 0x1a1a1a1a,
		LocalQKey: 0x01020304, LocalQPN: 0x202, LocalEECN: 0x0a0b0c, StartingPSN: 0xABCD,
		ResponderResources: 4, InitiatorDepth: 2, TargetACKDelay: 0x1F, FailoverAccepted: 2,
		EndToEndFlowControl: true, RNRRetryCount: 7, SRQ: true, LocalCAGUID: 0x0200000000000002,
	}
	copy(rep.PrivateData[:], []byte{0, 0, 0, 0x49, 0, 0, 0xff, 0xf4})
	rep.PrivateData[195] = 0xEE
	rej := &REJ{
		TransactionID: 7, LocalCommID: 0x2b2b2b2b, RemoteCommID: 0x1a1a1a1a,
		MessageRejected: RespondsToREP, RejectInfoLength: 8, Reason: RejectStaleConn,
	}
	copy(rej.ARI[:], []byte{1, 2, 3, 4, 5, 6, 7, 8})
	rej.ARI[71] = 0x99
	rej.PrivateData[0], rej.PrivateData[147] = 0xAA, 0xBB
	mra := &MRA{TransactionID: 8, LocalCommID: 1, RemoteCommID: 2, MessageMRAed: RespondsToOther, ServiceTimeout: 0x15}
	mra.PrivateData[0], mra.PrivateData[221] = 0x11, 0x22
	rtu := &RTU{TransactionID: 9, LocalCommID: 0x1a1a1a1a, RemoteCommID: 0x2b2b2b2b}
	rtu.PrivateData[223] = 0x33
	dreq := &DREQ{TransactionID: 10, LocalCommID: 0x1a1a1a1a, RemoteCommID: 0x2b2b2b2b, RemoteQPN: 0x202}
	dreq.PrivateData[219] = 0x44
	drep := &DREP{TransactionID: 10, LocalCommID: 0x2b2b2b2b, RemoteCommID: 0x1a1a1a1a}
	drep.PrivateData[0] = 0x55

	tests := []struct {
		msg  Message
		want []byte
	}{
		{rep, mad(t, 0x0013, "0000000100000001",
			0, "2b2b2b2b 1a1a1a1a 01020304 00020200 0a0b0c00 00abcd00 04 02",
			26, "fd", // ack delay 31, failover 2, E2E
			27, "f0", // RNR retry 7, SRQ
			28, "0200000000000002",
			36, "000000490000fff4",
			231, "ee")},
		{rej, mad(t, 0x0012, "0000000000000007",
			0, "2b2b2b2b 1a1a1a1a",
			8, "40 10 000a", // rejected REP, ARI length 8, STALE_CONN
			12, "0102030405060708",
			83, "99 aa",
			231, "bb")},
		{mra, mad(t, 0x0011, "0000000000000008",
			0, "00000001 00000002 80 a8 11", 231, "22")},
		{rtu, mad(t, 0x0014, "0000000000000009",
			0, "1a1a1a1a 2b2b2b2b", 231, "33")},
		{dreq, mad(t, 0x0015, "000000000000000a",
			0, "1a1a1a1a 2b2b2b2b 00020200", 231, "44")},
		{drep, mad(t, 0x0016, "000000000000000a",
			0, "2b2b2b2b 1a1a1a1a 55")},
	}
	for _, tt := range tests {
		t.Run(tt.msg.Type().String(), func(t *testing.T) {
			got := make([]byte, MADSize)
			if err := tt.msg.Marshal(got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tt.want) {
				t.Fatalf("bytes:\n got %x\nwant %x", got, tt.want)
			}
			back, err := DecodeMAD(tt.want)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back, tt.msg) {
				t.Fatalf("decoded %+v\nwant %+v", back, tt.msg)
			}
			if back.Type() != tt.msg.Type() || back.TID() != tt.msg.TID() {
				t.Fatalf("type/TID %s/%d, want %s/%d", back.Type(), back.TID(), tt.msg.Type(), tt.msg.TID())
			}
		})
	}
}

func TestPrivateDataSizes(t *testing.T) {
	// Each message's private data ends exactly at the end of the MAD.
	sizes := map[MsgType]struct{ off, size int }{
		MsgREQ: {140, REQPrivateDataSize}, MsgREP: {36, REPPrivateDataSize},
		MsgREJ: {84, REJPrivateDataSize}, MsgMRA: {10, MRAPrivateDataSize},
		MsgRTU: {8, RTUPrivateDataSize}, MsgDREQ: {12, DREQPrivateDataSize},
		MsgDREP: {8, DREPPrivateDataSize},
	}
	want := map[MsgType]int{MsgREQ: 92, MsgREP: 196, MsgREJ: 148, MsgMRA: 222, MsgRTU: 224, MsgDREQ: 220, MsgDREP: 224}
	for typ, s := range sizes {
		if s.size != want[typ] || s.off+s.size != MADDataSize {
			t.Errorf("%s: private data %d bytes at %d, want %d ending at %d", typ, s.size, s.off, want[typ], MADDataSize)
		}
	}
}

func TestRoundTripAll(t *testing.T) {
	msgs := []Message{goldenREQ(),
		&REP{TransactionID: 1, LocalQPN: 0xFFFFFF, StartingPSN: 0xFFFFFF, RNRRetryCount: 3},
		&REJ{TransactionID: 2, Reason: RejectInvalidServiceID, MessageRejected: RespondsToREQ, RejectInfoLength: 72},
		&MRA{TransactionID: 3, ServiceTimeout: 31, MessageMRAed: RespondsToREP},
		&RTU{TransactionID: 4, LocalCommID: ^uint32(0)},
		&DREQ{TransactionID: 5, RemoteQPN: 0xFFFFFF},
		&DREP{TransactionID: ^uint64(0)},
	}
	for _, msg := range msgs {
		b := make([]byte, 300) // longer buffers are fine for Marshal
		if err := msg.Marshal(b); err != nil {
			t.Fatalf("%s: %v", msg.Type(), err)
		}
		back, err := DecodeMAD(b[:MADSize])
		if err != nil {
			t.Fatalf("%s: %v", msg.Type(), err)
		}
		if !reflect.DeepEqual(back, msg) {
			t.Fatalf("%s: got %+v want %+v", msg.Type(), back, msg)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	valid := make([]byte, MADSize)
	if err := goldenREQ().Marshal(valid); err != nil {
		t.Fatal(err)
	}
	mut := func(f func(b []byte) []byte) []byte {
		return f(append([]byte(nil), valid...))
	}
	rejBytes := func(f func(b []byte)) []byte {
		b := make([]byte, MADSize)
		if err := (&REJ{Reason: 1}).Marshal(b); err != nil {
			t.Fatal(err)
		}
		f(b)
		return b
	}
	tests := []struct {
		name string
		b    []byte
		want error
		drop DropReason
	}{
		{"empty", nil, ErrShortMAD, DropShort},
		{"short", valid[:255], ErrShortMAD, DropShort},
		{"long", append(append([]byte(nil), valid...), 0), ErrLongMAD, DropLong},
		{"base version", mut(func(b []byte) []byte { b[0] = 2; return b }), ErrBaseVersion, DropBaseVersion},
		{"class", mut(func(b []byte) []byte { b[1] = 0x81; return b }), ErrMgmtClass, DropMgmtClass},
		{"class version", mut(func(b []byte) []byte { b[2] = 1; return b }), ErrClassVersion, DropClassVersion},
		{"method response", mut(func(b []byte) []byte { b[3] = 0x83; return b }), ErrMethod, DropMethod},
		{"method get", mut(func(b []byte) []byte { b[3] = 0x01; return b }), ErrMethod, DropMethod},
		{"SIDR_REQ", mut(func(b []byte) []byte { b[17] = 0x17; return b }), ErrAttribute, DropAttribute},
		{"ClassPortInfo", mut(func(b []byte) []byte { b[17] = 0x01; return b }), ErrAttribute, DropAttribute},
		{"REQ MTU 0", mut(func(b []byte) []byte { b[24+50] &= 0x0F; return b }), ErrInconsistentField, DropInconsistent},
		{"REQ MTU 6", mut(func(b []byte) []byte { b[24+50] = 0x60; return b }), ErrInconsistentField, DropInconsistent},
		{"REQ transport 3", mut(func(b []byte) []byte { b[24+43] |= 0x06; return b }), ErrInconsistentField, DropInconsistent},
		{"REJ ARI length 73", rejBytes(func(b []byte) { b[24+9] = 73 << 1 }), ErrInconsistentField, DropInconsistent},
		{"REJ message rejected 3", rejBytes(func(b []byte) { b[24+8] = 0xC0 }), ErrInconsistentField, DropInconsistent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := DecodeMAD(tt.b)
			if !errors.Is(err, tt.want) || m != nil {
				t.Fatalf("DecodeMAD = %v, %v; want error %v", m, err, tt.want)
			}
			if got := dropReasonOf(err); got != tt.drop {
				t.Fatalf("drop reason %s, want %s", got, tt.drop)
			}
		})
	}
	// An MRA with MessageMRAed 3 is inconsistent too.
	b := make([]byte, MADSize)
	if err := (&MRA{}).Marshal(b); err != nil {
		t.Fatal(err)
	}
	b[24+8] = 0xC0
	if _, err := DecodeMAD(b); !errors.Is(err, ErrInconsistentField) {
		t.Fatalf("MRA MRAed 3: %v", err)
	}
	// Unmarshal of one type refuses another type's MAD.
	var rep REP
	if err := rep.Unmarshal(valid); !errors.Is(err, ErrAttribute) {
		t.Fatalf("REP.Unmarshal(REQ) = %v", err)
	}
}

func TestMarshalRejects(t *testing.T) {
	if err := (&RTU{}).Marshal(make([]byte, 255)); !errors.Is(err, ErrBufferTooSmall) {
		t.Fatalf("short buffer: %v", err)
	}
	r := goldenREQ()
	r.PathMTU = 1500
	if err := r.Marshal(make([]byte, MADSize)); !errors.Is(err, ErrInconsistentField) {
		t.Fatalf("MTU 1500: %v", err)
	}
	if err := (&REJ{RejectInfoLength: 73}).Marshal(make([]byte, MADSize)); !errors.Is(err, ErrInconsistentField) {
		t.Fatalf("ARI 73: %v", err)
	}
	if err := (&MRA{MessageMRAed: 3}).Marshal(make([]byte, MADSize)); !errors.Is(err, ErrInconsistentField) {
		t.Fatalf("MRAed 3: %v", err)
	}
}

func TestMarshalClearsBuffer(t *testing.T) {
	b := bytes.Repeat([]byte{0xFF}, MADSize)
	if err := (&DREP{TransactionID: 1}).Marshal(b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b[24:], make([]byte, MADDataSize)) {
		t.Fatalf("stale bytes left: %x", b[24:])
	}
}

func TestNames(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{MsgREQ.String(), "REQ"}, {MsgDREP.String(), "DREP"}, {MsgType(0x17).String(), "MsgType(0x0017)"},
		{RejectStaleConn.String(), "STALE_CONN"}, {RejectInvalidServiceID.String(), "INVALID_SERVICE_ID"},
		{RejectReason(99).String(), "RejectReason(99)"},
		{StateEstablished.String(), "ESTABLISHED"}, {StateTimeWait.String(), "TIMEWAIT"}, {State(99).String(), "State(99)"},
		{EventStale.String(), "STALE"}, {EventType(0).String(), "EventType(0)"},
		{DropMgmtClass.String(), "mgmt_class"}, {RespondsToREP.String(), "REP"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestTimeoutCode(t *testing.T) {
	for _, c := range []struct {
		d    string
		want uint8
	}{{"4.096us", 0}, {"5us", 1}, {"2s", 19}, {"4.29s", 20}, {"100000h", 31}} {
		d, err := timeDuration(c.d)
		if err != nil {
			t.Fatal(err)
		}
		if got := timeoutCode(d); got != c.want {
			t.Errorf("timeoutCode(%s) = %d, want %d", c.d, got, c.want)
		}
		if got := timeoutDuration(c.want); c.want < 31 && got < d {
			t.Errorf("timeoutDuration(%d) = %v < %v", c.want, got, d)
		}
	}
}

func TestStatsJSONNamesKeys(t *testing.T) {
	s := Stats{Sent: map[MsgType]uint64{MsgREQ: 2}, RejSent: map[RejectReason]uint64{RejectStaleConn: 1}}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"sent":{"REQ":2}`, `"rej_sent":{"` + RejectStaleConn.String() + `":1}`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("JSON %s lacks %s", b, want)
		}
	}
}
