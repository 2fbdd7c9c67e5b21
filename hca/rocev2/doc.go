// Package rocev2 is an HCA backend that speaks RoCEv2 over UDP: every
// device receives on one UDP socket, its port GID is its bind address as a GID
// (::ffff:a.b.c.d), and the packets it sends are standard BTH/DETH/AETH
// transport packets with a valid ICRC, so separate processes and hosts can
// talk and tshark decodes the traffic.
//
// The RC transport follows Linux rxe: segmentation at the path MTU, 24-bit
// PSNs, the AckReq bit on the last packet of a message and every
// ackReqEvery packets, coalesced ACKs (one per QP per received batch),
// go-back-N retransmission on the transport timer, one PSN sequence NAK
// per gap, re-ACK of duplicates, and RNR NAKs with the IBTA timer table.
//
// UD multicast (docs/wire.md §6) goes one of two ways. With
// Config.Multicast it is RoCEv2 multicast as rxe sends it (mcast.go): a
// send to an MGID goes to the IP group GroupAddr maps it to (the MGID
// itself over IPv6, 239.x.y.z over IPv4), with DestQP 0xFFFFFF, and the
// network replicates it; AttachMcast joins the group through the kernel
// (IGMP/MLD) on the interface of the bind address, one socket bound to
// the group per joined group, and DetachMcast of the last attachment
// leaves it. A datagram to a group goes to every QP attached to an MGID
// of that group (the sender's own through IP_MULTICAST_LOOP), never to
// another. Without it, head-end replication: a send becomes one unicast
// copy with DestQP 0xFFFFFF to every known member (the configured peers,
// every address heard from, the device itself, and with Config.Gossip
// the members other members know: gossip.go). The MGID is not in a
// packet sent to a unicast address, so such a receiver delivers it to
// every local QP attached to any group whose Q_Key matches the DETH
// Q_Key; IPoIB puts all its groups on one Q_Key and filters by IP
// destination above, so this is invisible to it.
//
// Socket I/O is batch-shaped and allocation-free: recvmmsg and sendmmsg
// are called directly on the runtime's non-blocking descriptor (through
// syscall.RawConn, so the netpoller still parks the goroutines) with
// header, iovec and sockaddr arrays allocated once. A 65520-byte IPoIB
// packet is 16 datagrams and leaves in one sendmmsg.
//
// Where the kernel has them, the socket uses UDP segmentation offloads:
// a run of equal-sized datagrams to one peer leaves as one UDP_SEGMENT
// message (GSO: one trip down the stack, cut late or never), and UDP_GRO
// hands back coalesced runs with their segment size, which the receive
// loop splits. Over IPv4 the ICRC covers the IP ID, which Linux numbers
// 0, 1, 2, ... across the segments of a GSO send, so the sender stamps
// segment j's ICRC for ID j (CRC linearity: a precomputed XOR per ID
// bit, wire.IDShift), and a receiver, which cannot see the ID through a
// UDP socket, accepts a packet whose ICRC is right for exactly one ID in
// [0, wire.MaxGSOSegments). IPv6 has no ID. GSO is off while faults are
// injected (a duplicate is one buffer staged twice). A capture taken
// before segmentation (veth, lo) shows a GSO send as one super-frame;
// icrccheck splits and verifies those, tshark does not.
//
// Faults (drop, duplicate, reorder, delay; seeded) are injected on
// transmit. IPoIB-CM asks for RC retry count 0, which suits a lossless IB
// link but turns one lost UDP datagram into a failed connection;
// Config.MinRetryCount lets the device raise that floor.
//
// The sending socket is unconnected and has IP_MTU_DISCOVER set to
// IP_PMTUDISC_DO, so Linux sends IPv4 ID 0 with DF set (0..n-1 across a
// GSO send), the IP header a receiver reconstructs to check the ICRC
// (docs/wire.md §4.6). All
// devices of one fabric bind the same UDP port (4791 by default): the
// peer's endpoint is its GID's address and that port, with no table.
// Datagrams leave from per-QP source ports (srcport.go): RoCEv2's ECMP
// entropy, as rdma_get_udp_sport computes it.
package rocev2
