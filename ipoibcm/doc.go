// Package ipoibcm is the IPoIB engine: one Interface per ib0, carrying IP
// over InfiniBand in datagram mode (RFC 4391) and connected mode (RFC 4755)
// on top of any hca.Device, with the host on the other side speaking
// Ethernet through a HostPort.
//
// Data flows one way through each path:
//
//	host → hostReader.run → hostReader.frame → poster.post → HCA (txpath.go)
//	HCA  → rxPath.handleRX (rxpath.go) → hostSplit → hostWriter.write (hostport.go) → host
//
// A host port with several queues (MultiQueuePort, the multi-queue TAP)
// gets a host reader and a hostWriter per queue, frames toward the host
// going to the queue their flow hashes to (hostqueue.go); credits, the TX
// buffer pool and the TX CQ stay shared.
//
// Goroutines per Interface: a host reader per host queue (it also
// busy-polls the TX CQ), the RX and TX napi pollers, and one ordered control loop
// (control.go: CM events, connection set-up and teardown, the stale scan,
// neighbour aging, the mode switch, shutdown). The data paths hand work to
// the control loop without blocking; the pollers' handlers never call
// napi's Sync or Stop (structure_test.go checks it).
//
// Where the state lives: hostReader (txpath.go: the host reader's batch),
// txPath (txqueue.go: credits, the TX buffer pool, the readers' stops and
// batch windows), hostQueue (hostqueue.go: one host queue's reader state,
// writer and counters), neighbourTable (neighbour.go, its own lock: the MAC ↔ port
// mapping and the frames parked for a connection), activeSet and txConn
// (txconn.go: the active connections' set-up, REP, teardown), rxPath (the
// RX poller's batch), rxConn
// (rxconn.go: accepting a passive connection) and its state machine
// (rxteardown.go: dead flag under the RX poll lock, QP to Error,
// LAST_WQE_REACHED, one drain WR per batch, destroy once the drain
// completion is polled). docs/ in the repository explains the design.
//
// Neighbours are keyed by port GID, each mapped one-to-one to a locally
// administered MAC the host sees; a peer restarting with a new UD QPN keeps
// its MAC.
package ipoibcm
