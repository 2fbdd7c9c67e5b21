// Package control is the control socket of a running ipoib process: one
// unix socket per process under DefaultDir (/run/ipoib/<pid>.sock) that
// answers newline-delimited JSON requests to list the process's
// interfaces, snapshot their statistics and switch their mode. The ipoib
// show and ipoib mode commands are its clients; Format renders a snapshot
// as text in the manner of ip -s link and ethtool -S.
//
// The package knows interfaces only through the Endpoint interface, so it
// depends on nothing in the engine; the statistics travel as the JSON the
// engine's Stats type marshals to.
package control
