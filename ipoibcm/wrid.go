package ipoibcm

// Work request ids: the kind in the top byte, a buffer index below. The
// drain WR has the reserved id wrDrain (Linux IPOIB_CM_RX_DRAIN_WRID),
// which no other kind can produce because every other id has a non-zero
// kind byte.
const (
	wrKindShift = 56
	wrIndexMask = 1<<32 - 1

	wrKindUDRecv   uint64 = 1 // UD receive ring
	wrKindSRQRecv  uint64 = 2 // SRQ buffers (passive RC connections)
	wrKindConnRecv uint64 = 3 // per-connection ring (no SRQ)
	wrKindSend     uint64 = 4 // TX pool buffer

	wrDrain uint64 = 0xffffffff
)

func wrID(kind uint64, index int) uint64 { return kind<<wrKindShift | uint64(index)&wrIndexMask }

func wrKind(id uint64) uint64 { return id >> wrKindShift }

func wrIndex(id uint64) int { return int(id & wrIndexMask) }

// lruCheck reports whether a receive of buffer index idx should look at the
// connection's LRU stamp: one buffer in four, like IPOIB_CM_RX_UPDATE_MASK,
// keeps even the clock read off most packets.
func lruCheck(idx int) bool { return idx&3 == 0 }
