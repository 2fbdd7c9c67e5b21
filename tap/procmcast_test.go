package tap

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"testing"
)

// Verbatim from a Linux 6.18 machine (little-endian), with a device 7
// added that has joined 239.1.2.3.
const procIGMP = "Idx\tDevice    : Count Querier\tGroup    Users Timer\tReporter\n" +
	"1\tlo        :     1      V3\n" +
	"\t\t\t\t010000E0     1 0:00000000\t\t0\n" +
	"7\tib0       :     2      V3\n" +
	"\t\t\t\t030201EF     1 0:00000000\t\t1\n" +
	"\t\t\t\t010000E0     1 0:00000000\t\t0\n"

const procIGMP6 = "1    lo              ff020000000000000000000000000001     1 0000000C 0\n" +
	"7    ib0             ff0200000000000000000001ff000002     1 00000004 0\n" +
	"7    ib0             ff050000000000000000000000010003     1 00000004 0\n" +
	"7    ib0             ff020000000000000000000000000001     1 0000000C 0\n"

func TestParseProcMulticast(t *testing.T) {
	if !littleEndian() {
		t.Skip("the fixture's IPv4 groups are in little-endian order")
	}
	g, err := parseProcIGMP([]byte(procIGMP), 7)
	if err != nil || !slices.Equal(g, []netip.Addr{netip.MustParseAddr("239.1.2.3"), netip.MustParseAddr("224.0.0.1")}) {
		t.Fatalf("igmp: %v %v", g, err)
	}
	if g, err := parseProcIGMP([]byte(procIGMP), 3); err != nil || len(g) != 0 {
		t.Fatalf("igmp of an absent device: %v %v", g, err)
	}
	g, err = parseProcIGMP6([]byte(procIGMP6), 7)
	want := []netip.Addr{netip.MustParseAddr("ff02::1:ff00:2"), netip.MustParseAddr("ff05::1:3"), netip.MustParseAddr("ff02::1")}
	if err != nil || !slices.Equal(g, want) {
		t.Fatalf("igmp6: %v %v", g, err)
	}
	for _, bad := range []string{"h\nseven\tib0 : 1\n", "h\n7\tib0 : 1 V3\n\t\tZZ\n", "h\n7\tib0 : 1 V3\n\t\t0A000001 1\n"} {
		if _, err := parseProcIGMP([]byte(bad), 7); err == nil {
			t.Errorf("igmp %q accepted", bad)
		}
	}
	for _, bad := range []string{"7 ib0\n", "7 ib0 fe800000000000000000000000000001 1 0 0\n", "7 ib0 ff02 1 0 0\n"} {
		if _, err := parseProcIGMP6([]byte(bad), 7); err == nil {
			t.Errorf("igmp6 %q accepted", bad)
		}
	}
}

// FuzzParseProcMulticast: the parsers never panic and return only
// multicast groups of their family, or an error.
func FuzzParseProcMulticast(f *testing.F) {
	f.Add([]byte(procIGMP), 7)
	f.Add([]byte(procIGMP6), 7)
	f.Fuzz(func(t *testing.T, b []byte, idx int) {
		if g, err := parseProcIGMP(b, idx); err == nil {
			for _, a := range g {
				if !a.Is4() || !a.IsMulticast() {
					t.Fatalf("igmp group %v", a)
				}
			}
		}
		if g, err := parseProcIGMP6(b, idx); err == nil {
			for _, a := range g {
				if !a.Is6() || !a.IsMulticast() {
					t.Fatalf("igmp6 group %v", a)
				}
			}
		}
	})
}

func littleEndian() bool { return binary.NativeEndian.Uint16([]byte{1, 0}) == 1 }
