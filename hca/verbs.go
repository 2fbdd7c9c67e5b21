package hca

// Device is one HCA with a single port.
type Device interface {
	// Name is a human-readable name, unique within its fabric.
	Name() string
	// Port returns the current port attributes.
	Port() Port
	// Limits returns the device capabilities.
	Limits() Limits

	// Alloc returns memory the device has registered for DMA. Every buffer
	// named in a work request must lie inside memory obtained here.
	Alloc(size int) ([]byte, error)

	CreateCQ(cfg CQConfig) (CQ, error)
	CreateSRQ(cfg SRQConfig) (SRQ, error)
	CreateQP(cfg QPConfig) (QP, error)
	// CreateAH makes an address handle for UD sends to dgid (a unicast GID or
	// a multicast MGID).
	CreateAH(dgid GID) (AH, error)

	// OnPortEvent registers fn for EventPortActive / EventPortErr /
	// EventPortPKeyChange and returns
	// a function that unregisters it. Events are delivered outside locks.
	OnPortEvent(fn func(AsyncEvent)) (cancel func())

	// Close destroys whatever the consumer left and detaches the device.
	Close() error
}

// CQConfig configures a completion queue.
type CQConfig struct {
	// Size is the number of CQEs the CQ can hold. Overflow raises
	// EventCQErr and the completion is lost.
	Size int
	// OnCompletion runs when a completion arrives on an armed CQ (the
	// completion event). It must not block; it runs outside backend locks
	// and may run concurrently with Poll and Notify. Unless
	// InlineCompletion is set it never runs inside the consumer's own verb
	// call, so it may take locks the consumer holds while posting.
	OnCompletion func()
	// InlineCompletion lets the backend call OnCompletion synchronously
	// from inside the verb call that produced the completion (PostSend,
	// PostRecv, Modify, Destroy of any QP or SRQ of the fabric), on the
	// caller's goroutine, after releasing every backend lock, instead of
	// handing it to an event goroutine: as rxe calls comp_handler from
	// the posting context. Set it only when OnCompletion neither blocks
	// nor takes a lock that any goroutine may hold while calling a verb;
	// napi.Context.Schedule qualifies. A backend may ignore it (hca/rocev2
	// delivers from its receive goroutine anyway). Asynchronous events
	// are never delivered inline.
	InlineCompletion bool
	// OnEvent receives EventCQErr.
	OnEvent func(AsyncEvent)
}

// CQ is a completion queue.
type CQ interface {
	// Poll moves up to len(into) completions into into and returns how many.
	// It never blocks.
	Poll(into []WC) int
	// Notify arms the CQ for one completion event. With reportMissed it
	// returns true if the CQ already holds completions, meaning the caller
	// must poll again because an event for them may never come
	// (IB_CQ_REPORT_MISSED_EVENTS).
	Notify(reportMissed bool) bool
	Destroy() error
}

// SRQConfig configures a shared receive queue.
type SRQConfig struct {
	MaxWR int
	// OnEvent receives EventSRQLimitReached.
	OnEvent func(AsyncEvent)
}

// SRQ is a shared receive queue.
type SRQ interface {
	PostRecv(wrs []RecvWR) (int, error)
	// ArmLimit arms the limit event: when the number of posted buffers
	// falls below limit, EventSRQLimitReached fires once.
	ArmLimit(limit int) error
	// Posted is the number of receive buffers currently posted.
	Posted() int
	Destroy() error
}

// QPConfig configures a queue pair.
type QPConfig struct {
	Type   QPType
	SendCQ CQ
	RecvCQ CQ
	// SRQ, if set, is where the QP takes its receive buffers; its own
	// receive queue is then unused.
	SRQ       SRQ
	MaxSendWR int
	MaxRecvWR int
	// Context is returned in every work completion and async event of this
	// QP. Consumers identify the owner of a completion by it.
	Context any
	// OnEvent receives the QP's affiliated events: EventQPLastWQEReached,
	// EventQPFatal.
	OnEvent func(AsyncEvent)
}

