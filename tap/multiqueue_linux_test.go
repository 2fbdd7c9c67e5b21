package tap

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ipoibcm/ipoib/offload"
)

// tunFlags is what TUNGETIFF says the fd behind d was opened with.
func tunFlags(t *testing.T, d *Device) uint16 {
	t.Helper()
	var flags uint16
	var ierr error
	if err := d.vnet.io.rc.Control(func(fd uintptr) {
		ifr, err := unix.NewIfreq(d.name)
		if err != nil {
			ierr = err
			return
		}
		if ierr = unix.IoctlIfreq(int(fd), unix.TUNGETIFF, ifr); ierr == nil {
			flags = ifr.Uint16()
		}
	}); err != nil {
		t.Fatalf("control: %v", err)
	}
	if ierr != nil {
		t.Fatalf("tungetiff: %v", ierr)
	}
	return flags
}

// queueBridge moves frames from every queue of from to the same queue of
// to, counting the frames each of from's queues read.
type queueBridge struct {
	wg   sync.WaitGroup
	read []atomic.Int64
}

func bridgeQueues(from, to *Device) *queueBridge {
	qf, qt := from.Queues(), to.Queues()
	b := &queueBridge{read: make([]atomic.Int64, len(qf))}
	for k := range qf {
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			bufs := [][]byte{make([]byte, vnetMaxFrame)}
			sizes, meta := make([]int, 1), make([]offload.Meta, 1)
			for {
				n, err := qf[k].ReadFramesMeta(bufs, sizes, meta)
				if err != nil {
					return
				}
				b.read[k].Add(int64(n))
				if _, err := qt[k].WriteFramesMeta([][]byte{bufs[0][:sizes[0]]}, meta); err != nil {
					return
				}
			}
		}()
	}
	return b
}

// TestMultiQueueTAP: Config.Queues 2 opens an IFF_MULTI_QUEUE TAP with two
// vnet fds carrying the same offloads; the kernel spreads 32 UDP flows over
// both, and every datagram crosses to the peer namespace through the queue
// it was read from. One queue is opened without IFF_MULTI_QUEUE, as before.
func TestMultiQueueTAP(t *testing.T) {
	requireRoot(t)
	o := testOwner(t)
	t.Run("one", func(t *testing.T) {
		ns := createNetns(t, o, "mq1")
		d, err := Open(Config{Name: "mq0", Netns: ns, VnetHdr: true, Queues: 1})
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		defer d.Close()
		if n := len(d.Queues()); n != 1 {
			t.Fatalf("Queues() = %d, want 1", n)
		}
		if f := tunFlags(t, d); f&unix.IFF_MULTI_QUEUE != 0 {
			t.Fatalf("one queue opened with IFF_MULTI_QUEUE (flags %#x)", f)
		}
	})
	t.Run("two", func(t *testing.T) {
		nsA, nsB := createNetns(t, o, "mqa"), createNetns(t, o, "mqb")
		pa, pb := netip.MustParsePrefix("10.77.0.1/24"), netip.MustParsePrefix("10.77.0.2/24")
		open := func(ns *Netns, p netip.Prefix) *Device {
			d, err := Open(Config{Name: "mq0", Netns: ns, VnetHdr: true, Queues: 2,
				Link: LinkConfig{MTU: vnetTestMTU, Addrs: []netip.Prefix{p}, Up: true}})
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			return d
		}
		a, b := open(nsA, pa), open(nsB, pb)
		ab, ba := bridgeQueues(a, b), bridgeQueues(b, a)
		t.Cleanup(func() {
			a.Close()
			b.Close()
			ab.wg.Wait()
			ba.wg.Wait()
		})
		qs := a.Queues()
		if len(qs) != 2 {
			t.Fatalf("Queues() = %d, want 2", len(qs))
		}
		for k, q := range qs {
			if f := tunFlags(t, q); f&(unix.IFF_MULTI_QUEUE|unix.IFF_VNET_HDR) != unix.IFF_MULTI_QUEUE|unix.IFF_VNET_HDR {
				t.Errorf("queue %d: flags %#x lack IFF_MULTI_QUEUE or IFF_VNET_HDR", k, f)
			}
			if q.Offloads() != a.Offloads() {
				t.Errorf("queue %d: offloads %v, queue 0 has %v", k, q.Offloads(), a.Offloads())
			}
		}
		if err := qs[1].SetMTU(1400); err == nil {
			t.Error("SetMTU on the second queue succeeded; the link is the first queue's")
		}
		udpFlows(t, nsA, nsB, pb.Addr(), 32)
		for k := range ab.read {
			if ab.read[k].Load() == 0 {
				t.Errorf("queue %d read no frame of 32 flows (per queue: %d, %d)", k, ab.read[0].Load(), ab.read[1].Load())
			}
		}
	})
}

// udpFlows sends one datagram from each of flows sockets in from to a
// listener in to, resending until every one has arrived.
func udpFlows(t *testing.T, from, to *Netns, dst netip.Addr, flows int) {
	t.Helper()
	var ln *net.UDPConn
	if err := to.Do(func() (err error) {
		ln, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 0)))
		return err
	}); err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer ln.Close()
	conns := make([]net.Conn, flows)
	if err := from.Do(func() error {
		for k := range conns {
			c, err := net.Dial("udp", ln.LocalAddr().String())
			if err != nil {
				return err
			}
			conns[k] = c
		}
		return nil
	}); err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	seen := make(map[string]bool)
	deadline := time.Now().Add(10 * time.Second)
	buf := make([]byte, 64)
	for len(seen) < flows && time.Now().Before(deadline) {
		for k, c := range conns {
			if !seen[fmt.Sprint(k)] {
				c.Write([]byte(fmt.Sprint(k)))
			}
		}
		ln.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		for {
			n, _, err := ln.ReadFromUDP(buf)
			if err != nil {
				break
			}
			seen[string(buf[:n])] = true
		}
	}
	if len(seen) < flows {
		t.Fatalf("%d of %d flows arrived", len(seen), flows)
	}
}
