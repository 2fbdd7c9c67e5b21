package core

import (
	"fmt"
	"slices"

	"github.com/ipoibcm/ipoib/hca"
)

// Attachments are the multicast groups one QP is attached to, in the
// order it attached them. The rules are the verbs' (and rxe's): only a UD
// QP attaches, only to a multicast GID; attaching twice is a no-op;
// detaching from a group not attached is an error; a QP with attachments
// cannot be destroyed (Busy). The backend's lock guards it.
type Attachments struct {
	groups []hca.GID
}

// Attach adds mgid for a QP of type typ. It reports whether mgid is new;
// an error (hca.ErrInvalidArgument) changes nothing. A backend that must
// do more on a new attachment (join a group) calls CheckAttach first and
// Add once that worked.
func (a *Attachments) Attach(typ hca.QPType, mgid hca.GID) (bool, error) {
	added, err := a.CheckAttach(typ, mgid)
	if added {
		a.Add(mgid)
	}
	return added, err
}

// CheckAttach is Attach without the change: whether mgid would be new,
// or why it may not be attached.
func (a *Attachments) CheckAttach(typ hca.QPType, mgid hca.GID) (bool, error) {
	if typ != hca.QPTypeUD || !mgid.IsMulticast() {
		return false, fmt.Errorf("attach %v QP to %v: %w", typ, mgid, hca.ErrInvalidArgument)
	}
	return !slices.Contains(a.groups, mgid), nil
}

// Add records mgid, which CheckAttach said is new.
func (a *Attachments) Add(mgid hca.GID) { a.groups = append(a.groups, mgid) }

// Detach removes mgid; hca.ErrInvalidArgument when it is not attached.
func (a *Attachments) Detach(mgid hca.GID) error {
	i := slices.Index(a.groups, mgid)
	if i < 0 {
		return fmt.Errorf("not attached to %v: %w", mgid, hca.ErrInvalidArgument)
	}
	a.groups = slices.Delete(a.groups, i, i+1)
	return nil
}

// CheckDestroy is the error of destroying a QP that is still attached
// (hca.ErrBusy), nil when it is not.
func (a *Attachments) CheckDestroy() error {
	if n := len(a.groups); n > 0 {
		return fmt.Errorf("attached to %d multicast groups: %w", n, hca.ErrBusy)
	}
	return nil
}

// Len is the number of groups attached.
func (a *Attachments) Len() int { return len(a.groups) }

// All returns the groups in attach order; the caller must not keep it
// across a change.
func (a *Attachments) All() []hca.GID { return a.groups }
