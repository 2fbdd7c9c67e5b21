package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBinarySoakInterrupted: a soak stopped by SIGINT or SIGTERM once
// traffic flowed reports what it ran, says INTERRUPTED (never PASS) with
// the signal, and exits 128 + the signal's number.
func TestBinarySoakInterrupted(t *testing.T) {
	for _, tc := range []struct {
		sig  syscall.Signal
		code int
		says string
	}{
		{syscall.SIGINT, 130, "interrupt signal received"},
		{syscall.SIGTERM, 143, "terminated signal received"},
	} {
		t.Run(tc.sig.String(), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			const duration = time.Minute
			cmd := ipoibCmd(ctx, t, "soak", "--hosts", "8", "--duration", duration.String())
			var out bytes.Buffer
			cmd.Stdout = &out
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// The progress line (every few seconds on a pipe) says when
			// connections were established and packets moved over them.
			var log strings.Builder
			sc := bufio.NewScanner(stderr)
			flowed := false
			for !flowed && sc.Scan() {
				line := sc.Text()
				log.WriteString(line + "\n")
				var elapsed float64
				var live, established, reaped, dead, viol int
				if _, err := fmt.Sscanf(line, "soak %fs live %d established %d reaped %d dead-dropped %d violations %d",
					&elapsed, &live, &established, &reaped, &dead, &viol); err == nil && established > 0 {
					flowed = true
				}
			}
			if !flowed {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("no progress line with established connections:\n%s", log.String())
			}
			if err := cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			for sc.Scan() {
				log.WriteString(sc.Text() + "\n")
			}
			err = cmd.Wait()
			var ee *exec.ExitError
			if err != nil && !errors.As(err, &ee) {
				t.Fatalf("wait: %v", err)
			}
			got := cmd.ProcessState.ExitCode()
			report := out.String()
			t.Logf("exit %d\n%s", got, report)
			lines := strings.Split(strings.TrimSpace(report), "\n")
			last := lines[len(lines)-1]
			if got != tc.code {
				t.Errorf("exit %d, want %d; stderr:\n%s", got, tc.code, short(log.String()))
			}
			if !strings.HasPrefix(last, "INTERRUPTED") || !strings.Contains(last, tc.says) || !strings.Contains(last, "of "+duration.String()) {
				t.Errorf("last line %q: want INTERRUPTED, %q and the duration", last, tc.says)
			}
			if strings.Contains(report, "PASS") {
				t.Errorf("an interrupted soak says PASS:\n%s", report)
			}
			if !strings.HasPrefix(lines[0], "soak ") || !strings.Contains(report, "connections ") || !strings.Contains(report, "traffic_carried") {
				t.Errorf("the report of what ran is missing:\n%s", report)
			}
		})
	}
}
