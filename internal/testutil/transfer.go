package testutil

import (
	"crypto/sha256"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"
)

// TCPTransfer accepts one connection on ln, sends size pseudo-random
// bytes over the connection
// dial opens, and checks that the receiver read exactly them (SHA-256);
// it returns the time the transfer took. The whole transfer must finish
// within timeout. The caller opens ln and dials where it likes (each in
// its own network namespace).
func TCPTransfer(t testing.TB, ln net.Listener, dial func() (net.Conn, error), size int, timeout time.Duration) time.Duration {
	t.Helper()
	type result struct {
		sum [32]byte
		n   int64
		err error
	}
	got := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- result{err: err}
			return
		}
		defer c.Close()
		h := sha256.New()
		n, err := io.Copy(h, c)
		r := result{n: n, err: err}
		copy(r.sum[:], h.Sum(nil))
		got <- r
	}()
	c, err := dial()
	if err != nil {
		ln.Close() // ends the Accept
		<-got
		t.Fatalf("dial %v: %v", ln.Addr(), err)
	}
	r := rand.New(rand.NewPCG(uint64(size), 11))
	chunk := make([]byte, min(size, 1<<20))
	h := sha256.New()
	start := time.Now()
	c.SetDeadline(start.Add(timeout))
	for sent := 0; sent < size; {
		for k := 0; k+8 <= len(chunk); k += 8 {
			binary.LittleEndian.PutUint64(chunk[k:], r.Uint64())
		}
		b := chunk[:min(len(chunk), size-sent)]
		h.Write(b)
		if _, err := c.Write(b); err != nil {
			c.Close()
			t.Fatalf("write at %d: %v", sent, err)
		}
		sent += len(b)
	}
	c.Close()
	var want [32]byte
	copy(want[:], h.Sum(nil))
	select {
	case res := <-got:
		if res.err != nil || res.n != int64(size) || res.sum != want {
			t.Fatalf("received %d bytes (err %v), sha %x; sent %d, sha %x", res.n, res.err, res.sum[:8], size, want[:8])
		}
	case <-time.After(timeout):
		t.Fatal("transfer did not finish")
	}
	return time.Since(start)
}
