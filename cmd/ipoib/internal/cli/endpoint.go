package cli

import (
	"net/netip"

	"github.com/ipoibcm/ipoib/control"
	"github.com/ipoibcm/ipoib/ipoibcm"
)

// interfaceInfo is the control socket's view of one engine interface,
// shared by the fabric's hosts and 'ipoib up' so both report the same
// fields the same way.
func interfaceInfo(host string, ifc *ipoibcm.Interface, addrs []netip.Prefix) control.InterfaceInfo {
	info := control.InterfaceInfo{
		Host:   host,
		Name:   ifc.Name(),
		Mode:   ifc.Mode().String(),
		MTU:    ifc.MTU(),
		HWAddr: ifc.HWAddr().ColonString(),
		LinkUp: ifc.LinkUp(),
		PKey:   control.PKeyString(uint16(ifc.PKey())),
		// The port's table, which the subnet manager (here the fabric
		// or the command line) writes, says full or limited.
		Membership: ifc.Membership(),
	}
	if p := ifc.Parent(); p != nil {
		info.Parent = p.Name()
	}
	for _, a := range addrs {
		info.Addrs = append(info.Addrs, a.String())
	}
	return info
}

// setInterfaceMode parses a mode name from the control socket and applies
// it to ifc.
func setInterfaceMode(ifc *ipoibcm.Interface, mode string) error {
	m, err := ipoibcm.ParseMode(mode)
	if err != nil {
		return err
	}
	return ifc.SetMode(m)
}
