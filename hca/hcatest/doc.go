// Package hcatest is the conformance suite every hca backend passes.
//
// A backend calls Run from its own _test.go with a constructor for a fresh
// fabric per subtest. The suite only uses the hca interfaces, plus the
// optional PKeyFabric and LinkFabric capabilities when a backend offers
// them. Every wait is event-driven (OnCompletion plus Notify(true), or an
// async-event handler signalling a channel); the timeout is only a guard
// against hangs.
package hcatest
