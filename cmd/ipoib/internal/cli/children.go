package cli

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"

	"github.com/ipoibcm/ipoib/control"
	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/ipoibcm"
	"github.com/ipoibcm/ipoib/tap"
)

// childSet is the P_Key child interfaces of one host's ib0 (a fabric host
// or 'ipoib up'): what control.ChildParent asks of the host. Each child is
// a TAP of its own in the host's namespace in front of an
// ipoibcm.Interface made by the parent's NewChild.
type childSet struct {
	host   string
	parent *ipoibcm.Interface
	log    *slog.Logger
	// open creates a child's TAP where the parent's is (its namespace).
	open func(name string, addrs []netip.Prefix) (*tap.Device, error)
	// config is the engine configuration a child starts from: the
	// parent's, for the child's name and host port.
	config func(name string, host ipoibcm.HostPort) ipoibcm.Config
	// admit, if set, plays the subnet manager: it puts the partition
	// into the port's P_Key table, with the membership bit 15 of pkey
	// says, unless the table has it, and returns how to take it out
	// again. Without it the table stays as it is and a child in a
	// partition it lacks shows membership none.
	admit func(pkey hca.PKey) (undo func(), err error)

	mu   sync.Mutex
	kids []*childHost // sorted by name
}

// childHost is one child interface as the control socket sees it.
type childHost struct {
	host  string
	ifc   *ipoibcm.Interface
	addrs []netip.Prefix
	view  *hostView
}

var (
	_ control.Endpoint    = (*childHost)(nil)
	_ control.ChildParent = (*softHost)(nil)
	_ control.ChildParent = (*upHost)(nil)
)

func (c *childHost) Info() control.InterfaceInfo { return c.view.info(c.host, c.addrs) }
func (c *childHost) Stats() any                  { return c.ifc.Stats() }
func (c *childHost) SetMode(mode string) error   { return setInterfaceMode(c.ifc, mode) }

// close stops following the TAP and closes the interface, which closes
// the TAP and so removes it from the kernel.
func (c *childHost) close() error {
	c.view.Close()
	return c.ifc.Close()
}

// add creates, starts and lists a child. Everything is checked before
// anything is made; what was made is undone if a later step fails.
func (s *childSet) add(req control.ChildRequest) (_ *childHost, err error) {
	if s.parent == nil {
		return nil, fmt.Errorf("%s takes no children", s.host)
	}
	pkey := hca.PKey(req.PKey)
	if !ipoibcm.ValidPKey(pkey) {
		return nil, fmt.Errorf("P_Key 0x%04x: %w", req.PKey, ipoibcm.ErrInvalidPKey)
	}
	name := req.Name
	if name == "" {
		name = childName(s.parent.Name(), req.PKey)
	}
	var addrs []netip.Prefix
	for _, a := range req.Addrs {
		p, err := netip.ParsePrefix(a)
		if err != nil {
			return nil, fmt.Errorf("address %q: %w", a, err)
		}
		addrs = append(addrs, p)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	full := pkey | 0x8000
	if s.parent.PKey() == full {
		return nil, fmt.Errorf("partition 0x%04x is %s's own", uint16(full), s.parent.Name())
	}
	if name == s.parent.Name() {
		return nil, fmt.Errorf("%s is the parent's name", name)
	}
	for _, k := range s.kids {
		if k.ifc.PKey() == full {
			return nil, fmt.Errorf("partition 0x%04x has %s already", uint16(full), k.ifc.Name())
		}
		if k.ifc.Name() == name {
			return nil, fmt.Errorf("%s exists already", name)
		}
	}
	var undo []func() error
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				err = errors.Join(err, undo[i]())
			}
		}
	}()
	if s.admit != nil {
		back, err := s.admit(pkey)
		if err != nil {
			return nil, fmt.Errorf("P_Key table: %w", err)
		}
		undo = append(undo, func() error { back(); return nil })
	}
	dev, err := s.open(name, addrs)
	if err != nil {
		return nil, fmt.Errorf("TAP %s: %w", name, err)
	}
	cfg := s.config(name, dev)
	cfg.PKey = pkey
	ifc, err := s.parent.NewChild(cfg)
	if err != nil {
		return nil, errors.Join(err, dev.Close())
	}
	if err := ifc.Start(); err != nil {
		return nil, errors.Join(err, ifc.Close())
	}
	undo = append(undo, ifc.Close)
	if err := dev.SetMTU(ifc.MTU()); err != nil {
		return nil, fmt.Errorf("TAP %s MTU %d: %w", name, ifc.MTU(), err)
	}
	view, err := watchHost(dev, ifc, s.log.With("dev", name))
	if err != nil {
		return nil, err
	}
	k := &childHost{host: s.host, ifc: ifc, addrs: addrs, view: view}
	s.kids = append(s.kids, k)
	slices.SortFunc(s.kids, func(a, b *childHost) int { return compareNames(a.ifc.Name(), b.ifc.Name()) })
	s.log.Info("child up", "dev", name, "pkey", control.PKeyString(uint16(ifc.PKey())), "membership", ifc.Membership(),
		"hwaddr", ifc.HWAddr(), "addrs", addrs)
	return k, nil
}

// del stops the child named name and removes its TAP.
func (s *childSet) del(name string) error {
	s.mu.Lock()
	i := slices.IndexFunc(s.kids, func(k *childHost) bool { return k.ifc.Name() == name })
	if i < 0 {
		s.mu.Unlock()
		return fmt.Errorf("%w: %s has no child %s", control.ErrNoSuchInterface, s.host, name)
	}
	k := s.kids[i]
	s.kids = slices.Delete(s.kids, i, i+1)
	s.mu.Unlock()
	return k.close()
}

// endpoints lists the children for the control socket.
func (s *childSet) endpoints() []control.Endpoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]control.Endpoint, len(s.kids))
	for i, k := range s.kids {
		out[i] = k
	}
	return out
}

// closeAll removes every child (the host is stopping).
func (s *childSet) closeAll() error {
	s.mu.Lock()
	kids := s.kids
	s.kids = nil
	s.mu.Unlock()
	var errs []error
	for _, k := range kids {
		errs = append(errs, k.close())
	}
	return errors.Join(errs...)
}

// compareNames orders interface names as strings (ib0.8001 < ib0.8002).
func compareNames(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// admitSoft is the soft fabric's subnet manager for one device: the
// partition joins dev's P_Key table with the membership pkey's bit 15
// says, unless the table has the partition already.
func admitSoft(dev interface {
	Port() hca.Port
	SetPKeyTable([]hca.PKey) error
}) func(hca.PKey) (func(), error) {
	return func(pkey hca.PKey) (func(), error) {
		before := dev.Port().PKeys
		if slices.ContainsFunc(before, func(k hca.PKey) bool { return k&0x7FFF == pkey&0x7FFF }) {
			return func() {}, nil
		}
		if err := dev.SetPKeyTable(append(slices.Clone(before), pkey)); err != nil {
			return nil, err
		}
		return func() { dev.SetPKeyTable(before) }, nil
	}
}
