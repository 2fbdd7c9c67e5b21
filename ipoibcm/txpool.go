package ipoibcm

import (
	"fmt"
	"sync"

	"github.com/ipoibcm/ipoib/hca"
)

// txPool holds the registered buffers host frames are read into and sent
// from. A buffer is taken before ReadFrames and stays taken while its send
// is posted or parked; the send completion gives it back. With the global
// credit limit of SendQueueSize outstanding, SendQueueSize+batch buffers
// always leave a full batch to read into.
type txPool struct {
	bufs [][]byte
	// lens[k] is the IPoIB message length posted from buffer k: written
	// before PostSend, read after its completion is polled.
	lens []int

	mu   sync.Mutex
	free []int // stack of free indices
}

func newTXPool(dev hca.Device, count, size int) (*txPool, error) {
	p := &txPool{bufs: make([][]byte, count), lens: make([]int, count), free: make([]int, 0, count)}
	for k := range p.bufs {
		b, err := dev.Alloc(size)
		if err != nil {
			return nil, fmt.Errorf("tx pool buffer %d of %d bytes: %w", k, size, err)
		}
		p.bufs[k] = b
		p.free = append(p.free, count-1-k)
	}
	return p, nil
}

// take moves up to len(into) free indices into into and returns how many:
// the most recently freed first. A batch read usually fills only its first
// buffers, so those must be the ones still in the cache; handing out the
// n-th most recent first rotated every frame through n buffers (4 MiB of
// 64 KiB buffers at a 64-frame batch), and the copy out of the host paid a
// cache miss per line.
func (p *txPool) take(into []int) int {
	p.mu.Lock()
	n := min(len(into), len(p.free))
	top := len(p.free) - 1
	for k := range n {
		into[k] = p.free[top-k]
	}
	p.free = p.free[:len(p.free)-n]
	p.mu.Unlock()
	return n
}

// put returns buffers; idx[0] is the next one take hands out, so putting
// back what take gave restores the pool's order.
func (p *txPool) put(idx ...int) {
	p.mu.Lock()
	for k := len(idx) - 1; k >= 0; k-- {
		p.free = append(p.free, idx[k])
	}
	p.mu.Unlock()
}

func (p *txPool) put1(idx int) {
	p.mu.Lock()
	p.free = append(p.free, idx)
	p.mu.Unlock()
}

func (p *txPool) available() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.free)
}
