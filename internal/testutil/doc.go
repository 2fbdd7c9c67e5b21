// Package testutil holds the helpers that tests of several packages share:
// readers of what the commands print, builders of test hosts and fabrics,
// checks that goroutines stopped. Only tests import it.
package testutil
