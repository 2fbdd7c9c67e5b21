package ipoibcm

import (
	"errors"
	"fmt"
	"sync"

	"github.com/ipoibcm/ipoib/hca"
)

// P_Key child interfaces (Linux's ib0.8001, ipoib_vlan.c): an Interface in
// another partition on the same port. A child has everything an Interface
// has of its own: UD QP (so its own QPN, hardware address and CM service
// ID 0x1000000|QPN), CQs, SRQ, neighbours, connections, counters, mode and
// host port. It shares the parent's device and the parent's CM manager:
// one GSI QP per port, as Linux's ib_cm is one per device, which finds a
// REQ's listener by service ID and every later MAD's connection by its
// communication ID, so the CM demultiplexes the interfaces by itself.

var (
	// ErrPKeyInUse: the port has an interface in that partition already
	// (the parent, or another child). Linux refuses such a legacy child
	// with ENOTUNIQ.
	ErrPKeyInUse = errors.New("ipoibcm: partition has an interface on this port already")
	// ErrInvalidPKey: 0x0000 and 0x8000 are no partition (IBTA 10.9.1.2;
	// Linux's create_child refuses them).
	ErrInvalidPKey = errors.New("ipoibcm: invalid P_Key")
	// ErrNotParent: children have no children (Linux does not nest them).
	ErrNotParent = errors.New("ipoibcm: a child interface cannot have children")
)

// ValidPKey reports whether k names a partition: not 0x0000 or 0x8000,
// the invalid P_Keys, in either membership.
func ValidPKey(k hca.PKey) bool { return k.Valid() }

// childSet is a parent's children, keyed by partition (full-member
// P_Key).
type childSet struct {
	mu     sync.Mutex
	closed bool // the parent is closing: no new children
	byKey  map[hca.PKey]*Interface
}

// NewChild creates a child interface of i in partition cfg.PKey, on i's
// device and CM; cfg.Device must be nil or i's device. The child's P_Key
// gets the full-membership bit, as Linux sets it for the broadcast group
// (the port's P_Key table says whether the port is a full or a limited
// member). Like New, nothing runs until Start. Close of the parent closes
// its children first.
func (i *Interface) NewChild(cfg Config) (*Interface, error) {
	if i.parent != nil {
		return nil, fmt.Errorf("%s: child %s: %w", i.cfg.Name, cfg.Name, ErrNotParent)
	}
	if cfg.Device == nil {
		cfg.Device = i.dev
	}
	if cfg.Device != i.dev {
		return nil, fmt.Errorf("%s: child %s on another device: %w", i.cfg.Name, cfg.Name, hca.ErrInvalidArgument)
	}
	if !ValidPKey(cfg.PKey) {
		return nil, fmt.Errorf("%s: child %s: P_Key 0x%04x: %w", i.cfg.Name, cfg.Name, uint16(cfg.PKey), ErrInvalidPKey)
	}
	if i.cmm == nil && !cfg.DisableCM {
		return nil, fmt.Errorf("%s: child %s wants CM on a parent without: %w", i.cfg.Name, cfg.Name, ErrInvalidMode)
	}
	cfg.PKey |= 0x8000
	key := cfg.PKey
	if err := i.children.reserve(key, i.cfg.PKey|0x8000); err != nil {
		return nil, fmt.Errorf("%s: child %s P_Key 0x%04x: %w", i.cfg.Name, cfg.Name, uint16(key), err)
	}
	cfg.CMManager = i.cmm
	c, err := New(cfg)
	if err != nil {
		i.children.release(key, nil)
		return nil, err
	}
	c.parent = i
	if !i.children.set(key, c) {
		// The parent began closing meanwhile; its CM is going away.
		return nil, errors.Join(fmt.Errorf("%s: child %s: %w", i.cfg.Name, cfg.Name, ErrClosed), c.closeSelf())
	}
	return c, nil
}

// Parent is the interface this child belongs to; nil for a parent.
func (i *Interface) Parent() *Interface { return i.parent }

// PKey is the partition the interface is in, with the full-membership bit
// (the broadcast group's P_Key).
func (i *Interface) PKey() hca.PKey { return i.cfg.PKey | 0x8000 }

// Children are the interface's children, in no order.
func (i *Interface) Children() []*Interface {
	i.children.mu.Lock()
	defer i.children.mu.Unlock()
	out := make([]*Interface, 0, len(i.children.byKey))
	for _, c := range i.children.byKey {
		if c != nil {
			out = append(out, c)
		}
	}
	return out
}

// reserve claims partition key, refusing the parent's own and those taken.
func (s *childSet) reserve(key, parentKey hca.PKey) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if _, taken := s.byKey[key]; taken || key == parentKey {
		return ErrPKeyInUse
	}
	if s.byKey == nil {
		s.byKey = make(map[hca.PKey]*Interface)
	}
	s.byKey[key] = nil
	return nil
}

// set records c under its reserved key; false if the parent is closing.
func (s *childSet) set(key hca.PKey, c *Interface) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		delete(s.byKey, key)
		return false
	}
	s.byKey[key] = c
	return true
}

// release frees key if it is still c's (nil: a reservation).
func (s *childSet) release(key hca.PKey, c *Interface) {
	s.mu.Lock()
	if cur, ok := s.byKey[key]; ok && cur == c {
		delete(s.byKey, key)
	}
	s.mu.Unlock()
}

// closeAll stops taking children and closes those there are.
func (s *childSet) closeAll() error {
	s.mu.Lock()
	s.closed = true
	var kids []*Interface
	for _, c := range s.byKey {
		if c != nil {
			kids = append(kids, c)
		}
	}
	s.mu.Unlock()
	var errs []error
	for _, c := range kids {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// Membership is how the port's P_Key table holds the interface's
// partition now (IBTA 10.9.1.2): "full" or "limited" by the entry Linux's
// ib_find_pkey would pick (hca.PKeyIndex: the full one if there are both),
// "none" when the table lacks the partition (the subnet manager has not
// put the port in it; the link is down).
func (i *Interface) Membership() string {
	port := i.dev.Port()
	idx, ok := port.PKeyIndex(i.PKey())
	switch {
	case !ok:
		return "none"
	case port.PKeys[idx].Full():
		return "full"
	}
	return "limited"
}
