package hcatest

import (
	"testing"
	"time"

	"github.com/ipoibcm/ipoib/hca"
)

// Fabric is what the suite needs from a backend.
type Fabric interface {
	// NewDevice returns a new device that reaches every other device of
	// this fabric. The backend closes it in t.Cleanup.
	NewDevice(t *testing.T) hca.Device
	// Properties describe behaviour that legitimately differs between
	// backends or fault settings.
	Properties() Properties
}

// Properties describe a backend configuration.
type Properties struct {
	// LossyUD: UD packets may be lost, so tests that need every UD packet
	// delivered are skipped.
	LossyUD bool
	// PurgesCompletionsOnDestroy: destroying a QP removes its queued CQEs
	// (mlx5 style) instead of leaving them to be polled.
	PurgesCompletionsOnDestroy bool
	// OffloadedRecv is the flag a UD receive of a checksum-offloaded send
	// carries on this backend: WCIPCsumOK for one that computes and
	// verifies checksums (hca/rocev2, hardware), WCCsumPartial for one
	// that passes the unfinished state across (hca/soft). With
	// WCIPCsumOK a correct datagram sent without offload must complete
	// WCIPCsumOK too. Zero accepts either.
	OffloadedRecv hca.WCFlags
	// WaitTimeout guards every wait; zero means 10 s.
	WaitTimeout time.Duration
}

// PKeyFabric is implemented by backends that can make a device with a
// given P_Key table; the P_Key mismatch test needs it.
type PKeyFabric interface {
	NewDeviceWithPKeys(t *testing.T, pkeys []hca.PKey) hca.Device
}

// LinkFabric is implemented by backends whose port state can be switched.
type LinkFabric interface {
	SetLinkUp(t *testing.T, dev hca.Device, up bool)
}

// test is one conformance check.
type test struct {
	name string
	run  func(t *testing.T, f Fabric)
}

var tests = []test{
	{"RCSendRecvSizes", testRCSizes},
	{"RCCompletionOrderPerQP", testRCOrder},
	{"SRQShared1000QPs", testSRQShared},
	{"SRQLimitEvent", testSRQLimit},
	{"UDUnicast", testUDUnicast},
	{"UDMulticast", testUDMulticast},
	{"QKeyMismatchDropped", testQKeyMismatch},
	{"PKeyMismatchDropped", testPKeyMismatch},
	{"PKeyMembership", testPKeyMembership},
	{"PKeyRC", testPKeyRC},
	{"GSIPKeys", testGSIPKeys},
	{"PKeyChange", testPKeyChange},
	{"GSIQPIsQPN1", testGSI},
	{"NotifyMissedEvents", testNotify},
	{"FlushOnError", testFlushOnError},
	{"LastWQEReachedOnce", testLastWQE},
	{"DrainBehindEarlierCompletions", testDrain},
	{"RNRRetry0EmptySRQ", testRNR0},
	{"RNRRetry7WaitsForBuffer", testRNR7},
	{"CQOverflowRaisesCQErr", testCQOverflow},
	{"MessageLongerThanBuffer", testTooLong},
	{"UnreachablePeerRetryExc", testUnreachable},
	{"QPNsUniqueAmongLive", testQPNUnique},
	{"CompletionsAfterDestroyCarryContext", testAfterDestroy},
	{"IllegalTransitions", testTransitions},
	{"PostInWrongState", testPostWrongState},
	{"HandlersMayReenter", testReentrant},
	{"LinkDownUp", testLink},
	{"OffloadCaps", testOffloadCaps},
	{"UDChecksumOffload", testUDCsumOffload},
	{"UDChecksumOKOnlyVerified", testUDCsumOKOnlyVerified},
	{"UDLSO", testUDLSO},
	{"LSORejects", testLSORejects},
	{"RCChecksumOffload", testRCCsumOffload},
}

// Run runs the conformance suite; newFabric gives a fresh fabric per
// subtest.
func Run(t *testing.T, newFabric func(t *testing.T) Fabric) {
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, newFabric(t))
		})
	}
}
