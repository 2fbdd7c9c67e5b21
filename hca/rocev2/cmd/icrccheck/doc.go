// Command icrccheck verifies the RoCEv2 ICRC of every packet in classic
// pcap captures, the check tshark displays but never makes:
//
//	icrccheck [-port 4791] FILE.pcap...
//
// It prints one line of counts per file and exits 1 if any RoCEv2 frame
// fails (or a file has no RoCEv2 frame at all), 2 on bad usage or an
// unreadable file. Classic pcap and pcapng are read (ipoib capture writes
// pcapng; its event interface counts as "other").
//
// Each frame is checked with the IP header it was captured with, so the
// IPv4 IDs 0, 1, 2, ... that Linux gives the segments of a UDP GSO send
// verify as they are. A capture point before segmentation (veth, lo)
// records a GSO send as one super-frame; icrccheck finds its segment size
// and verifies every segment with the headers segmentation gives it.
package main
