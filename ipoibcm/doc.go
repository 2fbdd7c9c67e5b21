// Package ipoibcm is the IPoIB engine: one Interface per ib0, carrying IP
// over InfiniBand in datagram mode (RFC 4391) and connected mode (RFC 4755)
// on top of any hca.Device, with the host on the other side speaking
// Ethernet through a HostPort.
//
// Goroutines per Interface: the host reader (ReadFrames batch -> translate
// -> post sends, under one global TX credit count), the RX and TX napi
// pollers, and one ordered control loop (CM events, connection start,
// stale scan, passive teardown and reaping, neighbour aging, mode switch).
// The data path hands work to the control loop without blocking.
//
// Passive connections are torn down as DESIGN.md prescribes: dead flag
// under the RX poll lock, QP to Error, LAST_WQE_REACHED, one drain WR per
// CQ covering every connection that reached LAST_WQE, destroy from the
// control loop when the drain completion is polled (reaper.go).
//
// Neighbours are keyed by port GID, each mapped one-to-one to a locally
// administered MAC the host sees; a peer restarting with a new UD QPN keeps
// its MAC.
package ipoibcm
