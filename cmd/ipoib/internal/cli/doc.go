// Package cli is the ipoib command line: subcommand dispatch and flags,
// the control-socket clients (show, mode), the lab of namespaces on a soft
// fabric (fabric, lab_soft.go), one ib0 over RoCEv2 (up, up_rocev2.go),
// the benchmarks (bench, through package bench) and the soak (soak.go:
// the flags become a soak.Config for package soak). cmd/ipoib only hands
// it the process's Env.
package cli
