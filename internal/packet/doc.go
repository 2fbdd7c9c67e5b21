// Package packet is the project's one reading of IPv4, IPv6, TCP and UDP
// headers and its one Internet checksum. Field access goes through
// gVisor's tcpip/header types and every sum through gVisor's
// tcpip/checksum; what this package adds is the validation the datapath
// repeats at every layer (the engine, the offloads, the HCA backends,
// the capture and the soak): do the length fields of a packet hold
// together, where does its transport header start and end, what is its
// pseudo-header sum.
//
// Nothing here allocates or panics on bad input: a packet that does not
// hold together is an error the caller counts (FuzzParseIP).
package packet
