// Package offload holds the software halves of the NIC offloads the
// datapath passes around: parsing the IP and TCP/UDP headers of a frame,
// completing a partial (CHECKSUM_PARTIAL-style) checksum, filling and
// verifying IPv4/TCP/UDP checksums from scratch, and cutting a GSO super
// frame into MTU-sized frames (TCP segmentation as TSO does it, UDP
// segmentation as USO / UDP_SEGMENT does it).
//
// Every function is pure over the bytes it is given and the caller's
// buffers: no allocation, no state, so the TAP (tap, with a 14-byte
// Ethernet header in front of IP) and the HCA backends (hca/soft,
// hca/rocev2, with the 4-byte IPoIB encapsulation header in front) share
// them. The link header is opaque here: callers say where the IP header
// starts (l3off) and segments carry a copy of whatever precedes it.
package offload
