// Package ipoibcm is the IPoIB engine: one Interface per ib0, carrying IP
// over InfiniBand in datagram mode (RFC 4391) and connected mode (RFC 4755)
// on top of any hca.Device, with the host on the other side speaking
// Ethernet through a HostPort.
package ipoibcm
