package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
)

// 'ipoib config check FILE' resolves a config file exactly as 'ipoib up
// --config FILE' would, and creates nothing: a unit's file can be
// checked before the service is (re)started or reloaded.

func configFlags(fs *flag.FlagSet, env *Env) func(context.Context, []string) int {
	return func(_ context.Context, args []string) int {
		if len(args) != 2 || args[0] != "check" {
			return usageError(env, "config", "want 'check FILE'")
		}
		o, err := checkConfig(env, args[1])
		if err != nil {
			return resolveError(env, "config check", err)
		}
		var kids []string
		for _, c := range o.Children {
			kids = append(kids, c.Name)
		}
		fmt.Fprintf(env.Stdout, "%s: ok: %s %s bind %v mode %s, %d peers, children [%s]\n",
			args[1], o.Dev, o.Addr, o.Bind, o.Mode, len(o.Peers), strings.Join(kids, " "))
		return ExitOK
	}
}

// checkConfig resolves the file as 'ipoib up --config path' with no
// other flags.
func checkConfig(env *Env, path string) (UpOptions, error) {
	fs := flag.NewFlagSet("ipoib up", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	u := declareUpFlags(fs, env)
	*u.config = path
	return resolveUp(u, nil, map[string]string{})
}
