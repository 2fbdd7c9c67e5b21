// Package cli is the ipoib command line without the engine: subcommand
// dispatch, flags, the control-socket clients (show, mode), the lab
// (fabric) and bench orchestration. The engine is reached only through
// the Engine interface, which cmd/ipoib wires to ipoibcm and hca/soft, so
// everything here is testable on its own.
package cli
