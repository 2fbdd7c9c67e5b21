package ipoibcm

import (
	"io"
	"net/netip"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca/soft"
	"github.com/ipoibcm/ipoib/tap/netstack"
)

// BenchmarkTCP measures TCP throughput between two gVisor hosts: over ib0
// in connected and datagram mode, and joined directly by an in-memory link
// of the same MTU (the baseline of the "ib0 >= 0.8 x direct" target).
func BenchmarkTCP(b *testing.B) {
	const chunk = 32 << 20
	b.Run("direct-65520", func(b *testing.B) {
		var nodes [2]*testNode
		for k := range nodes {
			v4, v6 := nodeAddrs(k)
			h, err := netstack.New(netstack.Config{Addrs: []netip.Prefix{netip.PrefixFrom(v4, 24), netip.PrefixFrom(v6, 64)}, MTU: 65520})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { h.Close() })
			nodes[k] = &testNode{host: h, v4: v4, v6: v6}
		}
		stop := netstack.Link(nodes[0].host, nodes[1].host)
		defer stop()
		runTCPBench(b, nodes[0], nodes[1], chunk)
	})
	for _, mode := range []Mode{ModeConnected, ModeDatagram} {
		b.Run("ib0-"+mode.String(), func(b *testing.B) {
			// Newest-first receive, as 'ipoib fabric' and 'ipoib bench'
			// use: the fabric's copy stands in for DMA and should not
			// cycle through every SRQ buffer's cache lines.
			fab := soft.Config{Seed: 13, ReceiveOrder: soft.ReceiveNewestFirst}
			tn := newTestNet(b, 2, fab, func(k int, c *Config) { c.Mode = mode })
			runTCPBench(b, tn.nodes[0], tn.nodes[1], chunk)
		})
	}
}

// runTCPBench streams b.N chunks over one TCP connection, unchecked (the
// byte-exact transfers live in the tests): what is measured is stacks plus
// link, not a pattern generator.
func runTCPBench(b *testing.B, x, y *testNode, chunk int64) {
	tcpTransfer(b, x, y, y.v4, 1<<20, nil) // resolve, connect, warm up
	ln, err := y.host.ListenTCP(6001)
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	done := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- -1
			return
		}
		n, _ := io.Copy(io.Discard, c)
		c.Close()
		done <- n
	}()
	c, err := x.host.DialTCP(ctxT(b, 10*time.Second), netip.AddrPortFrom(y.v4, 6001))
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	b.SetBytes(chunk)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		for sent := int64(0); sent < chunk; sent += int64(len(buf)) {
			if _, err := c.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
	}
	c.Close()
	n := <-done
	elapsed := time.Since(start)
	b.StopTimer()
	if n != int64(b.N)*chunk {
		b.Fatalf("received %d of %d bytes", n, int64(b.N)*chunk)
	}
	b.ReportMetric(float64(n)*8/elapsed.Seconds()/1e9, "Gbit/s")
}
