package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// ErrIperfMissing is returned when iperf3 or ip is not installed.
var ErrIperfMissing = errors.New("iperf3 not in PATH: apt-get install iperf3")

// IperfSpec is one iperf3 TCP test between two named namespaces.
type IperfSpec struct {
	ServerNetns, ClientNetns string
	ServerAddr               netip.Addr
	// Port defaults to 5201.
	Port int
	// Duration of the client's test; default 5s.
	Duration time.Duration
	// Streams is iperf3 -P; default 1.
	Streams int
	// ReadyTimeout bounds the wait for the server to listen; default 10s.
	ReadyTimeout time.Duration
}

func (s *IperfSpec) defaults() {
	if s.Port == 0 {
		s.Port = 5201
	}
	if s.Duration <= 0 {
		s.Duration = 5 * time.Second
	}
	if s.Streams <= 0 {
		s.Streams = 1
	}
	if s.ReadyTimeout <= 0 {
		s.ReadyTimeout = 10 * time.Second
	}
}

// CheckIperfTools reports whether iperf3 and ip are installed.
func CheckIperfTools() error {
	if _, err := exec.LookPath("iperf3"); err != nil {
		return ErrIperfMissing
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return errors.New("ip not in PATH: apt-get install iproute2")
	}
	return nil
}

// netnsCommand runs name args inside the namespace through ip netns exec.
func netnsCommand(ctx context.Context, netnsName, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", netnsName, name}, args...)...)
}

// RunIperf3 starts a one-shot iperf3 server in spec.ServerNetns, waits
// until it listens, runs the client in spec.ClientNetns with -J and parses
// the result. The raw client JSON is returned too, for the report.
func RunIperf3(ctx context.Context, spec IperfSpec) (IperfResult, []byte, error) {
	spec.defaults()
	if err := CheckIperfTools(); err != nil {
		return IperfResult{}, nil, err
	}
	port := strconv.Itoa(spec.Port)
	srvCtx, cancelSrv := context.WithCancel(ctx)
	defer cancelSrv()
	srv := netnsCommand(srvCtx, spec.ServerNetns, "iperf3", "-s", "-1", "-B", spec.ServerAddr.String(), "-p", port, "--forceflush")
	srvOut, err := srv.StdoutPipe()
	if err != nil {
		return IperfResult{}, nil, fmt.Errorf("iperf3 server: %w", err)
	}
	var srvErr bytes.Buffer
	srv.Stderr = &srvErr
	if err := srv.Start(); err != nil {
		return IperfResult{}, nil, fmt.Errorf("iperf3 server: start: %w", err)
	}
	srvDone := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(srvOut)
		signalled := false
		for sc.Scan() {
			if !signalled && strings.Contains(sc.Text(), "Server listening") {
				close(ready)
				signalled = true
			}
		}
		io.Copy(io.Discard, srvOut)
		srvDone <- srv.Wait()
	}()
	timer := time.NewTimer(spec.ReadyTimeout)
	defer timer.Stop()
	select {
	case <-ready:
	case err := <-srvDone:
		return IperfResult{}, nil, fmt.Errorf("iperf3 server in %s exited before listening: %v: %s", spec.ServerNetns, err, strings.TrimSpace(srvErr.String()))
	case <-timer.C:
		cancelSrv()
		<-srvDone
		return IperfResult{}, nil, fmt.Errorf("iperf3 server in %s: not listening after %v", spec.ServerNetns, spec.ReadyTimeout)
	case <-ctx.Done():
		<-srvDone
		return IperfResult{}, nil, fmt.Errorf("iperf3 server: %w", ctx.Err())
	}

	cliCtx, cancelCli := context.WithTimeout(ctx, spec.Duration+30*time.Second)
	defer cancelCli()
	secs := strconv.FormatFloat(spec.Duration.Seconds(), 'f', -1, 64)
	cli := netnsCommand(cliCtx, spec.ClientNetns, "iperf3", "-c", spec.ServerAddr.String(), "-p", port,
		"-t", secs, "-P", strconv.Itoa(spec.Streams), "-J")
	var cliOut, cliErr bytes.Buffer
	cli.Stdout, cli.Stderr = &cliOut, &cliErr
	runErr := cli.Run()
	res, perr := ParseIperf3(cliOut.Bytes())
	if perr != nil {
		// A server that never got its test must not outlive us.
		cancelSrv()
		<-srvDone
		if runErr != nil {
			return IperfResult{}, cliOut.Bytes(), fmt.Errorf("iperf3 client: %w (exit: %v, stderr: %s)", perr, runErr, strings.TrimSpace(cliErr.String()))
		}
		return IperfResult{}, cliOut.Bytes(), fmt.Errorf("iperf3 client: %w", perr)
	}
	// The one-shot server exits after the test; give it the client's
	// timeout, then stop it.
	select {
	case <-srvDone:
	case <-cliCtx.Done():
		cancelSrv()
		<-srvDone
	}
	return res, cliOut.Bytes(), nil
}
