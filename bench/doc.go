// Package bench measures throughput and runs soak harnesses.
//
// In-process (no root): InProcTCP moves bytes over TCP between two gVisor
// hosts (tap/netstack) joined by a LinkFactory, DirectLink being the
// in-memory baseline and ib0 (two IPoIB engines on a soft fabric) the
// subject. Across namespaces (root, iperf3): RunIperfSuite compares ib0
// with veth and a TAP pipe. Reports print as tables or JSON.
package bench
