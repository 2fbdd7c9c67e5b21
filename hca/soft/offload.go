package soft

import (
	"fmt"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/offload"
)

// offloads is what every device of the fabric reports: a ConnectX's
// unless Config.NoOffloads models an HCA without them.
func (f *Fabric) offloads() (o hca.Offloads) {
	if !f.cfg.NoOffloads {
		o = hca.ConnectXOffloads()
	}
	return o
}

// csumPartial is the receive flag of a send that asked for checksum
// offload (SendIPCsum or LSO): the fabric computes nothing and says so,
// for a message that is a TCP/UDP packet at all.
func csumPartial(wr *hca.SendWR) hca.WCFlags {
	if wr.Flags&hca.SendIPCsum == 0 && wr.MSS == 0 {
		return 0
	}
	if _, err := offload.Parse(wr.Data, hca.OffloadL3Offset); err != nil {
		return 0
	}
	return hca.WCCsumPartial
}

// checkRCOffload refuses what an RC send cannot ask for: LSO (a UD
// operation) and checksum offload on a device without it.
func (f *Fabric) checkRCOffload(wr *hca.SendWR) error {
	if wr.MSS > 0 {
		return fmt.Errorf("send WR %d: LSO on an RC QP: %w", wr.ID, hca.ErrInvalidArgument)
	}
	if wr.Flags&hca.SendIPCsum != 0 && !f.offloads().IPCsum {
		return fmt.Errorf("send WR %d: IP checksum offload: %w", wr.ID, hca.ErrNotSupported)
	}
	return nil
}
