package cm

import (
	"reflect"
	"testing"
	"time"
)

func timeDuration(s string) (time.Duration, error) { return time.ParseDuration(s) }

func FuzzDecode(f *testing.F) {
	for _, msg := range []Message{goldenREQ(), &REP{StartingPSN: 0xabcd}, &REJ{Reason: RejectTimeout},
		&MRA{ServiceTimeout: 3}, &RTU{}, &DREQ{RemoteQPN: 0x202}, &DREP{}} {
		b := make([]byte, MADSize)
		if err := msg.Marshal(b); err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add(make([]byte, MADSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMAD(b)
		if err != nil {
			if m != nil {
				t.Fatalf("message %v with error %v", m, err)
			}
			if dropReasonOf(err) < 0 {
				t.Fatal("no drop reason")
			}
			return
		}
		// Whatever decodes re-encodes to something that decodes the same
		// (reserved bits are dropped on the way).
		out := make([]byte, MADSize)
		if err := m.Marshal(out); err != nil {
			t.Fatalf("re-marshal %s: %v", m.Type(), err)
		}
		again, err := DecodeMAD(out)
		if err != nil {
			t.Fatalf("decode re-marshalled %s: %v", m.Type(), err)
		}
		if !reflect.DeepEqual(m, again) {
			t.Fatalf("round trip changed %s:\n%+v\n%+v", m.Type(), m, again)
		}
	})
}
