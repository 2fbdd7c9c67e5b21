package hca

import "errors"

// Errors returned by backends; wrap them with context, test with errors.Is.
var (
	// ErrDestroyed: the object was destroyed; the call did nothing.
	ErrDestroyed = errors.New("object destroyed")
	// ErrQueueFull: the work queue has no room for the request.
	ErrQueueFull = errors.New("work queue full")
	// ErrInvalidState: the QP's state does not allow the operation (posting
	// a send before RTS, a receive before Init).
	ErrInvalidState = errors.New("operation not allowed in QP state")
	// ErrInvalidArgument: a configuration or work request is malformed.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrNotSupported: the backend does not provide the feature.
	ErrNotSupported = errors.New("not supported")
	// ErrBusy: the object is still in use (CQ with QPs attached, QP
	// attached to multicast groups, GSI QP already created).
	ErrBusy = errors.New("resource busy")
	// ErrNoResources: a device limit was reached.
	ErrNoResources = errors.New("out of resources")
)
