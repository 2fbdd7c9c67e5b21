package ipoibcm

import "errors"

var (
	// ErrClosed is returned by methods of a closed Interface.
	ErrClosed = errors.New("ipoibcm: interface closed")
	// ErrNotStarted is returned by methods that need a started Interface.
	ErrNotStarted = errors.New("ipoibcm: interface not started")
	// ErrAlreadyStarted is returned by a second Start.
	ErrAlreadyStarted = errors.New("ipoibcm: interface already started")
	// ErrHostMTUNotUpdated is wrapped (with the host port's error) by
	// SetMode when the mode switched but the host refused the new MTU.
	ErrHostMTUNotUpdated = errors.New("ipoibcm: mode switched but the host MTU was not updated")

	errMACsExhausted = errors.New("no free MAC index in the neighbour table")
)
