package soft

import (
	"slices"

	"github.com/ipoibcm/ipoib/hca"
)

// maxTrackedGroups bounds the per-group delivery counters of one device;
// deliveries of groups beyond it are summed in McastStats.DeliveredOther.
const maxTrackedGroups = 4096

// deviceMcast counts the multicast messages the fabric delivered into one
// device's QPs, per group; guarded by Fabric.mu.
type deviceMcast struct {
	perGroup map[hca.GID]uint64
	other    uint64
}

func (m *deviceMcast) delivered(mgid hca.GID) {
	if _, ok := m.perGroup[mgid]; !ok && len(m.perGroup) >= maxTrackedGroups {
		m.other++
		return
	}
	if m.perGroup == nil {
		m.perGroup = make(map[hca.GID]uint64)
	}
	m.perGroup[mgid]++
}

// McastStats is what the fabric knows of one device's multicast: the
// groups its QPs are attached to now and the messages of each group it
// delivered into them. A group's count stops moving when the device's
// last QP leaves it: the fabric delivers a group's messages to attached
// QPs only.
//
// Groups are MGIDs in IPv6 notation (hca.GID.String).
type McastStats struct {
	Attached []string `json:"attached"`
	// Delivered counts messages per group since the device was created;
	// a detached group keeps its count.
	Delivered map[string]uint64 `json:"delivered"`
	// DeliveredOther sums the groups past the first 4096 the device
	// received.
	DeliveredOther uint64 `json:"delivered_other"`
}

// McastStats returns the device's multicast attachments and deliveries.
func (d *Device) McastStats() McastStats {
	f := d.f
	f.mu.Lock()
	defer f.mu.Unlock()
	s := McastStats{Attached: []string{}, Delivered: make(map[string]uint64, len(d.mcast.perGroup)), DeliveredOther: d.mcast.other}
	for mgid, n := range d.mcast.perGroup {
		s.Delivered[mgid.String()] = n
	}
	var attached []hca.GID
	for _, q := range d.qps {
		for _, g := range q.mcast.All() {
			if !slices.Contains(attached, g) {
				attached = append(attached, g)
			}
		}
	}
	slices.SortFunc(attached, func(a, b hca.GID) int { return slices.Compare(a[:], b[:]) })
	for _, g := range attached {
		s.Attached = append(s.Attached, g.String())
	}
	return s
}
