package ipoibcm

import "sync/atomic"

// dropReason names why a packet was dropped. Every packet the Interface
// takes in is either delivered/sent or counted under exactly one reason.
//
//go:generate go tool stringer -type=dropReason -linecomment
type dropReason int

const (
	dropTxUnknownEthertype dropReason = iota // tx_unknown_ethertype
	dropTxTruncated                          // tx_truncated
	dropTxVLAN                               // tx_vlan
	dropTxOversize                           // tx_oversize
	dropTxTooBig                             // tx_too_big
	dropTxUnknownNeighbour                   // tx_unknown_neighbour
	dropTxNeighQueueFull                     // tx_neigh_queue_full
	dropTxNeighFlushed                       // tx_neigh_flushed
	dropTxBadARP                             // tx_bad_arp
	dropTxBadND                              // tx_bad_nd
	dropTxPostFailed                         // tx_post_failed
	dropTxSendError                          // tx_send_error
	dropTxNoAH                               // tx_no_ah
	dropTxNotIP                              // tx_not_ip
	dropTxLinkDown                           // tx_link_down
	dropTxBadMcastReport                     // tx_bad_mcast_report
	dropTxMcastTableFull                     // tx_mcast_table_full
	dropTxBadOffload                         // tx_bad_offload
	dropTxGSONoRoom                          // tx_gso_no_room
	dropTxLSOTooLarge                        // tx_lso_too_large
	dropRxTruncatedHeader                    // rx_truncated_header
	dropRxUnknownEthertype                   // rx_unknown_ethertype
	dropRxOwnEcho                            // rx_own_echo
	dropRxBadARP                             // rx_bad_arp
	dropRxBadND                              // rx_bad_nd
	dropRxBadIP                              // rx_bad_ip
	dropRxError                              // rx_error
	dropRxHostWrite                          // rx_host_write
	dropRxFromUnknownConn                    // rx_unknown_conn
	dropRxLinkDown                           // rx_link_down
	numDropReasons
)

// isTX tells which Linux counter a drop also feeds: tx_dropped or
// rx_dropped.
func (r dropReason) isTX() bool { return r < dropRxTruncatedHeader }

// counters are the data-path counters: atomics, no lock per packet.
type counters struct {
	rxPackets, txPackets, rxBytes, txBytes atomic.Uint64
	txErrors, rxDropped, txDropped         atomic.Uint64
	multicast, rxDeadDropped               atomic.Uint64
	drops                                  [numDropReasons]atomic.Uint64
}

// drop counts one dropped packet under r and under the Linux counter.
func (c *counters) drop(r dropReason) {
	c.drops[r].Add(1)
	switch {
	case r.isTX():
		c.txDropped.Add(1)
	case r == dropRxOwnEcho:
		// Our own multicast replicated back by the fabric is not a loss:
		// Linux's ipoib_ib_handle_rx_wc discards it without touching
		// rx_dropped, and ip -s link users compare against that.
	default:
		c.rxDropped.Add(1)
	}
}
