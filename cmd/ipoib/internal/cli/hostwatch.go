package cli

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/ipoibcm/ipoib/control"
	"github.com/ipoibcm/ipoib/ipoibcm"
	"github.com/ipoibcm/ipoib/tap"
)

// hostView follows what the host does to its TAP (tap.Device.Watch, from
// netlink link and address events) into the engine, and is the control
// socket's view of the interface: 'ipoib show' lists every address the
// host put on ib0, shows DOWN when the host set it down, and says why the
// engine did not follow a change.
type hostView struct {
	ifc  *ipoibcm.Interface
	log  *slog.Logger
	done chan struct{}
	wg   sync.WaitGroup

	mu    sync.Mutex
	state tap.HostState
	notes []string
}

// watchHost starts following dev. Call it once the engine has given the
// TAP its MTU, so the first state is the engine's own.
func watchHost(dev *tap.Device, ifc *ipoibcm.Interface, log *slog.Logger) (*hostView, error) {
	v := &hostView{ifc: ifc, log: log, done: make(chan struct{})}
	if err := dev.Watch(v.done, v.apply); err != nil {
		return nil, err
	}
	v.wg.Add(1)
	go v.followGroups(dev)
	return v, nil
}

// hostGroupsPoll is how often the host's multicast list is read: the
// bound on how long a join or leave whose IGMP/MLD message the engine
// missed (lost, suppressed, sent before the engine ran, or never sent,
// as for 224.0.0.x with igmp_link_local_mcast_reports=0) goes unnoticed.
// The kernel has no multicast-list event before Linux 6.13's
// RTNLGRP_IPV4_MCADDR, and reading two small /proc files is cheap.
const hostGroupsPoll = 2 * time.Second

// followGroups makes the engine's full joins the host's own multicast
// list (tap.Device.MulticastGroups), now and every hostGroupsPoll, as
// Linux IPoIB follows the netdev's list; the engine's IGMP/MLD snooping
// reacts between reads.
func (v *hostView) followGroups(dev *tap.Device) {
	defer v.wg.Done()
	tick := time.NewTicker(hostGroupsPoll)
	defer tick.Stop()
	failing := false
	for {
		at := time.Now()
		groups, err := dev.MulticastGroups()
		if err == nil {
			err = v.ifc.SyncHostGroups(groups, at)
		}
		if err != nil && !failing {
			v.log.Warn("host multicast list not followed", "err", err)
		}
		failing = err != nil
		select {
		case <-v.done:
			return
		case <-tick.C:
		}
	}
}

// apply takes a new host state: the engine follows MTU (within the mode's
// limit), MAC and the link going down and up (ipoibcm.FollowHostLink);
// refusals become notes and warnings.
func (v *hostView) apply(s tap.HostState) {
	var notes []string
	if s.MTU != v.ifc.MTU() {
		if err := v.ifc.FollowHostMTU(s.MTU); err != nil {
			notes = append(notes, err.Error())
			v.log.Warn("host MTU not followed", "err", err)
		}
	}
	if !bytes.Equal(s.MAC, v.ifc.HostMAC()) {
		if err := v.ifc.FollowHostMAC(s.MAC); err != nil {
			notes = append(notes, fmt.Sprintf("host MAC %v not followed, frames to the host are lost: %v", s.MAC, err))
			v.log.Warn("host MAC not followed", "err", err)
		}
	}
	if s.Up != v.ifc.HostUp() {
		// The engine's own Close sets the TAP down: nothing to follow.
		if err := v.ifc.FollowHostLink(s.Up); err != nil && !errors.Is(err, ipoibcm.ErrNotStarted) && !errors.Is(err, ipoibcm.ErrClosed) {
			notes = append(notes, fmt.Sprintf("host set %s up=%v, not followed: %v", v.ifc.Name(), s.Up, err))
			v.log.Warn("host link state not followed", "up", s.Up, "err", err)
		}
	}
	if !s.Up {
		notes = append(notes, fmt.Sprintf("the host set %s down: connections torn down, nothing sent, arrivals dropped (rx_link_down)", v.ifc.Name()))
	}
	v.mu.Lock()
	v.state, v.notes = s, notes
	v.mu.Unlock()
}

// info is the interface as 'ipoib show' reports it.
func (v *hostView) info(host string, configured []netip.Prefix) control.InterfaceInfo {
	v.mu.Lock()
	s, notes := v.state, v.notes
	v.mu.Unlock()
	addrs := s.Addrs
	if addrs == nil {
		addrs = configured
	}
	info := interfaceInfo(host, v.ifc, addrs)
	info.LinkUp = info.LinkUp && s.Up
	info.Notes = notes
	return info
}

// Close stops following.
func (v *hostView) Close() {
	close(v.done)
	v.wg.Wait()
}
