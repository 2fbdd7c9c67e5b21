// Package netstack is an in-process host: a gVisor TCP/IP stack behind the
// same host-port interface (ipoibcm.HostPort) as the kernel TAP device, so
// tests and benchmarks exercise the IPoIB engine without root.
//
// The stack's single NIC is an Ethernet link endpoint that speaks whole
// frames. Frames the stack sends wait in a bounded queue that ReadFrames
// drains in batches; frames given to WriteFrames are filtered by destination
// MAC and delivered to the stack. ARP and IPv6 neighbour discovery run inside
// gVisor, exactly as the kernel would run them behind a TAP device, so the
// engine answers them the same way for both hosts.
//
// The host is also an ipoibcm.OffloadPort, as a TAP with IFF_VNET_HDR is:
// with Config.GSO gVisor's TCP hands the link 64 KiB super frames with
// partial checksums (host GSO), which ReadFramesMeta passes up whole to a
// reader that accepts them and cuts to the MTU for any other; toward the
// stack, WriteFramesMeta delivers TCP super frames whole (GRO done by the
// writer), so a large segment costs gVisor one packet, not forty-five.
//
// The link MTU can drop under running TCP connections (an IPoIB switch from
// connected to datagram mode, 65520 -> 4092), and gVisor's TCP recovers
// badly from the loss that would cause, so the link makes the change
// lossless: segments queued at the old MTU are cut to the new one
// (segmenter), the IPv4 fragments gVisor then makes of its don't-fragment
// packets get unique IDs (fragRenumberer), and PMTU messages about packets
// sent before the change are not given to TCP (isStalePMTU).
//
// Host also carries the helpers tests and benchmarks need: TCP and UDP
// dialers and listeners (gonet), ICMP echo, and multicast membership (which
// makes the stack emit IGMP and MLD reports). Link joins two hosts back to
// back in memory, and LinkOffloads does so with the offload metadata
// carried across, as veth passes GSO packets; they are the benchmark
// baselines against which ib0 is measured.
package netstack
