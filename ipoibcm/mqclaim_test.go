package ipoibcm

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// TestClaimTakenByPosts: a reader's sends take their credits out of its
// batch's claim, so a posted frame is counted once, in outstanding, and
// never also as claimed: outstanding and claims together stay within the
// send queue at every post, or another reader (and the control loop's ARP
// re-probe, which reads creditsFree) would see credits as taken twice. A
// lone reader claims nothing at all: with one queue the credits are
// counted exactly as before claims existed.
func TestClaimTakenByPosts(t *testing.T) {
	const sendq, frames = 8, 6
	for _, queues := range []int{1, 2} {
		t.Run(fmt.Sprintf("queues=%d", queues), func(t *testing.T) {
			dev := newWrapDevice(t, rvFabric(t, 51), "a")
			port := newMQPort(1, queues)
			var tx atomic.Pointer[txPath]
			var posts, over, claimed atomic.Int64
			dev.beforePost = func(ctx any, _ []hca.SendWR) {
				p := tx.Load()
				if _, ud := ctx.(*udQP); !ud || p == nil {
					return
				}
				posts.Add(1)
				c, o := p.claimed.Load(), p.outstanding.Load()
				if c+o > int64(p.sendq) {
					over.Store(c + o)
				}
				if c > 0 {
					claimed.Store(c)
				}
			}
			ifc := testInterface(t, dev, port, "a", func(c *Config) {
				c.Mode = ModeDatagram
				c.SendQueueSize = sendq
			})
			tx.Store(&ifc.tx)
			// Read in one batch: the port hands over all it holds.
			bcast := frame.MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
			for seq := range frames {
				port.qs[0].in <- metaFrame{b: udpFlowFrame(bcast, port.HostMAC(), 7000, byte(seq))}
			}
			startTest(t, ifc)
			for start := time.Now(); posts.Load() < frames; time.Sleep(time.Millisecond) {
				if time.Since(start) > 5*time.Second {
					t.Fatalf("%d of %d broadcast frames posted", posts.Load(), frames)
				}
			}
			if c := over.Load(); c != 0 {
				t.Errorf("outstanding and claimed reached %d of %d credits: posted frames counted twice", c, sendq)
			}
			if c := claimed.Load(); queues == 1 && c != 0 {
				t.Errorf("a lone reader claimed %d credits", c)
			}
		})
	}
}
