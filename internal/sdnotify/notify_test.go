package sdnotify

import (
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// listen opens a real unix datagram socket, as systemd does for a
// Type=notify unit, and returns a function that reads one datagram.
func listen(t *testing.T, name string) func() string {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return func() string {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 4096)
		n, err := c.Read(b)
		if err != nil {
			t.Fatal(err)
		}
		return string(b[:n])
	}
}

func TestSendPathAndAbstract(t *testing.T) {
	for _, name := range []string{filepath.Join(t.TempDir(), "notify"), "@ipoib-sdnotify-test-" + t.Name()} {
		read := listen(t, name)
		n, err := New(name)
		if err != nil {
			t.Fatal(err)
		}
		if !n.Enabled() {
			t.Fatal("not enabled")
		}
		if err := n.Send(Ready, Status("2 peers\nconnected")); err != nil {
			t.Fatal(err)
		}
		if got, want := read(), "READY=1\nSTATUS=2 peers connected\n"; got != want {
			t.Fatalf("%s: got %q, want %q", name, got, want)
		}
	}
}

func TestNoSocket(t *testing.T) {
	n, err := New("")
	if err != nil || n.Enabled() {
		t.Fatalf("New(\"\") = %v, %v", n.Enabled(), err)
	}
	if err := n.Send(Ready); !errors.Is(err, ErrNoSocket) {
		t.Fatalf("Send without a socket: %v", err)
	}
	if _, err := New("relative/path"); err == nil {
		t.Fatal("a relative NOTIFY_SOCKET was accepted")
	}
	// A socket nobody listens on is an error the caller may log.
	n, _ = New(filepath.Join(t.TempDir(), "gone"))
	if err := n.Send(Ready); err == nil {
		t.Fatal("send to a missing socket succeeded")
	}
}
