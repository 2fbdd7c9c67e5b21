package soft

import (
	"fmt"

	"github.com/ipoibcm/ipoib/hca"
)

// NewDeviceWithGID adds a device with a chosen port GID, which must not be
// in use by a live device. It models a host that restarts: its old device
// is closed and a new one comes up on the same port GID with fresh QPNs
// (added for the ipoibcm peer-restart tests).
func (f *Fabric) NewDeviceWithGID(name string, gid hca.GID) (*Device, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, fmt.Errorf("soft: new device %q: fabric: %w", name, hca.ErrDestroyed)
	}
	if _, dup := f.byName[name]; dup || name == "" {
		return nil, fmt.Errorf("soft: new device %q: name empty or taken: %w", name, hca.ErrInvalidArgument)
	}
	if _, dup := f.devices[gid]; dup || gid.IsMulticast() {
		return nil, fmt.Errorf("soft: new device %q: GID %s in use or multicast: %w", name, gid, hca.ErrInvalidArgument)
	}
	d := newDevice(f, name, gid)
	f.devices[gid] = d
	f.byName[name] = d
	return d, nil
}
