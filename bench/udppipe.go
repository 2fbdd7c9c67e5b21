package bench

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
)

// MaxUDPPipeFrame is the largest frame one IPv4 UDP datagram carries
// (65535 - 20 - 8): the udp-pipe baseline caps the TAP MTU at this minus
// the 14-byte Ethernet header.
const MaxUDPPipeFrame = 65507

// UDPPipe is one end of the udp-pipe baseline: every frame read from the
// port goes to the peer as one UDP datagram, and every datagram received
// is written to the port as one frame. Two of them, in two namespaces
// joined by a veth pair, measure what ib0 over RoCEv2 costs beyond a bare
// userspace hop over the same UDP path: no reliability, no segmentation
// (large datagrams are fragmented by the kernel), no IPoIB.
type UDPPipe struct {
	port      FramePort
	conn      *net.UDPConn
	peer      netip.AddrPort
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error

	// Counters per direction: [0] port->UDP, [1] UDP->port.
	Frames [2]atomic.Uint64
	Errors [2]atomic.Uint64
}

// NewUDPPipe starts the two copy loops; maxFrame is the largest frame
// (MTU + 14), at most MaxUDPPipeFrame. The pipe owns port and conn.
func NewUDPPipe(port FramePort, conn *net.UDPConn, peer netip.AddrPort, maxFrame int) (*UDPPipe, error) {
	if maxFrame <= 0 || maxFrame > MaxUDPPipeFrame {
		return nil, fmt.Errorf("udp-pipe: frame size %d not in 1..%d", maxFrame, MaxUDPPipeFrame)
	}
	p := &UDPPipe{port: port, conn: conn, peer: peer}
	p.wg.Add(2)
	go p.toUDP(maxFrame)
	go p.fromUDP(maxFrame)
	return p, nil
}

func (p *UDPPipe) toUDP(maxFrame int) {
	defer p.wg.Done()
	n := max(p.port.BatchSize(), 1)
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, maxFrame)
	}
	sizes := make([]int, n)
	for {
		got, err := p.port.ReadFrames(bufs, sizes)
		if err != nil {
			return // closed
		}
		for i := range got {
			if _, err := p.conn.WriteToUDPAddrPort(bufs[i][:sizes[i]], p.peer); err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				p.Errors[0].Add(1) // like a wire's loss
				continue
			}
			p.Frames[0].Add(1)
		}
	}
}

func (p *UDPPipe) fromUDP(maxFrame int) {
	defer p.wg.Done()
	buf := make([]byte, maxFrame+1)
	frames := make([][]byte, 1)
	for {
		n, _, err := p.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			p.Errors[1].Add(1)
			continue
		}
		if n > maxFrame {
			p.Errors[1].Add(1) // larger than any frame the port takes
			continue
		}
		frames[0] = buf[:n]
		if w, err := p.port.WriteFrames(frames); err != nil || w != 1 {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			p.Errors[1].Add(1)
			continue
		}
		p.Frames[1].Add(1)
	}
}

// Close closes the socket and the port, which ends both loops, and waits
// for them.
func (p *UDPPipe) Close() error {
	p.closeOnce.Do(func() {
		p.closeErr = errors.Join(p.conn.Close(), p.port.Close())
		p.wg.Wait()
	})
	return p.closeErr
}
