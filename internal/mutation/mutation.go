// Package mutation holds the one switch set that breaks the engine on
// purpose: the soak's mutation tests (`ipoib soak --unsafe-skip-dead-flag`,
// `--unsafe-skip-drain`) turn off a safeguard of the passive-connection
// teardown and must then fail, which proves the soak can see what it
// claims to check.
//
// It is no part of any public API. The type lives in an internal package,
// so code outside this module cannot name it, and ipoibcm does not take it
// in its Config: it finds the switches on the device it is given, when that
// device (in practice the soak's verbs wrapper) implements Carrier.
package mutation

// Soak are the teardown safeguards the soak can switch off. The zero value
// (every safeguard on) is the only one the product ever runs with.
type Soak struct {
	// SkipDeadFlag skips marking a torn-down passive connection dead under
	// the RX poll lock, so its late completions are delivered to the host
	// instead of recycled.
	SkipDeadFlag bool
	// SkipDrain destroys a torn-down passive QP right after moving it to
	// Error, without waiting for LAST_WQE_REACHED and the drain WR, so its
	// completions can be polled after the QP is gone.
	SkipDrain bool
}

// Any reports whether any safeguard is off.
func (s Soak) Any() bool { return s.SkipDeadFlag || s.SkipDrain }

// Carrier is implemented by a device wrapper that asks the engine built on
// it to run with mutations.
type Carrier interface {
	SoakMutations() Soak
}
