package cm

import (
	"encoding/binary"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ipoibcm/ipoib/hca"
	"github.com/ipoibcm/ipoib/hca/soft"
)

// wireDev wraps a device so the test sees every MAD the Manager posts on
// its GSI QP, and every attribute the Manager gives an RC QP, with the
// (fake) time it happened.
type wireDev struct {
	hca.Device
	mu   sync.Mutex
	mads []sentMAD
}

type sentMAD struct {
	at  time.Time
	mad []byte
}

func (d *wireDev) CreateQP(cfg hca.QPConfig) (hca.QP, error) {
	qp, err := d.Device.CreateQP(cfg)
	if err != nil || cfg.Type != hca.QPTypeGSI {
		return qp, err
	}
	return &wireGSI{QP: qp, d: d}, nil
}

type wireGSI struct {
	hca.QP
	d *wireDev
}

func (q *wireGSI) PostSend(wrs []hca.SendWR) (int, error) {
	q.d.mu.Lock()
	for _, wr := range wrs {
		q.d.mads = append(q.d.mads, sentMAD{time.Now(), append([]byte(nil), wr.Data...)})
	}
	q.d.mu.Unlock()
	return q.QP.PostSend(wrs)
}

// sent returns the MADs of type t posted so far.
func (d *wireDev) sent(t MsgType) []sentMAD {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []sentMAD
	for _, s := range d.mads {
		if len(s.mad) > madAttrIDOffset+1 && MsgType(binary.BigEndian.Uint16(s.mad[madAttrIDOffset:])) == t {
			out = append(out, s)
		}
	}
	return out
}

// attrQP records the attributes of every Modify.
type attrQP struct {
	hca.QP
	mu    sync.Mutex
	attrs map[hca.QPState]hca.QPAttr
}

func (q *attrQP) Modify(a hca.QPAttr) error {
	q.mu.Lock()
	q.attrs[a.State] = a
	q.mu.Unlock()
	return q.QP.Modify(a)
}

func (q *attrQP) attr(s hca.QPState) hca.QPAttr {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.attrs[s]
}

// wireNode is a Manager with default Options (the values Linux's IPoIB
// asks for) on a recording device.
type wireNode struct {
	dev *wireDev
	m   *Manager
	cq  hca.CQ
}

func newWireNode(t *testing.T, f *soft.Fabric, name string) *wireNode {
	t.Helper()
	sd, err := f.NewDevice(name)
	if err != nil {
		t.Fatal(err)
	}
	n := &wireNode{dev: &wireDev{Device: sd}}
	if n.cq, err = sd.CreateCQ(hca.CQConfig{Size: 64}); err != nil {
		t.Fatal(err)
	}
	if n.m, err = NewManager(n.dev, Options{Seed: 7}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.m.Close() })
	return n
}

func (n *wireNode) rcQP(t *testing.T) *attrQP {
	t.Helper()
	qp, err := n.dev.CreateQP(hca.QPConfig{Type: hca.QPTypeRC, SendCQ: n.cq, RecvCQ: n.cq, MaxSendWR: 16, MaxRecvWR: 16})
	if err != nil {
		t.Fatal(err)
	}
	if err := qp.Modify(hca.QPAttr{State: hca.QPStateInit}); err != nil {
		t.Fatal(err)
	}
	return &attrQP{QP: qp, attrs: make(map[hca.QPState]hca.QPAttr)}
}

// field is one row of the table: what we send or do, and the Linux
// function the expected value comes from.
type field struct {
	name  string
	linux string
	got   any
	want  any
}

func checkFields(t *testing.T, msg string, rows []field) {
	t.Helper()
	for _, r := range rows {
		if r.got != r.want {
			t.Errorf("%s %s = %v, want %v (%s)", msg, r.name, r.got, r.want, r.linux)
		}
	}
}

