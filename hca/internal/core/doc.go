// Package core holds what the two HCA backends (hca/soft, hca/rocev2)
// share beneath their transports: the ring a CQ keeps its completions in
// and the bookkeeping of a UD QP's multicast attachments. How a packet
// travels, which lock guards what and which faults are injected stay in
// each backend; the pieces here have no lock of their own and are
// guarded by the backend's.
package core
