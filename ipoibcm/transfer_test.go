package ipoibcm

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca/soft"
)

// patternReader produces a deterministic byte stream.
type patternReader struct {
	rng  *rand.ChaCha8
	left int64
}

func newPattern(seed byte, n int64) *patternReader {
	return &patternReader{rng: rand.NewChaCha8([32]byte{seed}), left: n}
}

func (p *patternReader) Read(b []byte) (int, error) {
	if p.left == 0 {
		return 0, io.EOF
	}
	if int64(len(b)) > p.left {
		b = b[:p.left]
	}
	n, _ := p.rng.Read(b)
	p.left -= int64(n)
	return n, nil
}

// tcpTransfer sends n pattern bytes from a to b's port and checks every
// byte on arrival. during, if set, runs once a quarter has arrived.
func tcpTransfer(t testing.TB, a, b *testNode, dst netip.Addr, n int64, during func()) time.Duration {
	t.Helper()
	b.nextPort++
	port := 5000 + b.nextPort
	ln, err := b.host.ListenTCP(port)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	errc := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			errc <- err
			return
		}
		defer c.Close()
		want := newPattern(7, n)
		got := make([]byte, 256<<10)
		exp := make([]byte, 256<<10)
		var total int64
		fired := during == nil
		for total < n {
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			k, err := c.Read(got)
			if k > 0 {
				io.ReadFull(want, exp[:k])
				if !bytes.Equal(got[:k], exp[:k]) {
					errc <- io.ErrUnexpectedEOF
					return
				}
				total += int64(k)
				if !fired && total >= n/4 {
					fired = true
					during()
				}
			}
			if err != nil {
				if err == io.EOF && total == n {
					break
				}
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	start := time.Now()
	c, err := a.host.DialTCP(ctxT(t, 20*time.Second), netip.AddrPortFrom(dst, port))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(c, newPattern(7, n)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("receiver: %v", err)
		}
	case <-time.After(120 * time.Second):
		t.Fatal("transfer timed out")
	}
	return time.Since(start)
}

func TestTCP64MiB(t *testing.T) {
	const n = 64 << 20
	for _, tc := range []struct {
		name   string
		mode   Mode
		v6     bool
		inline bool
	}{
		{"connected-v4", ModeConnected, false, false}, {"datagram-v4", ModeDatagram, false, false}, {"connected-v6", ModeConnected, true, false},
		// Config.InlineRX: the sender's goroutine polls the receiver's RX
		// CQ (the soft fabric raises its completion event inline).
		{"connected-v4-inline", ModeConnected, false, true}, {"datagram-v6-inline", ModeDatagram, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tn := newTestNet(t, 2, soft.Config{Seed: 2}, func(k int, c *Config) { c.Mode, c.InlineRX = tc.mode, tc.inline })
			a, b := tn.nodes[0], tn.nodes[1]
			dst := b.v4
			if tc.v6 {
				dst = b.v6
			}
			d := tcpTransfer(t, a, b, dst, n, nil)
			t.Logf("%s: %d MiB in %v = %.2f Gbit/s", tc.name, n>>20, d, float64(n)*8/d.Seconds()/1e9)
			st := a.ifc.Stats()
			if tc.mode == ModeConnected && (len(st.TXConns) != 1 || st.TXConns[0].Packets == 0) {
				t.Fatalf("connected mode without a used TX connection: %+v", st.TXConns)
			}
			t.Logf("a: %+v drops %v", st.Counters, st.Drops)
			rx := b.ifc.Stats().NAPI.RX
			if tc.inline != (rx.InlinePolls > 0) {
				t.Fatalf("InlineRX %v, receiver's RX polls %+v", tc.inline, rx)
			}
			t.Logf("b rx: %d polls, %d inline, %d completions deferred to the poller", rx.Polls, rx.InlinePolls, rx.Deferred)
		})
	}
}
