package rocev2

import (
	"encoding/json"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ipoibcm/ipoib/hca"
)

// ageWarnings moves d's warning clocks back by by, as if that much time
// had passed since each kind of warning last went out.
func (d *Device) ageWarnings(by time.Duration) {
	for _, w := range []*rateLimitedWarn{&d.warnTooBig, &d.warnTx, &d.warnRxTooBig} {
		w.mu.Lock()
		if !w.last.IsZero() {
			w.last = w.last.Add(-by)
		}
		w.mu.Unlock()
	}
}

// TestEMSGSIZECountedAndWarned makes the kernel refuse datagrams: three
// devices on lo of a private network namespace, and the route toward B
// (only B) carries 1200 bytes, with the device's sockets in
// IP_PMTUDISC_DO. Full-size UD datagrams from A to B come back from
// sendmmsg as EMSGSIZE, alone and as one GSO message: each datagram is
// counted in tx_too_big (and tx_errors), the log says so once per
// warning interval, and the next warning carries the count of the
// datagrams it held back. Small datagrams to B, and full-size ones to C,
// keep flowing.
func TestEMSGSIZECountedAndWarned(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_SYS_ADMIN) for a private network namespace with a route MTU")
	}
	const routeMTU = 1200
	addrA, addrB, addrC := netip.MustParseAddr("198.18.61.1"), netip.MustParseAddr("198.18.61.2"), netip.MustParseAddr("198.18.61.3")
	rec := &warnRecorder{}
	devs := make(map[netip.Addr]*Device)
	err := inPrivateNetns([]netip.Addr{addrA, addrB, addrC}, func() error {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		defer h.Close()
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		// The local route the kernel made for B, with an MTU: what
		// `ip route replace local 198.18.61.2 dev lo table local mtu lock 1200` does.
		if err := h.RouteReplace(&netlink.Route{LinkIndex: lo.Attrs().Index, Dst: &net.IPNet{IP: addrB.AsSlice(), Mask: net.CIDRMask(32, 32)},
			Src: addrB.AsSlice(), Table: unix.RT_TABLE_LOCAL, Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST,
			Protocol: unix.RTPROT_KERNEL, MTU: routeMTU, MTULock: true}); err != nil {
			return err
		}
		for _, a := range []netip.Addr{addrA, addrB, addrC} {
			d, err := New(Config{Bind: netip.AddrPortFrom(a, 4791), MTU: hca.MTU4096, Logger: slog.New(rec)})
			if err != nil {
				return err
			}
			devs[a] = d
		}
		return nil
	})
	for _, d := range devs {
		t.Cleanup(func() {
			if err := d.Close(); err != nil {
				t.Error(err)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := newUDEnd(t, devs[addrA], 1), newUDEnd(t, devs[addrB], 64), newUDEnd(t, devs[addrC], 64)
	ahB, err := a.dev.CreateAH(b.dev.Port().GID)
	if err != nil {
		t.Fatal(err)
	}
	ahC, err := a.dev.CreateAH(c.dev.Port().GID)
	if err != nil {
		t.Fatal(err)
	}
	big, small := make([]byte, 2048), make([]byte, 256)
	send := func(to *udEnd, ah hca.AH, data []byte, n int) {
		t.Helper()
		wrs := make([]hca.SendWR, n)
		for k := range wrs {
			wrs[k] = hca.SendWR{ID: uint64(k), Data: data, AH: ah, RemoteQPN: to.qp.QPN(), RemoteQKey: testQKey}
		}
		if _, err := a.qp.PostSend(wrs); err != nil {
			t.Fatal(err)
		}
		// UD is unreliable: a refused datagram still completes its send.
		for _, wc := range a.cq.wait(t, n) {
			if wc.Status != hca.StatusSuccess {
				t.Fatalf("send completion %+v", wc)
			}
		}
	}
	tooBig := func(want uint64) {
		t.Helper()
		// PostSend writes before it returns: the counters are final.
		if s := a.dev.Stats(); s.TxTooBig != want || s.TxErrors != want {
			t.Fatalf("tx_too_big %d, tx_errors %d; want %d each", s.TxTooBig, s.TxErrors, want)
		}
	}

	// One datagram at a time, then ten in one post (one GSO message).
	for range 10 {
		send(b, ahB, big, 1)
	}
	send(b, ahB, big, 10)
	tooBig(20)
	warns := rec.withMsg("EMSGSIZE")
	if len(warns) != 1 || warns[0]["datagrams"] != "1" || warns[0]["suppressed_since_last"] != "0" {
		t.Fatalf("warnings for 20 refused datagrams in one interval: %v; want exactly 1 (datagrams=1 suppressed_since_last=0)", warns)
	}

	// Other traffic is untouched: small datagrams to B and full-size
	// ones to C arrive, whole.
	send(b, ahB, small, 5)
	send(c, ahC, big, 5)
	for _, e := range []struct {
		end  *udEnd
		size int
	}{{b, len(small)}, {c, len(big)}} {
		for _, wc := range e.end.cq.wait(t, 5) {
			if wc.Status != hca.StatusSuccess || int(wc.ByteLen) != e.size {
				t.Fatalf("receive completion %+v, want %d bytes", wc, e.size)
			}
		}
	}
	tooBig(20)
	if a.dev.Stats().TxGSOMessages == 0 {
		t.Fatal("no GSO message sent: the ten-datagram post was not one GSO message either")
	}

	// The next interval's first refusal is reported with the 19 held
	// back.
	a.dev.ageWarnings(warnEvery)
	send(b, ahB, big, 1)
	tooBig(21)
	warns = rec.withMsg("EMSGSIZE")
	if len(warns) != 2 || warns[1]["datagrams"] != "1" || warns[1]["suppressed_since_last"] != "19" {
		t.Fatalf("warnings after one interval: %v; want 2, the second with suppressed_since_last=19", warns)
	}
	if n := len(rec.withMsg("transmit failed")); n != 0 {
		t.Fatalf("%d 'transmit failed' warnings: EMSGSIZE counted as another error", n)
	}

	// 'ipoib show' prints the device's JSON under "rocev2".
	js, err := json.Marshal(a.dev.Stats())
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(js, &m); err != nil {
		t.Fatal(err)
	}
	if m["tx_too_big"] != float64(21) {
		t.Fatalf("JSON tx_too_big = %v, want 21", m["tx_too_big"])
	}
}
