// Package tap is the host side of ib0 on Linux: a kernel TAP device that
// moves Ethernet frames for an ipoibcm.Interface (it satisfies
// ipoibcm.HostPort), plus the network-namespace and veth helpers the lab
// (ipoib fabric) and the iperf3 benchmark build their hosts with.
//
// A TAP is opened inside a chosen namespace: the opening goroutine locks
// its OS thread, enters the namespace, issues TUNSETIFF through water and
// returns; the file descriptor stays bound to the device wherever the
// process later runs. Link settings (MTU, addresses, txqueuelen, up/down)
// go through a netlink handle bound to that namespace, never through the
// ip command.
//
// Namespaces this package creates carry an owner marker (a file under
// DefaultMarkerDir naming the creating process), so a later run can remove
// the leftovers of a crashed one without ever touching a namespace it did
// not create.
//
// Config.Queues above 1 opens the TAP with IFF_MULTI_QUEUE, one vnet fd
// per queue (Device.Queues, and ipoibcm.MultiQueuePort's ReadQueue and
// WriteQueue*): the kernel spreads its flows over the queues, and each is
// read and written on its own.
package tap
