package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	runpprof "runtime/pprof"
	"time"
)

// profileFlags are the profiling switches of the long-running commands
// (fabric, bench): a CPU profile written on exit, and a live pprof HTTP
// endpoint for 'go tool pprof http://ADDR/debug/pprof/profile'.
type profileFlags struct {
	cpuProfile *string
	pprofAddr  *string
}

func addProfileFlags(fs *flag.FlagSet) *profileFlags {
	return addProfileFlagsUsage(fs, "write a CPU profile of the whole run to this file (go tool pprof)")
}

// addProfileFlagsUsage is addProfileFlags with the command's own words
// for what --cpuprofile covers.
func addProfileFlagsUsage(fs *flag.FlagSet, cpuUsage string) *profileFlags {
	return &profileFlags{
		cpuProfile: fs.String("cpuprofile", "", cpuUsage),
		pprofAddr:  fs.String("pprof", "", "serve net/http/pprof on this address (e.g. 127.0.0.1:6060) while running"),
	}
}

// start begins whatever profiling was asked for; stop ends it and reports
// a failure to write the profile.
func (p *profileFlags) start() (stop func() error, err error) {
	var stops []func() error
	stopAll := func() error {
		var errs []error
		for i := len(stops) - 1; i >= 0; i-- {
			errs = append(errs, stops[i]())
		}
		return errors.Join(errs...)
	}
	if path := *p.cpuProfile; path != "" {
		f, err := os.Create(path)
		if err != nil {
			return nil, fmt.Errorf("cpu profile: %w", err)
		}
		if err := runpprof.StartCPUProfile(f); err != nil {
			f.Close()
			return nil, fmt.Errorf("cpu profile %s: %w", path, err)
		}
		stops = append(stops, func() error {
			runpprof.StopCPUProfile()
			if err := f.Close(); err != nil {
				return fmt.Errorf("cpu profile %s: %w", path, err)
			}
			return nil
		})
	}
	if addr := *p.pprofAddr; addr != "" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("pprof listen %s: %w", addr, err), stopAll())
		}
		// Our own mux: the handlers must not depend on http.DefaultServeMux.
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		done := make(chan struct{})
		go func() {
			defer close(done)
			srv.Serve(ln) // returns http.ErrServerClosed on Shutdown
		}()
		stops = append(stops, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			err := srv.Shutdown(ctx)
			if err != nil {
				srv.Close()
			}
			<-done
			if err != nil {
				return fmt.Errorf("pprof server: %w", err)
			}
			return nil
		})
	}
	return stopAll, nil
}
