#!/usr/bin/env bash
# systemd-analyze verify on dist/systemd/ipoib@.service, instantiated as
# ipoib@ib0.service, with its /usr/local/bin/ipoib pointed at a freshly
# built binary (verify checks that every Exec*= command is executable).
# Any line systemd-analyze prints (an unknown key is only a warning to it)
# fails the check. Needs systemd-analyze (Debian's systemd package).
set -euo pipefail

cd "$(dirname "$0")/.."
GO=${GO:-go}
command -v "$GO" >/dev/null || GO=/usr/local/go/bin/go
command -v systemd-analyze >/dev/null || { echo "verify-unit: systemd-analyze not in PATH (apt-get install systemd)"; exit 1; }

WORK=$(mktemp -d /tmp/ipoib-verify-unit.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
"$GO" build -o "$WORK/ipoib" ./cmd/ipoib
sed "s#/usr/local/bin/ipoib#$WORK/ipoib#g" dist/systemd/ipoib@.service >"$WORK/ipoib@.service"
ln -s ipoib@.service "$WORK/ipoib@ib0.service"
out=$(systemd-analyze verify "$WORK/ipoib@ib0.service" 2>&1) || { echo "$out"; echo "verify-unit: FAIL"; exit 1; }
if [ -n "$out" ]; then
	echo "$out"
	echo "verify-unit: FAIL (systemd-analyze warned)"
	exit 1
fi
# The unit's own commands take what it gives them.
printf 'addr = "10.77.0.1/24"\nbind = "127.0.0.1"\n' >"$WORK/ib0.conf"
"$WORK/ipoib" config check "$WORK/ib0.conf" >/dev/null
echo "verify-unit: systemd-analyze verify ipoib@ib0.service: PASS"
