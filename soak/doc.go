// Package soak runs the stale-connection reaping soak behind `ipoib soak`:
// many IPoIB-CM interfaces on one HCA backend (the soft fabric or RoCEv2
// over loopback UDP) with fault injection, bursts of checked packets
// between them, and idle connections reaped many times a second.
//
// The soak observes the engines from outside only: a verbs wrapper around
// each hca.Device (verbs.go) and a light in-memory host behind each
// interface (host.go). The invariants it checks (invariants.go) decide
// pass or fail; Run returns them in a Report. The mutations of
// internal/mutation switch off a teardown safeguard, and the soak must
// then fail.
package soak
