package soft

import "github.com/ipoibcm/ipoib/hca"

// NewDeviceWithGID adds a device with a chosen port GID, which must not be
// in use by a live device. It models a host that restarts: its old device
// is closed and a new one comes up on the same port GID with fresh QPNs
// (added for the ipoibcm peer-restart tests).
func (f *Fabric) NewDeviceWithGID(name string, gid hca.GID) (*Device, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.newDeviceLocked(name, gid)
}
