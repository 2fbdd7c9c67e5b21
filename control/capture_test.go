package control

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// capturingEndpoint writes a pcapng stream of one packet per "message",
// its payload a line naming it, until its count or the end of ctx, and
// says how the capture ended.
type capturingEndpoint struct {
	*fakeEndpoint
	started chan struct{}
	ended   chan string
}

func (c *capturingEndpoint) Capture(ctx context.Context, req CaptureRequest, w io.Writer) error {
	c.started <- struct{}{}
	pw, err := wire.NewPcapngWriter(w, "test", []wire.PcapngInterface{{Name: "fabric", LinkType: wire.LinkTypeRaw}})
	if err != nil {
		c.ended <- "write error"
		return err
	}
	for n := uint64(0); req.Count == 0 || n < req.Count; n++ {
		if err := pw.WritePacket(0, time.Now(), fmt.Appendf(nil, "pkt %d kind %s qpn %d\n", n, req.Kind, req.QPN), ""); err != nil {
			c.ended <- "write error"
			return err
		}
		select {
		case <-ctx.Done():
			c.ended <- "ctx"
			return nil
		default:
		}
		if req.Count == 0 {
			select {
			case <-ctx.Done():
				c.ended <- "ctx"
				return nil
			case <-time.After(time.Millisecond): // a paced source, like traffic
			}
		}
	}
	c.ended <- "count"
	return nil
}

// capturedLines reads a capture stream back: the packets' payloads,
// concatenated; a stream that is not whole pcapng blocks fails the test.
func capturedLines(t *testing.T, b []byte) string {
	t.Helper()
	r, err := wire.NewPcapReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for {
		data, _, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out.String()
		}
		if err != nil {
			t.Fatalf("capture stream: %v", err)
		}
		out.Write(data)
	}
}

func TestCaptureStreamsOverTheSocket(t *testing.T) {
	h1 := &capturingEndpoint{fakeEndpoint: newFake("ipoib-h1"), started: make(chan struct{}, 8), ended: make(chan string, 8)}
	plain := newFake("ipoib-h2")
	srv, dir := startServer(t, h1, plain)

	var out bytes.Buffer
	info, n, err := Capture(context.Background(), dir, "ipoib-h1", CaptureRequest{Kind: "cm", QPN: 7, Count: 3}, &out)
	if err != nil || info.Host != "ipoib-h1" || n != int64(out.Len()) {
		t.Fatalf("capture: %v %+v %d", err, info, n)
	}
	if want := "pkt 0 kind cm qpn 7\npkt 1 kind cm qpn 7\npkt 2 kind cm qpn 7\n"; capturedLines(t, out.Bytes()) != want {
		t.Fatalf("stream %q, want %q", capturedLines(t, out.Bytes()), want)
	}
	if how := <-h1.ended; how != "count" {
		t.Fatalf("capture ended by %s", how)
	}

	// The duration ends an unbounded capture.
	out.Reset()
	if _, _, err := Capture(context.Background(), dir, "ipoib-h1", CaptureRequest{DurationMS: 30}, &out); err != nil {
		t.Fatal(err)
	}
	if how, got := <-h1.ended, capturedLines(t, out.Bytes()); how != "ctx" || !strings.HasPrefix(got, "pkt 0 kind  qpn 0\n") {
		t.Fatalf("duration capture ended by %s with %q", how, got)
	}

	// The client interrupted (ctx) asks the server to end it, as a count
	// or a duration would: the server's capture ends by its ctx, not by a
	// failed write, and the stream ends at a block.
	for len(h1.started) > 0 {
		<-h1.started
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	out.Reset()
	go func() {
		_, _, err := Capture(ctx, dir, "ipoib-h1", CaptureRequest{}, &out)
		done <- err
	}()
	<-h1.started
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("cancelled capture: %v", err)
	}
	capturedLines(t, out.Bytes())
	select {
	case how := <-h1.ended:
		if how != "ctx" {
			t.Fatalf("server side ended by %s", how)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the server's capture outlived the client")
	}

	for _, c := range []struct {
		host, want string
	}{
		{"", "name one with host"},
		{"ipoib-h2", "cannot capture"},
		{"ipoib-h9", "no such host"},
	} {
		if _, _, err := Capture(context.Background(), dir, c.host, CaptureRequest{}, io.Discard); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("capture of %q: %v, want %q", c.host, err, c.want)
		}
	}
	if _, err := ParseRequest([]byte(`{"op":"capture","capture":{"kind":"video"}}`)); !errors.Is(err, ErrProtocol) {
		t.Errorf("bad kind accepted: %v", err)
	}

	// Close ends a running capture.
	for len(h1.started) > 0 {
		<-h1.started
	}
	go Capture(context.Background(), dir, "ipoib-h1", CaptureRequest{}, io.Discard)
	<-h1.started
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if how := <-h1.ended; how != "ctx" && how != "write error" {
		t.Fatalf("capture at Close ended by %s", how)
	}
}
