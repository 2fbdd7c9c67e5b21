package soak

import (
	"fmt"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/rocev2"
	"github.com/ipoibcm/ipoib/hca/soft"
)

// The HCA backends a soak runs on (Config.HCA).
const (
	HCASoft   = "soft"
	HCARoCEv2 = "rocev2"
)

// soakBackend is the HCA under a soak's engines, seen from outside them:
// it hands out one device per host and reports the counters and live
// objects the invariants are checked by.
type soakBackend interface {
	// device returns host k's device; k counts up from 0, once each.
	device(k int) (hca.Device, error)
	view() backendView
	// rcRetry is the RC retry count the engines' CM REQs carry.
	rcRetry() uint8
	// close releases the backend: afterwards none of its goroutines or
	// sockets may be left.
	close()
}

// backendView is a backend's state at one moment, summed over its
// devices. Counters a backend does not have stay zero.
type backendView struct {
	// Live objects; at the end of a soak every one must be gone.
	QPs, CQs, SRQs, AHs, McastAttachments int
	// Goroutines the backend counts as its own (the soft fabric does).
	Goroutines int
	// Held is work the backend has accepted and not yet delivered:
	// completions held back, datagrams delayed.
	Held int

	// The invariants' counters.
	CompletionsAfterDestroy, DestroyedQPOps, CQOverflows uint64
	// UDDrops are UD messages the backend lost and counted: the UD share
	// of the packets an engine may lose.
	UDDrops uint64

	RCMessages, UDMessages, RNRNaks           uint64
	DelayedCompletions, LastWQEReached        uint64
	PurgedCompletions, SpuriousEvents         uint64
	Retransmits, Timeouts, SeqNAKs, Duplicate uint64
	UDPDropped, UDPDuplicated, UDPReordered   uint64
	UDPDelayed                                uint64
}

// newSoakBackend opens the backend cfg.HCA names for cfg.Hosts hosts; tap,
// if not nil, records the soft fabric's packets (--capture).
func newSoakBackend(cfg *Config, tap soft.Tap) (soakBackend, error) {
	switch cfg.HCA {
	case HCASoft:
		return &softBackend{f: soft.NewFabric(soft.Config{Seed: cfg.Seed, TimerScale: cfg.TimerScale, Faults: cfg.Faults, Tap: tap})}, nil
	case HCARoCEv2:
		r := &cfg.RoCEv2
		faults := r.Faults
		faults.Seed = uint64(cfg.Seed)
		l, err := rocev2.NewLoopback(rocev2.LoopbackConfig{
			Devices: cfg.Hosts, IPv6: r.IPv6,
			Device: rocev2.Config{
				Faults: faults, MinAckTimeout: r.MinAckTimeout, TimeScale: r.TimeScale, Name: "soak",
			},
		})
		if err != nil {
			return nil, fmt.Errorf("soak: %w", err)
		}
		return &rocev2Backend{l: l}, nil
	}
	return nil, fmt.Errorf("%w: HCA %q (soft or rocev2)", ErrConfig, cfg.HCA)
}

// softBackend is the in-process soft fabric with its fault injection.
type softBackend struct {
	f *soft.Fabric
}

func (b *softBackend) device(k int) (hca.Device, error) {
	d, err := b.f.NewDevice(fmt.Sprintf("soak%d", k))
	if err != nil {
		return nil, err
	}
	return d, nil
}

func (b *softBackend) close() { b.f.Close() }

// rcRetry is Linux IPoIB-CM's 0: the soft fabric loses no RC message.
func (b *softBackend) rcRetry() uint8 { return 0 }

func (b *softBackend) view() backendView {
	fs := b.f.Stats()
	return backendView{
		QPs: fs.QPs, CQs: fs.CQs, SRQs: fs.SRQs, AHs: fs.AHs, McastAttachments: fs.McastAttachments,
		Goroutines: fs.Goroutines, Held: fs.PendingCompletion,
		CompletionsAfterDestroy: fs.CompletionsAfterDestroy, DestroyedQPOps: fs.DestroyedQPOps,
		CQOverflows: fs.CQOverflows, UDDrops: fs.UDDrops.Total(),
		RCMessages: fs.RCMessages, UDMessages: fs.UDMessages, RNRNaks: fs.RNRNaks,
		DelayedCompletions: fs.DelayedCompletions, LastWQEReached: fs.LastWQEReached,
		PurgedCompletions: fs.PurgedCompletions, SpuriousEvents: fs.SpuriousEvents,
		Retransmits: fs.TransportRetries,
	}
}

// rocev2Backend is a loopback fabric of RoCEv2 devices: real sockets,
// the real RC transport, UDP faults and held completions.
type rocev2Backend struct {
	l *rocev2.Loopback
}

func (b *rocev2Backend) device(k int) (hca.Device, error) {
	devs := b.l.Devices()
	if k >= len(devs) {
		return nil, fmt.Errorf("soak: host %d of a %d-device fabric", k, len(devs))
	}
	return devs[k], nil
}

// rcRetry is 7, retry forever: IPoIB-CM's 0 suits a lossless link, and
// over lossy UDP a timeout or a sequence NAK each spend a retry.
func (b *rocev2Backend) rcRetry() uint8 { return 7 }

// close closes every device; Device.Close waits for its goroutines.
func (b *rocev2Backend) close() { _ = b.l.Close() }

func (b *rocev2Backend) view() backendView {
	var v backendView
	for _, d := range b.l.Devices() {
		o := d.Objects()
		v.QPs += o.QPs
		v.CQs += o.CQs
		v.SRQs += o.SRQs
		v.McastAttachments += o.McastAttachments
		v.Held += o.HeldCompletions + o.HeldDatagrams
		s := d.Stats()
		v.CompletionsAfterDestroy += s.CompletionsAfterDestroy
		v.DestroyedQPOps += s.DestroyedQPOps
		v.CQOverflows += s.CQOverflows
		v.UDDrops += s.UDDropped
		v.RCMessages += s.RCMessages
		v.UDMessages += s.UDMessages
		v.RNRNaks += s.RNRNAKsSent
		v.DelayedCompletions += s.CompletionsHeld
		v.Retransmits += s.Retransmits
		v.Timeouts += s.Timeouts
		v.SeqNAKs += s.SeqNAKsSent
		v.Duplicate += s.Duplicates
		v.UDPDropped += s.FaultDropped
		v.UDPDuplicated += s.FaultDuplicated
		v.UDPReordered += s.FaultReordered
		v.UDPDelayed += s.FaultDelayed
	}
	return v
}
