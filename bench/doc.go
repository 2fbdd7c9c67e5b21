// Package bench measures throughput.
//
// In-process (no root): InProcTCP moves bytes over TCP between two gVisor
// hosts (tap/netstack) joined by a LinkFactory: DirectLink, the in-memory
// baseline, or IBLink, two IPoIB engines on a soft fabric in connected or
// datagram mode. RunInProcSuite measures all of them with the same host
// settings, the median of several interleaved runs, and reports the ratios
// (connected/direct, connected/datagram). Across namespaces (root,
// iperf3): RunIperfSuite compares ib0 with veth and a TAP pipe. Reports
// print as tables or JSON. The reaping soak is package soak.
package bench