// QPAttr carries the attributes of a state transition. Only the fields
// relevant for the transition to State are read:
//
//	-> Init: PKeyIndex, QKey (UD)
//	-> RTR (RC): DestQPN, DestGID, RQPSN, PathMTU, MinRNRTimer
//	-> RTS (RC): SQPSN, Timeout, RetryCount, RNRRetry
//	-> RTS (UD): SQPSN
type QPAttr struct {
	State     QPState
	PKeyIndex int
	QKey      QKey

	DestQPN     QPN
	DestGID     GID
	RQPSN       uint32
	PathMTU     MTU
	MinRNRTimer uint8 // IBTA RNR timer code 0..31

	SQPSN      uint32
	Timeout    uint8 // 4.096 us * 2^Timeout; 0 = infinite
	RetryCount uint8 // 0..7
	RNRRetry   uint8 // 0..7; 7 = retry forever
}

// QP is a queue pair.
type QP interface {
	QPN() QPN
	Type() QPType
	State() QPState
	// Modify moves the QP to attr.State. Illegal transitions return an error
	// wrapping ErrIllegalTransition and change nothing.
	Modify(attr QPAttr) error
	// PostSend posts send work requests and returns how many were accepted.
	// On a QP in the Error state sends are accepted and complete with
	// StatusWRFlushErr (the drain work request depends on this).
	PostSend(wrs []SendWR) (int, error)
	// PostRecv posts to the QP's own receive queue (not for SRQ QPs).
	PostRecv(wrs []RecvWR) (int, error)
	// AttachMcast joins the UD QP to a multicast group; DetachMcast leaves.
	AttachMcast(mgid GID) error
	DetachMcast(mgid GID) error
	// Destroy releases the QP. Completions already queued may still be
	// delivered later, carrying the QP's context.
	Destroy() error
}

// AH is an address handle for UD sends.
type AH interface {
	DGID() GID
	Destroy() error
}

// SendWR is a send work request. Data is one gather element.
type SendWR struct {
	ID   uint64
	Data []byte
	// Flags ask for offloads (SendIPCsum).
	Flags SendFlags
	// MSS, when positive, makes this a UD LSO send (IB_WR_LSO): Data is
	// one TCP or UDP super packet behind the IPoIB header, at most
	// Offloads.UDLSOMaxSize bytes, and the device sends it as UD packets
	// of its headers plus at most MSS payload bytes each, every one with
	// its own IP length, IPv4 ID, TCP sequence number and checksums. It
	// completes as one work request. Requests the device cannot honour
	// fail at PostSend (ErrLSOTooLarge, ErrInvalidArgument).
	MSS int
	// UD only: destination address, QPN (QPNMulticast for groups) and Q_Key.
	AH         AH
	RemoteQPN  QPN
	RemoteQKey QKey
	// PKeyIndex is the P_Key table index of a GSI (QP 1) send, as
	// ib_ud_wr.pkey_index: QP 1 serves every partition, so each MAD
	// names its own. UD and RC sends ignore it and use the
	// QP's P_Key, set by QPAttr.PKeyIndex at Init.
	PKeyIndex int
}

// RecvWR is a receive work request. Buf is one scatter element.
type RecvWR struct {
	ID  uint64
	Buf []byte
}

// WC is a work completion.
type WC struct {
	ID      uint64
	Status  Status
	Opcode  WCOpcode
	ByteLen int
	QPN     QPN
	// Context is the owning QP's QPConfig.Context.
	Context any
	// UD receives only: the sender's QPN and GID.
	SrcQPN QPN
	SrcGID GID
	// UD receives only: the P_Key of the packet (from the BTH). The GSI
	// QP receives every P_Key that matches an entry of the port's table;
	// other QPs only their own partition's.
	PKey PKey
	// Flags report the offloads' verdict on a received message
	// (WCIPCsumOK, WCCsumPartial).
	Flags WCFlags
}