// TestWireValuesAsLinux runs one IPoIB-CM connection through setup and
// teardown and checks every field of the REQ, REP, RTU, DREQ and DREP on
// the wire, the attributes both QPs get and the CM's timers, each against
// the Linux function it comes from (drivers/infiniband/core/cm.c,
// drivers/infiniband/ulp/ipoib/ipoib_cm.c). The connect and accept
// parameters are those ipoibcm passes (cmtx.go, cmrx.go); RetryCount is
// --rc-retry's 6, so the test also shows the passive QP taking it from the
// REQ.
func TestWireValuesAsLinux(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newTestFabric(t, soft.Faults{})
		a, b := newWireNode(t, f, "a"), newWireNode(t, f, "b")
		const udQPN, rcRetry, repPSN = 0x48, 6, 0xABCD
		var bqp *attrQP
		var pc *Conn
		if _, err := b.m.Listen([]uint64{ietfSID}, func(r *Request) Decision {
			bqp, pc = b.rcQP(t), r.Conn
			return Decision{QP: bqp, StartingPSN: repPSN, PrivateData: ipoibPrivate(0x49), SRQ: true}
		}); err != nil {
			t.Fatal(err)
		}
		aqp := a.rcQP(t)
		type stamped struct {
			ev Event
			at time.Time
		}
		events := make(chan stamped, 8)
		c, err := a.m.Connect(ConnectParams{
			DestGID: b.dev.Port().GID, ServiceID: ietfSID, QP: aqp, PathMTU: hca.MTU4096,
			PrivateData: ipoibPrivate(udQPN), RetryCount: rcRetry, ResponderResources: 4, SRQ: true,
		}, func(ev Event) { events <- stamped{ev, time.Now()} })
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if c.State() != StateEstablished || pc == nil || pc.State() != StateEstablished {
			t.Fatalf("not established: %s", c.State())
		}
		if err := c.Disconnect(); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()

		one := func(d *wireDev, typ MsgType, m Message) time.Time {
			t.Helper()
			s := d.sent(typ)
			if len(s) != 1 {
				t.Fatalf("%d %s sent, want 1", len(s), typ)
			}
			if err := m.Unmarshal(s[0].mad); err != nil {
				t.Fatal(err)
			}
			return s[0].at
		}
		var req REQ
		var rep REP
		var rtu RTU
		var dreq DREQ
		var drep DREP
		one(a.dev, MsgREQ, &req)
		one(b.dev, MsgREP, &rep)
		one(a.dev, MsgRTU, &rtu)
		one(a.dev, MsgDREQ, &dreq)
		drepAt := one(b.dev, MsgDREP, &drep)
		aLim, bLim := a.dev.Limits(), b.dev.Limits()
		// soft is a software HCA like rxe: RXE_LOCAL_CA_ACK_DELAY 15.
		if aLim.LocalCAACKDelay != 15 {
			t.Fatalf("soft ACK delay %d", aLim.LocalCAACKDelay)
		}
		// cm_ack_timeout(15, CMA_IBOE_PACKET_LIFETIME 16) = 17.
		const lat = 17
		if got := ackTimeout(15, 16); got != lat {
			t.Fatalf("ackTimeout(15, 16) = %d", got)
		}

		checkFields(t, "REQ", []field{
			{"Local Comm ID", "cm_format_req: cm_id local_id", req.LocalCommID, c.LocalCommID()},
			{"Service ID", "ipoib_cm_send_req: IPOIB_CM_IETF_ID | qpn", req.ServiceID, uint64(ietfSID)},
			{"Local CA GUID", "cm_format_req: device node_guid", req.LocalCAGUID, aLim.NodeGUID},
			{"Local Q_Key", "cm_format_req: not set for RC", req.LocalQKey, uint32(0)},
			{"Local QPN", "ipoib_cm_send_req: qp->qp_num", req.LocalQPN, aqp.QPN()},
			{"Responder Resources", "ipoib_cm_send_req: 4", req.ResponderResources, uint8(4)},
			{"Local EECN", "cm_format_req: not set for RC", req.LocalEECN, uint32(0)},
			{"Initiator Depth", "ipoib_cm_send_req: left 0", req.InitiatorDepth, uint8(0)},
			{"Remote EECN", "cm_format_req: not set for RC", req.RemoteEECN, uint32(0)},
			{"Remote CM Response Timeout", "ipoib_cm_send_req: 20", req.RemoteCMResponseTimeout, uint8(20)},
			{"Transport Service Type", "cm_req_set_qp_type: IB_QPT_RC", req.TransportServiceType, uint8(TransportRC)},
			{"End-to-End Flow Control", "ipoib_cm_send_req: flow_control 0", req.EndToEndFlowControl, false},
			{"Starting PSN", "ipoib_cm_send_req: 0 /* FIXME */", req.StartingPSN, uint32(0)},
			{"Local CM Response Timeout", "ipoib_cm_send_req: 20", req.LocalCMResponseTimeout, uint8(20)},
			{"Retry Count", "ipoib_cm_send_req: 0; ours --rc-retry (docs/decisions.md)", req.RetryCount, uint8(rcRetry)},
			{"P_Key", "cm_format_req: primary_path->pkey", req.PKey, hca.PKeyDefault},
			{"Path MTU", "cm_format_req: primary_path->mtu", req.PathMTU, hca.MTU4096},
			{"RDC Exists", "cm_format_req: never set", req.RDCExists, false},
			{"RNR Retry Count", "ipoib_cm_send_req: 0", req.RNRRetryCount, uint8(0)},
			{"Max CM Retries", "ipoib_cm_send_req: 15", req.MaxCMRetries, uint8(15)},
			{"SRQ", "ipoib_cm_send_req: ipoib_cm_has_srq", req.SRQ, true},
			{"Extended Transport Type", "cm_format_req: RC", req.ExtendedTransportType, uint8(0)},
			{"Primary Local LID", "cm_format_req: hop_limit > 1 -> IB_LID_PERMISSIVE", req.Primary.LocalLID, uint16(0xFFFF)},
			{"Primary Remote LID", "cm_format_req: hop_limit > 1 -> IB_LID_PERMISSIVE", req.Primary.RemoteLID, uint16(0xFFFF)},
			{"Primary Local GID", "cm_format_req: pri_path->sgid", req.Primary.LocalGID, a.dev.Port().GID},
			{"Primary Remote GID", "cm_format_req: pri_path->dgid", req.Primary.RemoteGID, b.dev.Port().GID},
			{"Primary Flow Label", "cm_format_req: pri_path->flow_label (0: none)", req.Primary.FlowLabel, uint32(0)},
			{"Primary Traffic Class", "cm_format_req: pri_path->traffic_class", req.Primary.TrafficClass, uint8(0)},
			{"Primary Hop Limit", "cma_resolve_iboe_route: the route's hop limit", req.Primary.HopLimit, uint8(64)},
			{"Primary SL", "cm_format_req: pri_path->sl", req.Primary.SL, uint8(0)},
			{"Primary Subnet Local", "cm_format_req: hop_limit <= 1", req.Primary.SubnetLocal, false},
			{"Primary Local ACK Timeout", "cm_format_req: cm_ack_timeout(ack_delay, packet_life_time)", req.Primary.LocalACKTimeout, uint8(lat)},
			{"Alternate path", "ipoib_cm_send_req: alternate_path NULL", req.Alternate, Path{}},
			{"Private Data", "ipoib_cm_send_req: {UD QPN, IPOIB_CM_BUF_SIZE}", [8]byte(req.PrivateData[:8]), [8]byte(ipoibPrivate(udQPN))},
		})
		checkFields(t, "REP", []field{
			{"TID", "cm_format_rep: cm_id_priv->tid (the REQ's)", rep.TransactionID, req.TransactionID},
			{"Local Comm ID", "cm_format_rep: local_id", rep.LocalCommID, pc.LocalCommID()},
			{"Remote Comm ID", "cm_format_rep: remote_id", rep.RemoteCommID, req.LocalCommID},
			{"Local Q_Key", "cm_format_rep: not set for RC", rep.LocalQKey, uint32(0)},
			{"Local QPN", "ipoib_cm_send_rep: qp->qp_num", rep.LocalQPN, bqp.QPN()},
			{"Local EECN", "cm_format_rep: not set for RC", rep.LocalEECN, uint32(0)},
			{"Starting PSN", "ipoib_cm_send_rep: psn", rep.StartingPSN, uint32(repPSN)},
			{"Responder Resources", "ipoib_cm_send_rep: left 0", rep.ResponderResources, uint8(0)},
			{"Initiator Depth", "ipoib_cm_send_rep: left 0", rep.InitiatorDepth, uint8(0)},
			{"Target ACK Delay", "cm_format_rep: cm_dev->ack_delay", rep.TargetACKDelay, bLim.LocalCAACKDelay},
			{"Failover Accepted", "cm_format_rep: param 0", rep.FailoverAccepted, uint8(0)},
			{"End-to-End Flow Control", "ipoib_cm_send_rep: flow_control 0", rep.EndToEndFlowControl, false},
			{"RNR Retry Count", "ipoib_cm_send_rep: req->rnr_retry_count", rep.RNRRetryCount, req.RNRRetryCount},
			{"SRQ", "ipoib_cm_send_rep: ipoib_cm_has_srq", rep.SRQ, true},
			{"Local CA GUID", "cm_format_rep: device node_guid", rep.LocalCAGUID, bLim.NodeGUID},
			{"Private Data", "ipoib_cm_send_rep: {UD QPN, IPOIB_CM_BUF_SIZE}", [8]byte(rep.PrivateData[:8]), [8]byte(ipoibPrivate(0x49))},
		})
		checkFields(t, "RTU", []field{
			{"TID", "cm_format_rtu: cm_id_priv->tid", rtu.TransactionID, req.TransactionID},
			{"Local Comm ID", "cm_format_rtu: local_id", rtu.LocalCommID, req.LocalCommID},
			{"Remote Comm ID", "cm_format_rtu: remote_id", rtu.RemoteCommID, rep.LocalCommID},
			{"Private Data", "ipoib_cm_rep_handler: ib_send_cm_rtu(cm_id, NULL, 0)", rtu.PrivateData, [RTUPrivateDataSize]byte{}},
		})
		checkFields(t, "DREQ", []field{
			{"TID", "cm_format_dreq: cm_form_tid, a new one", dreq.TransactionID != req.TransactionID, true},
			{"Local Comm ID", "cm_format_dreq: local_id", dreq.LocalCommID, req.LocalCommID},
			{"Remote Comm ID", "cm_format_dreq: remote_id", dreq.RemoteCommID, rep.LocalCommID},
			{"Remote QPN", "cm_format_dreq: remote_qpn", dreq.RemoteQPN, bqp.QPN()},
			{"Private Data", "ipoib_cm_tx_destroy: ib_destroy_cm_id -> ib_send_cm_dreq(NULL, 0)", dreq.PrivateData, [DREQPrivateDataSize]byte{}},
		})
		checkFields(t, "DREP", []field{
			{"TID", "cm_format_drep: cm_id_priv->tid (the DREQ's)", drep.TransactionID, dreq.TransactionID},
			{"Local Comm ID", "cm_format_drep: local_id", drep.LocalCommID, rep.LocalCommID},
			{"Remote Comm ID", "cm_format_drep: remote_id", drep.RemoteCommID, req.LocalCommID},
			{"Private Data", "ipoib_cm_rx_handler: ib_send_cm_drep(NULL, 0)", drep.PrivateData, [DREPPrivateDataSize]byte{}},
		})
		artr, arts := aqp.attr(hca.QPStateRTR), aqp.attr(hca.QPStateRTS)
		brtr, brts := bqp.attr(hca.QPStateRTR), bqp.attr(hca.QPStateRTS)
		checkFields(t, "QP", []field{
			{"active RTR Dest QPN", "cm_init_qp_rtr_attr: remote_qpn", artr.DestQPN, bqp.QPN()},
			{"active RTR RQ PSN", "cm_init_qp_rtr_attr: rq_psn (the REQ's)", artr.RQPSN, req.StartingPSN},
			{"active RTR min RNR timer", "cm_init_qp_rtr_attr: min_rnr_timer = 0", artr.MinRNRTimer, uint8(0)},
			{"active RTS SQ PSN", "cm_init_qp_rts_attr: sq_psn (the REP's)", arts.SQPSN, uint32(repPSN)},
			{"active RTS timeout", "cm_rep_handler: cm_ack_timeout(target_ack_delay, life time)", arts.Timeout, ackTimeout(rep.TargetACKDelay, 16)},
			{"active RTS retry count", "cm_init_qp_rts_attr: retry_count (ours)", arts.RetryCount, req.RetryCount},
			{"active RTS RNR retry", "cm_rep_handler: the REP's RNR retry count", arts.RNRRetry, rep.RNRRetryCount},
			{"passive RTR Dest QPN", "cm_init_qp_rtr_attr: remote_qpn (the REQ's)", brtr.DestQPN, aqp.QPN()},
			{"passive RTR RQ PSN", "ipoib_cm_modify_rx_qp: rq_psn = psn", brtr.RQPSN, uint32(repPSN)},
			{"passive RTR min RNR timer", "cm_init_qp_rtr_attr: min_rnr_timer = 0", brtr.MinRNRTimer, uint8(0)},
			{"passive RTS SQ PSN", "cm_init_qp_rts_attr: sq_psn (the REQ's)", brts.SQPSN, req.StartingPSN},
			{"passive RTS timeout", "cm_req_handler: av timeout = REQ Local ACK Timeout", brts.Timeout, req.Primary.LocalACKTimeout},
			{"passive RTS retry count", "cm_req_handler: the REQ's retry count", brts.RetryCount, req.RetryCount},
			{"passive RTS RNR retry", "cm_req_handler: the REQ's RNR retry count", brts.RNRRetry, req.RNRRetryCount},
		})

		// Time-wait after the DREP: cm_enter_timewait waits
		// cm_convert_to_ms(av.timeout) = 2^(17-8) ms.
		var exit stamped
		for exit = range events {
			if exit.ev.Type == EventTimeWaitExit {
				break
			}
		}
		if got, want := exit.at.Sub(drepAt), 512*time.Millisecond; got != want {
			t.Errorf("time-wait %v, want %v (cm_enter_timewait)", got, want)
		}

		// A REQ nobody answers is resent every 2 * cm_convert_to_ms(16) +
		// cm_convert_to_ms(20) = 4608 ms (ib_send_cm_req timeout_ms), 15
		// times, then dropped without a REJ (cm_process_send_error).
		silent, err := f.NewDevice("silent")
		if err != nil {
			t.Fatal(err)
		}
		before := len(a.dev.sent(MsgREQ))
		gone := make(chan Event, 1)
		if _, err := a.m.Connect(ConnectParams{DestGID: silent.GID(), ServiceID: ietfSID, QP: a.rcQP(t), PathMTU: hca.MTU4096},
			func(ev Event) { gone <- ev }); err != nil {
			t.Fatal(err)
		}
		ev := <-gone
		reqs := a.dev.sent(MsgREQ)[before:]
		if ev.Type != EventTimedOut || len(reqs) != 16 {
			t.Fatalf("event %s after %d REQs", ev.Type, len(reqs))
		}
		for i := 1; i < len(reqs); i++ {
			if d := reqs[i].at.Sub(reqs[i-1].at); d != 4608*time.Millisecond {
				t.Fatalf("REQ %d resent after %v, want 4.608s", i, d)
			}
		}
		if len(a.dev.sent(MsgREJ)) != 0 {
			t.Fatal("REJ sent on timeout")
		}
	})
}
