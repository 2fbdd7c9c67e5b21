package ipoibcm

import (
	"fmt"

	"github.com/ipoibcm/ipoib/ipoibcm/frame"
)

// modeMTU is the IP MTU of mode m: the configured MTU, capped by what the
// mode can carry.
func (i *Interface) modeMTU(m Mode) int {
	mtu := i.cfg.MTU
	if m == ModeConnected {
		if mtu <= 0 || mtu > frame.CMMTU {
			mtu = frame.CMMTU
		}
		return mtu
	}
	if mtu <= 0 || mtu > i.udMTU {
		mtu = i.udMTU
	}
	return mtu
}

// switchMode (control loop): flush every TX connection, switch, tell the
// host the new MTU (Linux ipoib_set_mode + ipoib_flush_paths). Switching
// to the current mode only retries telling the host, if that failed.
//
// A smaller MTU reaches the host before the engine switches: frames the
// host builds from then on fit the new path, and those it had queued at
// the old MTU are the host's to cut (tap/netstack does) or to have
// answered with ICMP. Switching first would drop, with ICMP, every frame
// read in between: the tail of each running TCP flight, which gVisor's TCP
// then recovers at two segments per retransmission timeout (20 s and more
// in TestModeSwitchDuringTCP). A larger MTU goes the other way round, so
// the host never sends what the engine would still refuse.
func (i *Interface) switchMode(m Mode) error {
	if Mode(i.mode.Load()) == m {
		if i.hostMTUStale {
			return i.tellHostMTU(m, i.MTU())
		}
		return nil
	}
	i.ifCtr.modeSwitches.Add(1)
	newMTU := i.modeMTU(m)
	lowerFirst := newMTU < i.MTU()
	var hostErr error
	if lowerFirst {
		hostErr = i.tellHostMTU(m, newMTU)
	}
	i.mode.Store(int32(m))
	i.mtu.Store(int64(newMTU))
	// Connections a frame resolved in the old mode may have started are
	// in the set once the reader's batch is over.
	i.tx.windows.quiesce()
	for _, tc := range i.active.snapshot() {
		tc.teardown()
	}
	// What the host may hand us follows the mode (offloads.go, modeCaps);
	// super frames it built before it heard are cut in software.
	i.off.advertise(m, i.log)
	if !lowerFirst {
		hostErr = i.tellHostMTU(m, newMTU)
	}
	return hostErr
}

// tellHostMTU gives the host mtu, the MTU of mode m (control loop). A failure
// does not undo the switch: connections are already flushed, and a host
// still at the old MTU only costs ICMP frag-needed / packet-too-big for its
// oversize packets (hostReader.unicastLocked answers them), whereas switching back
// could fail the same way and leave mode and MTU inconsistent.
func (i *Interface) tellHostMTU(m Mode, mtu int) error {
	if err := i.host.SetMTU(mtu); err != nil {
		i.hostMTUStale = true
		i.log.Warn("mode switched, host MTU not updated", "mode", m, "mtu", mtu, "err", err)
		return fmt.Errorf("%s: %w (mode %s, MTU %d): %w", i.cfg.Name, ErrHostMTUNotUpdated, m, mtu, err)
	}
	i.hostMTUStale = false
	i.log.Info("mode", "mode", m, "mtu", mtu)
	return nil
}
