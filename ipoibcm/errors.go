package ipoibcm

import "errors"

var (
	// ErrClosed is returned by methods of a closed Interface.
	ErrClosed = errors.New("ipoibcm: interface closed")
	// ErrNotStarted is returned by methods that need a started Interface.
	ErrNotStarted = errors.New("ipoibcm: interface not started")
	// ErrAlreadyStarted is returned by a second Start.
	ErrAlreadyStarted = errors.New("ipoibcm: interface already started")

	errMACCollision = errors.New("MAC collision in neighbour table")
)
