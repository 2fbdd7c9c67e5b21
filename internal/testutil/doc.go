// Package testutil holds the helpers that tests of several packages
// share, so that no test carries its own copy: the slow reference
// Internet checksum (checksum.go), goroutine-leak checks (goroutines.go),
// reading numbers out of 'ipoib show --json' (json.go), root and
// namespace skips (root_linux.go), checked TCP and USO transfers between
// namespaces (transfer.go, uso_linux.go), and readers of tshark and SVG
// output (tshark.go, svg.go). Only tests import it, and it imports no
// package of this module, so any of their tests may.
package testutil
