package ipoibcm

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
)

// memPort is a trivial in-memory HostPort: frames pushed on in are read by
// the engine; frames the engine writes go to onWrite (which must copy).
type memPort struct {
	mac     net.HardwareAddr
	in      chan []byte
	onWrite func(frames [][]byte)
	closed  chan struct{}
	once    sync.Once
	mtu     atomic.Int64
	up      atomic.Bool
}

func newMemPort(mac byte, onWrite func([][]byte)) *memPort {
	return &memPort{
		mac: net.HardwareAddr{0x02, 0, 0, 0, 0xee, mac}, in: make(chan []byte, 1024),
		onWrite: onWrite, closed: make(chan struct{}),
	}
}

func (p *memPort) ReadFrames(bufs [][]byte, sizes []int) (int, error) {
	var f []byte
	select {
	case f = <-p.in:
	case <-p.closed:
		return 0, fmt.Errorf("mem port: %w", net.ErrClosed)
	}
	n := 0
	for {
		sizes[n] = copy(bufs[n], f)
		n++
		if n == len(bufs) {
			return n, nil
		}
		select {
		case f = <-p.in:
		default:
			return n, nil
		}
	}
}

func (p *memPort) WriteFrames(frames [][]byte) (int, error) {
	if p.onWrite != nil {
		p.onWrite(frames)
	}
	return len(frames), nil
}

func (p *memPort) BatchSize() int            { return 64 }
func (p *memPort) HostMAC() net.HardwareAddr { return p.mac }
func (p *memPort) SetMTU(mtu int) error      { p.mtu.Store(int64(mtu)); return nil }
func (p *memPort) SetLinkUp(up bool) error   { p.up.Store(up); return nil }
func (p *memPort) Close() error              { p.once.Do(func() { close(p.closed) }); return nil }
