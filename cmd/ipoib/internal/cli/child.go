package cli

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"strings"

	"github.com/ipoibcm/ipoib/control"
	"github.com/ipoibcm/ipoib/internal/flagcheck"
)

// 'ipoib child add|del' is Linux's 'ip link add link ib0 name ib0.8001
// type ipoib pkey 0x8001' and sysfs create_child/delete_child, on a
// running 'ipoib fabric' host or 'ipoib up' process, through its control
// socket.

func childFlags(fs *flag.FlagSet, env *Env) func(context.Context, []string) int {
	host := fs.String("host", "", "host whose interface gets the child (e.g. ipoib-h1, or an 'up' process's --host); default the only one running")
	name := fs.String("name", "", "add: TAP name of the child (1..15 bytes; default <parent>.<pkey as 4 hex digits>, e.g. ib0.8001)")
	addr := fs.String("addr", "", "add: comma-separated IP prefixes for the child's TAP, e.g. 10.77.1.1/24 (default none: 'ip addr add' later)")
	dir := controlDirFlag(fs, env)
	return func(_ context.Context, args []string) int {
		op, req, msg := parseChild(args, *name, *addr)
		if msg != "" {
			return usageError(env, "child", msg)
		}
		var info control.InterfaceInfo
		var err error
		if op == "add" {
			info, err = control.ChildAdd(*dir, *host, req, controlTimeout)
		} else {
			info, err = control.ChildDel(*dir, *host, req.Name, req.PKey, controlTimeout)
		}
		if err != nil {
			return fail(env, "child "+op, fmt.Errorf("%s", oneLine(err)))
		}
		verb := "added"
		if op == "del" {
			verb = "deleted"
		}
		fmt.Fprintf(env.Stdout, "%s: %s: %s %s\n", info.Host, info.Name, childSummary(info), verb)
		return ExitOK
	}
}

// childSummary is the partition part of a child's one-line report.
func childSummary(i control.InterfaceInfo) string {
	s := "pkey " + i.PKey
	if i.Membership != "" {
		s += " membership " + i.Membership
	}
	return s + " parent " + i.Parent
}

// parseChild validates 'child add PKEY' and 'child del NAME|PKEY' with
// their flags; a non-empty message is a usage error.
func parseChild(args []string, name, addrs string) (op string, req control.ChildRequest, msg string) {
	if len(args) != 2 || (args[0] != "add" && args[0] != "del") {
		return "", req, "want 'add PKEY' or 'del NAME|PKEY'"
	}
	op = args[0]
	if name != "" {
		if msg := flagcheck.Ifname("name", name); msg != "" {
			return "", req, msg
		}
	}
	if op == "del" {
		if addrs != "" || name != "" {
			return "", req, "del takes the child's name or P_Key as its argument, not --name or --addr"
		}
		if looksNumeric(args[1]) {
			k, msg := flagcheck.PKey("P_Key", args[1])
			return op, control.ChildRequest{PKey: k}, msg
		}
		if msg := flagcheck.Ifname("name", args[1]); msg != "" {
			return "", req, strings.Replace(msg, "--name", "child", 1)
		}
		return op, control.ChildRequest{Name: args[1]}, ""
	}
	k, msg := flagcheck.PKey("P_Key", args[1])
	if msg != "" {
		return "", req, msg
	}
	req = control.ChildRequest{PKey: k, Name: name}
	for _, a := range strings.Split(addrs, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		if _, err := netip.ParsePrefix(a); err != nil {
			return "", req, fmt.Sprintf("--addr %q: want IP prefixes like 10.77.1.1/24", a)
		}
		req.Addrs = append(req.Addrs, a)
	}
	return op, req, ""
}

// looksNumeric: a child is named by its P_Key when the argument is a
// number (interface names start with a letter in practice).
func looksNumeric(s string) bool { return s != "" && s[0] >= '0' && s[0] <= '9' }

// childName is a child's default TAP name, Linux's "%.10s.%04x" of the
// parent's name and the P_Key as given, cut to IFNAMSIZ.
func childName(parent string, pkey uint16) string {
	if len(parent) > 10 {
		parent = parent[:10]
	}
	return fmt.Sprintf("%s.%04x", parent, pkey)
}
