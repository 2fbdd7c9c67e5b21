package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/ipoibcm/ipoib/tap/netstack"
)

// Addresses of the two in-process hosts: A sends, B receives. A link
// factory that needs them (to pre-seed neighbours, say) may rely on them.
var (
	InProcAddrA = netip.MustParsePrefix("10.77.0.1/24")
	InProcAddrB = netip.MustParsePrefix("10.77.0.2/24")
)

// inprocPort is the TCP port B listens on.
const inprocPort = 5201

// ErrShortTransfer is returned when the receiver saw fewer bytes than sent.
var ErrShortTransfer = errors.New("receiver got fewer bytes than sent")

// Result is one in-process TCP measurement. Elapsed runs from the
// established connection to the receiver reading the last byte.
type Result struct {
	Bytes   int64         `json:"bytes"`
	Elapsed time.Duration `json:"elapsed_ns"`
	Gbps    float64       `json:"gbps"`
	// TxSuperFrames and RxSuperFrames are the GSO super frames the sender
	// handed its link whole and the receiver was given whole
	// (netstack.Counters): non-zero when the link used offloads.
	TxSuperFrames uint64 `json:"tx_super_frames"`
	RxSuperFrames uint64 `json:"rx_super_frames"`
}

func (r Result) String() string {
	return fmt.Sprintf("%d bytes in %v: %.2f Gbit/s", r.Bytes, r.Elapsed.Round(time.Microsecond), r.Gbps)
}

// LinkFactory joins two hosts so that frames from each reach the other:
// DirectLink, or two IPoIB engines over a fabric with the hosts as their
// host ports. stop undoes it and returns once everything it started has
// stopped; the hosts are closed by the caller afterwards, and closing them
// twice is harmless.
type LinkFactory func(a, b *netstack.Host) (stop func(), err error)

// DirectLink is the baseline LinkFactory: the hosts back to back in memory
// (netstack.Link).
func DirectLink(a, b *netstack.Host) (func(), error) {
	return netstack.Link(a, b), nil
}

// DirectLinkOffloads is DirectLink with the frames' offload metadata
// carried across (netstack.LinkOffloads): with host GSO on, TCP super
// frames cross whole.
func DirectLinkOffloads(a, b *netstack.Host) (func(), error) {
	return netstack.LinkOffloads(a, b)
}

// InProcConfig describes one in-process TCP run.
type InProcConfig struct {
	Bytes int64
	MTU   int
	Link  LinkFactory
	// Host is the template for both hosts (QueueLen, GSO, TCP tuning);
	// MAC, Addrs and MTU are set per host.
	Host netstack.Config
	// WriteSize is the size of each sender Write (default 256 KiB).
	WriteSize int
}

// InProcTCP measures TCP throughput between two netstack hosts at the
// given MTU over whatever link joins them, with default host settings.
func InProcTCP(ctx context.Context, bytes int64, mtu int, link LinkFactory) (Result, error) {
	return RunInProcTCP(ctx, InProcConfig{Bytes: bytes, MTU: mtu, Link: link})
}

// RunInProcTCP is InProcTCP with every knob exposed.
func RunInProcTCP(ctx context.Context, cfg InProcConfig) (Result, error) {
	if cfg.Bytes <= 0 {
		return Result{}, fmt.Errorf("inproc tcp: byte count %d must be positive", cfg.Bytes)
	}
	if cfg.Link == nil {
		return Result{}, errors.New("inproc tcp: no link factory")
	}
	if cfg.WriteSize <= 0 {
		cfg.WriteSize = 256 << 10
	}
	ca, cb := cfg.Host, cfg.Host
	ca.MTU, cb.MTU = cfg.MTU, cfg.MTU
	ca.MAC, cb.MAC = nil, nil
	ca.Addrs = []netip.Prefix{InProcAddrA}
	cb.Addrs = []netip.Prefix{InProcAddrB}
	a, err := netstack.New(ca)
	if err != nil {
		return Result{}, fmt.Errorf("inproc tcp: host A: %w", err)
	}
	defer a.Close()
	b, err := netstack.New(cb)
	if err != nil {
		return Result{}, fmt.Errorf("inproc tcp: host B: %w", err)
	}
	defer b.Close()
	stop, err := cfg.Link(a, b)
	if err != nil {
		return Result{}, fmt.Errorf("inproc tcp: link: %w", err)
	}
	defer stop()
	res, err := measureTCP(ctx, a, b, cfg.Bytes, cfg.WriteSize)
	res.TxSuperFrames, res.RxSuperFrames = a.Counters().TxSuperFrames, b.Counters().RxSuperFrames
	return res, err
}

// measureTCP sends n bytes from a to b and times them.
func measureTCP(ctx context.Context, a, b *netstack.Host, n int64, writeSize int) (Result, error) {
	l, err := b.ListenTCP(inprocPort)
	if err != nil {
		return Result{}, fmt.Errorf("inproc tcp: %w", err)
	}
	defer l.Close()

	type received struct {
		n   int64
		at  time.Time
		err error
	}
	done := make(chan received, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			done <- received{err: err}
			return
		}
		defer c.Close()
		stopOnCancel := context.AfterFunc(ctx, func() { c.Close() })
		defer stopOnCancel()
		got, err := io.CopyBuffer(io.Discard, c, make([]byte, writeSize))
		done <- received{n: got, at: time.Now(), err: err}
	}()

	c, err := a.DialTCP(ctx, netip.AddrPortFrom(InProcAddrB.Addr(), inprocPort))
	if err != nil {
		l.Close()
		<-done
		return Result{}, fmt.Errorf("inproc tcp: %w", err)
	}
	start := time.Now()
	sendErr := send(ctx, c, n, writeSize)
	c.Close()
	if sendErr != nil {
		l.Close()
		<-done
		return Result{}, fmt.Errorf("inproc tcp: send: %w", sendErr)
	}
	var r received
	select {
	case r = <-done:
	case <-ctx.Done():
		l.Close()
		<-done
		return Result{}, fmt.Errorf("inproc tcp: receive: %w", ctx.Err())
	}
	if r.err != nil {
		return Result{}, fmt.Errorf("inproc tcp: receive: %w", r.err)
	}
	if r.n != n {
		return Result{}, fmt.Errorf("inproc tcp: %w: %d of %d", ErrShortTransfer, r.n, n)
	}
	elapsed := r.at.Sub(start)
	return Result{Bytes: n, Elapsed: elapsed, Gbps: gbps(n, elapsed)}, nil
}

// send writes n bytes to c in writeSize chunks, giving up when ctx ends.
func send(ctx context.Context, c net.Conn, n int64, writeSize int) error {
	stopOnCancel := context.AfterFunc(ctx, func() { c.Close() })
	defer stopOnCancel()
	buf := make([]byte, writeSize)
	for left := n; left > 0; {
		w, err := c.Write(buf[:min(int64(len(buf)), left)])
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		left -= int64(w)
	}
	return nil
}

func gbps(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) * 8 / d.Seconds() / 1e9
}
