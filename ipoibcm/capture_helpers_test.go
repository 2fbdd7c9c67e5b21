package ipoibcm

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/cm"
	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// rvCapture is a memPort whose written frames are copied to a channel.
type rvCapture struct {
	*memPort
	frames chan []byte
	// onWrite, if set before the Interface starts, also sees every
	// written frame (valid during the call), in the order written.
	onWrite func(f []byte)
}

func rvNewCapture(mac byte) *rvCapture {
	c := &rvCapture{frames: make(chan []byte, 4096)}
	c.memPort = newMemPort(mac, func(fs [][]byte) {
		for _, f := range fs {
			if c.onWrite != nil {
				c.onWrite(f)
			}
			select {
			case c.frames <- append([]byte(nil), f...):
			default: // a test that floods does not read them all
			}
		}
	})
	return c
}

// next returns the next written frame that match accepts, failing the
// test after d.
func (c *rvCapture) next(t *testing.T, d time.Duration, what string, match func([]byte) bool) []byte {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case f := <-c.frames:
			if match(f) {
				return f
			}
		case <-deadline:
			t.Fatalf("no %s reached the host within %v", what, d)
			return nil
		}
	}
}

// rvSlowCM keeps a REQ to a peer that never answers pending for the
// whole test.
func rvSlowCM() cm.Options {
	return cm.Options{ResponseTimeout: time.Minute, MaxRetries: 1, TimeWait: 10 * time.Millisecond, Seed: 1}
}

// rvStart creates and starts an Interface on a new device of fab; Close
// runs at cleanup (before the fabric's, registered earlier).
func rvStart(t *testing.T, fab *soft.Fabric, name string, host HostPort, tweak func(*Config)) *Interface {
	t.Helper()
	dev, err := fab.NewDevice(name)
	if err != nil {
		t.Fatal(err)
	}
	ifc := testInterface(t, dev, host, name, tweak)
	startTest(t, ifc)
	return ifc
}

// rvFabric is a soft fabric closed at cleanup.
func rvFabric(t *testing.T, seed int64) *soft.Fabric {
	fab := soft.NewFabric(soft.Config{Seed: seed})
	t.Cleanup(func() { fab.Close() })
	return fab
}

// rvLearn teaches ifc a neighbour as ARP would, and returns its MAC.
func rvLearn(ifc *Interface, hw frame.HWAddr, ip netip.Addr, now time.Time) frame.MAC {
	ifc.neigh.mu.Lock()
	defer ifc.neigh.mu.Unlock()
	return ifc.neigh.learn(hw, ip, now).mac
}

// rvIPv4 is an Ethernet frame carrying an IPv4/UDP packet of ipLen bytes.
func rvIPv4(dst, src frame.MAC, from, to [4]byte, ipLen int) []byte {
	b := make([]byte, frame.EthHdrLen+ipLen)
	frame.PutEthernet(b, frame.EthHeader{Dst: dst, Src: src, EtherType: frame.EtherTypeIPv4})
	ip := b[frame.EthHdrLen:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:4], uint16(ipLen))
	binary.BigEndian.PutUint16(ip[6:8], 0x4000) // DF
	ip[8], ip[9] = 64, 17
	copy(ip[12:16], from[:])
	copy(ip[16:20], to[:])
	return b
}

// rvIPv6 is an Ethernet frame carrying an IPv6/UDP packet of ipLen bytes.
func rvIPv6(dst, src frame.MAC, from, to netip.Addr, ipLen int) []byte {
	b := make([]byte, frame.EthHdrLen+ipLen)
	frame.PutEthernet(b, frame.EthHeader{Dst: dst, Src: src, EtherType: frame.EtherTypeIPv6})
	ip := b[frame.EthHdrLen:]
	binary.BigEndian.PutUint32(ip[0:4], 6<<28)
	binary.BigEndian.PutUint16(ip[4:6], uint16(ipLen-40))
	ip[6], ip[7] = 17, 64
	f16, t16 := from.As16(), to.As16()
	copy(ip[8:24], f16[:])
	copy(ip[24:40], t16[:])
	return b
}

// rvFakeGID is a port GID no device of the soft fabric has (their GIDs
// are fe80::<index>): CM requests to it are never answered.
func rvFakeGID(k int) hca.GID {
	var g hca.GID
	g[0], g[1], g[8] = 0xfe, 0x80, 0xaa
	binary.BigEndian.PutUint32(g[12:], uint32(k))
	return g
}

func rvIsIPv4(f []byte) bool {
	return len(f) > frame.EthHdrLen && binary.BigEndian.Uint16(f[12:14]) == frame.EtherTypeIPv4
}

func TestOwnEchoIsNotAnRXDrop(t *testing.T) {
	var c counters
	c.drop(dropRxOwnEcho)
	c.drop(dropRxBadIP)
	c.drop(dropTxVLAN)
	if got := c.drops[dropRxOwnEcho].Load(); got != 1 {
		t.Fatalf("rx_own_echo = %d, want 1", got)
	}
	if rx, tx := c.rxDropped.Load(), c.txDropped.Load(); rx != 1 || tx != 1 {
		t.Fatalf("rx_dropped %d tx_dropped %d, want 1 and 1 (own echo is not a loss)", rx, tx)
	}
}
