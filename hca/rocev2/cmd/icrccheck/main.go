package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/ipoibcm/ipoib/hca/rocev2/wire"
)

// Exit statuses.
const (
	exitOK       = 0
	exitMismatch = 1
	exitUsage    = 2
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("icrccheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	port := fs.Uint("port", wire.RoCEv2Port, "UDP port of the RoCEv2 traffic")
	allowEmpty := fs.Bool("allow-empty", false, "a capture without RoCEv2 frames passes")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() == 0 || *port == 0 || *port > 65535 {
		fmt.Fprintln(stderr, "usage: icrccheck [-port N] [-allow-empty] FILE.pcap...")
		return exitUsage
	}
	status := exitOK
	for _, name := range fs.Args() {
		rep, err := checkFile(name, uint16(*port))
		if err != nil {
			fmt.Fprintf(stderr, "icrccheck: %v\n", err)
			return exitUsage
		}
		fmt.Fprintf(stdout, "%s: %v\n", name, rep)
		if rep.Bad > 0 || rep.Malformed > 0 || rep.RoCEv2 == 0 && !*allowEmpty {
			status = exitMismatch
		}
	}
	return status
}

func checkFile(name string, port uint16) (wire.ICRCReport, error) {
	f, err := os.Open(name)
	if err != nil {
		return wire.ICRCReport{}, fmt.Errorf("open capture: %w", err)
	}
	defer f.Close()
	rep, err := wire.CheckPcapICRC(f, port)
	if err != nil {
		return rep, fmt.Errorf("%s: %w", name, err)
	}
	return rep, nil
}
