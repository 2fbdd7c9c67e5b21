package cli

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ipoibcm/ipoib/internal/flagcheck"
)

// Each command checks its whole command line in one step, before it
// creates anything (a namespace, a TAP, a socket, a profile file): a
// table of rules, run in order, the first broken one the command's one
// usage line and exit status 2. A rule is a closure so that one may
// depend on what an earlier one parsed.

// rule is one check of a command line: "" when it holds, else the usage
// message (without the "ipoib CMD: " its line starts with).
type rule func() string

// firstBroken runs rules in order and returns the first message, "" if
// every rule holds.
func firstBroken(rules ...rule) string {
	for _, r := range rules {
		if msg := r(); msg != "" {
			return msg
		}
	}
	return ""
}

// check is a rule of an already computed message (the flagcheck
// functions).
func check(msg string) rule { return func() string { return msg } }

// noArgs refuses positional arguments.
func noArgs(args []string) rule {
	return func() string {
		if len(args) > 0 {
			return fmt.Sprintf("unexpected argument %q", args[0])
		}
		return ""
	}
}

// listenAddr checks an optional listen address flag (--metrics,
// --pprof): empty is off.
func listenAddr(flagName, v string) rule {
	return func() string {
		if v == "" {
			return ""
		}
		return flagcheck.ListenAddr(flagName, v)
	}
}

// ifname checks an optional interface name flag (empty: none).
func optIfname(flagName, v string) rule {
	return func() string {
		if v == "" {
			return ""
		}
		return flagcheck.Ifname(flagName, v)
	}
}

// oneOf checks a flag spelled as one of a few words.
func oneOf(flagName, v string, words ...string) rule {
	return func() string {
		if slices.Contains(words, v) {
			return ""
		}
		return fmt.Sprintf("--%s %q: want %s", flagName, v, orList(words))
	}
}

// orList is "a", "a or b", "a, b or c".
func orList(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// onlyWith refuses flags given without the flag (or mode) they depend
// on: ignored, the user would believe they took effect.
func onlyWith(set map[string]bool, on bool, what string, flags ...string) rule {
	return func() string {
		if on {
			return ""
		}
		for _, f := range flags {
			if set[f] {
				return fmt.Sprintf("--%s applies to %s only", f, what)
			}
		}
		return ""
	}
}

// profile checks the profiling flags of a long-running command.
func (p *profileFlags) rules() []rule {
	return []rule{listenAddr("pprof", *p.pprofAddr)}
}
