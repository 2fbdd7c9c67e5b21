#!/usr/bin/env bash
# End-to-end check of multicast over the RoCEv2 underlay (issue 13): 'ipoib
# up' hosts in network namespaces on one Linux bridge (IGMPv3/MLDv2 snooping
# on, the bridge the querier, fast leave on its ports), and:
#   run 1, --multicast=on, no --peers: eight hosts; every ordered pair answers
#     an 8000-byte ping within 2 s of the last start; a tshark capture shows
#     the multicast UD packets sent to the IP group with DestQP 0xFFFFFF,
#     decoded without errors, every ICRC verified; the bridge's MDB holds
#     every host's port in the broadcast group 239.255.255.255 and drops the
#     port of a host that stops (the leave reaches the fabric);
#   run 2, --multicast=off (head-end replication): host 1 with no peers,
#     hosts 2..8 knowing only host 1, then a ninth knowing only host 5: every
#     pair of the eight, then the ninth with all eight, answers within 2 s;
#   run 3, an IPv6 underlay: three hosts, no --peers, every pair answers
#     within 2 s and the multicast goes to the MGID as the IPv6 group;
#   run 4, a bridge made with defaults ('ip link add BR type bridge': snooping
#     on, no querier) and IGMPv2 hosts: four hosts answer within 2 s, and
#     again once the MDB entries their join reports made have expired (the
#     membership interval shortened to 3 s) and their ARP caches are flushed:
#     without a querier the bridge floods, and must keep doing so.
# Needs root, iproute2 (ip, bridge), tshark, jq, ping. Namespaces ipoib-mc1..9
# and bridges ipoibmcbr0 and ipoibmcbr1 are this script's own; a crashed
# run's leftovers go.
set -euo pipefail

cd "$(dirname "$0")/.."
# shellcheck source=.ci/lib.sh
source .ci/lib.sh
GO=${GO:-go}
command -v "$GO" >/dev/null || GO=/usr/local/go/bin/go

NS=ipoib-mc # namespaces ipoib-mc1..ipoib-mc9
BR=ipoibmcbr0
BR_DEFAULT=ipoibmcbr1
GROUP=239.255.255.255 # the IPoIB broadcast MGID ff12:401b:ffff::ffff:ffff over IPv4
PING_BYTES=8000
WORK=$(mktemp -d /tmp/ipoib-e2e-mcast.XXXXXX)
CTL=$WORK/ctl
BIN=$WORK/ipoib
ICRCCHECK=$WORK/icrccheck
CAP=$WORK/mcast.pcap
declare -A UP_PID=()
TSHARK_PID=

ul() { echo "10.98.0.$1"; } # underlay address of host i
now_ms() { echo $(($(date +%s%N) / 1000000)); }
ib() { echo "10.77.13.$1"; } # ib0 address of host i

logs() {
	local f
	for f in "$WORK"/*.log; do
		[ -f "$f" ] && { echo "--- tail $f"; tail -n 15 "$f"; }
	done
	echo "work dir kept: $WORK"
}
ci_on_fail=logs

# stop PID SIGNAL SECONDS: signal a process this script started and wait
# for it, bounded; returns its exit status (124: killed).
# kill -0 runs in this shell, which reaps its children: a subshell's
# kill -0 would see the zombie.
stop() {
	local pid=$1 sig=$2 secs=$3 rc=0 i
	[ -n "$pid" ] || return 0
	kill "-$sig" "$pid" 2>/dev/null || true
	for ((i = 0; i < secs * 10; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
		return 124
	fi
	wait "$pid" 2>/dev/null || rc=$?
	return $rc
}

stop_hosts() {
	local i rc=0
	for i in "${!UP_PID[@]}"; do
		stop "${UP_PID[$i]}" TERM 10 || { echo "host $i exited $?"; rc=1; }
		unset "UP_PID[$i]"
	done
	return $rc
}

cleanup() {
	set +e
	stop "$TSHARK_PID" INT 5
	stop_hosts
	for i in $(seq 1 9); do ip netns del "$NS$i" 2>/dev/null; done
	ip link del "$BR" 2>/dev/null
	ip link del "$BR_DEFAULT" 2>/dev/null
	((ci_failures == 0)) && [ "${DONE:-0}" = 1 ] && rm -rf "$WORK"
}
trap cleanup EXIT

# start_host I ARGS...: 'ipoib up' in namespace I, waiting for its
# readiness line.
start_host() {
	local i=$1
	shift
	ip netns exec "$NS$i" "$BIN" up --dev ib0 --addr "$(ib "$i")/24" --bind "$(ul "$i")" \
		--control-dir "$CTL" --host "m$i" "$@" >"$WORK/up$i.log" 2>&1 &
	UP_PID[$i]=$!
}
wait_up() {
	local i
	for i in "$@"; do
		ci_wait_until 30 "host $i up" grep -q 'msg="up; stop with Ctrl-C"' "$WORK/up$i.log" ||
			ci_fail "host $i did not come up"
	done
}

# ping_pairs FROM TO: an 8000-byte ping from every host in FROM to every
# other host in TO, all at once, each answered within 2 s (-w 2: ping
# keeps sending, one per second, until a reply or the deadline).
ping_pairs() {
	local from=$1 to=$2 a b pids=() names=() bad=() k
	for a in $from; do
		for b in $to; do
			[ "$a" = "$b" ] && continue
			ip netns exec "$NS$a" ping -n -q -c 1 -w 2 -s "$PING_BYTES" "$(ib "$b")" >"$WORK/ping-$a-$b.out" 2>&1 &
			pids+=($!)
			names+=("$a->$b")
		done
	done
	for k in "${!pids[@]}"; do
		wait "${pids[$k]}" || bad+=("${names[$k]}")
	done
	((${#bad[@]} == 0)) || {
		printf '    no answer within 2 s: %s\n' "${bad[*]}" >&2
		return 1
	}
	echo "${#pids[@]}"
}

# captured_arp FILE: the capture being written holds an IPoIB ARP.
captured_arp() { tshark -r "$1" -n -Y arp -T fields -e frame.number 2>/dev/null | grep -q .; }

ci_step "preflight"
[ "$(id -u)" = 0 ] || ci_fail "needs root"
for t in ip bridge tshark jq ping; do ci_require_cmd "$t"; done
ci_pass "root and tools present"

ci_step "build"
"$GO" build -o "$BIN" ./cmd/ipoib
"$GO" build -o "$ICRCCHECK" ./hca/rocev2/cmd/icrccheck
ci_pass "built ipoib and icrccheck"

# IGMPv3 throughout: an IGMPv2 host suppresses its report when it hears
# another's for the group, and the bridge floods reports until its querier
# counts as present, so a v2 MDB would miss ports.
ci_step "bridge $BR (IGMPv3 snooping, querier, fast leave) and nine namespaces"
for i in $(seq 1 9); do ip netns del "$NS$i" 2>/dev/null || true; done
ip link del "$BR" 2>/dev/null || true
ip link del "$BR_DEFAULT" 2>/dev/null || true
ip link add "$BR" mtu 9000 type bridge mcast_snooping 1 mcast_querier 1 mcast_igmp_version 3 mcast_mld_version 2
ip link set "$BR" up
for i in $(seq 1 9); do
	ip netns add "$NS$i"
	ip netns exec "$NS$i" sysctl -qw net.ipv4.conf.all.force_igmp_version=3
	ip -n "$NS$i" link set lo up
	ip link add "mcb$i" mtu 9000 type veth peer name "mcv$i" netns "$NS$i" mtu 9000
	ip link set "mcb$i" master "$BR"
	bridge link set dev "mcb$i" fastleave on
	ip link set "mcb$i" up
	ip -n "$NS$i" addr add "$(ul "$i")/24" dev "mcv$i"
	ip -n "$NS$i" link set "mcv$i" up
done
ci_check "underlay: host 1 reaches host 9" ip netns exec "${NS}1" ping -n -c 1 -W 2 "$(ul 9)"
mkdir -p "$CTL"

ci_step "run 1: eight hosts, --multicast=on, no --peers"
ip netns exec "${NS}1" tshark -i mcv1 -f "udp port 4791 and dst net 239.0.0.0/8" -s 0 -F pcap -w "$CAP" -q \
	>"$WORK/tshark.log" 2>&1 &
TSHARK_PID=$!
ci_wait_until 20 "tshark capturing" grep -q "Capture started" "$WORK/tshark.log" || ci_fail "tshark did not start"
for i in $(seq 1 8); do start_host "$i" --multicast=on; done
wait_up $(seq 1 8)
t0=$(now_ms)
n=$(ping_pairs "$(seq 1 8)" "$(seq 1 8)") || ci_fail "run 1: some pairs did not answer within 2 s"
ci_pass "run 1: all $n ordered pairs answered an $PING_BYTES-byte ping within 2 s of the last start ($(($(now_ms) - t0)) ms for all)"

members() { bridge -j mdb show dev "$BR" | jq -r --arg g "$GROUP" '[.[].mdb[] | select(.grp == $g) | .port] | unique | join(" ")'; }
all_joined() {
	local m i
	m=" $(members) "
	for i in $(seq 1 8); do [[ "$m" == *" mcb$i "* ]] || return 1; done
}
ci_wait_until 5 "all eight ports in $GROUP" all_joined ||
	ci_fail "bridge MDB: not every port joined $GROUP" "members: $(members)" "$(bridge mdb show dev "$BR")" \
		"$(ip netns exec "${NS}1" cat /proc/net/igmp)"
ci_pass "bridge MDB: all eight ports joined $GROUP (IGMP reports reached the fabric)"

stop "${UP_PID[8]}" TERM 10 || ci_fail "host 8 exit status $?"
unset "UP_PID[8]"
left() { ! bridge -j mdb show dev "$BR" | jq -e --arg g "$GROUP" '[.[].mdb[] | select(.grp == $g and .port == "mcb8")] | length > 0' >/dev/null; }
ci_wait_until 5 "mcb8 to leave $GROUP" left || ci_fail "bridge MDB still forwards $GROUP to stopped host 8"
ci_pass "bridge MDB: host 8 stopped, its port left $GROUP (the leave reached the fabric)"

ci_wait_until 10 "the ARPs in the capture" captured_arp "$CAP" || ci_fail "no ARP to $GROUP captured"
stop "$TSHARK_PID" INT 5 || true
TSHARK_PID=
fields() { tshark -r "$CAP" -n "$@" 2>/dev/null; }
total=$(fields -T fields -e frame.number | wc -l)
[ "$total" -gt 0 ] || ci_fail "no multicast RoCEv2 packet captured on mcv1"
notud=$(fields -Y 'not (infiniband.bth.opcode == 100 && infiniband.bth.destqp == 0xffffff)' -T fields -e frame.number | wc -l)
[ "$notud" = 0 ] || ci_fail "$notud multicast frames are not UD SEND_ONLY to QP 0xFFFFFF"
arps=$(fields -Y "arp && ip.dst == $GROUP" -T fields -e frame.number | wc -l)
[ "$arps" -gt 0 ] || ci_fail "no IPoIB ARP sent to $GROUP"
bad=$(fields -Y '_ws.malformed || _ws.expert.severity >= "warning"' -T fields -e frame.number -e _ws.expert.message | head -5)
[ -z "$bad" ] || ci_fail "malformed frames or expert warnings" "$bad"
"$ICRCCHECK" "$CAP" >"$WORK/icrc.log" 2>&1 || ci_fail "ICRC check" "$(tail -5 "$WORK/icrc.log")"
ci_pass "tshark: $total multicast frames, all UD SEND_ONLY to QP 0xFFFFFF, $arps ARPs to $GROUP, nothing malformed, every ICRC verifies"

joins=$("$BIN" show --json --control-dir "$CTL" --host m1 | jq '.[0].stats.rocev2.mcast_joins')
[ "$joins" -ge 1 ] || ci_fail "host 1 counts $joins group joins"
ci_pass "host 1 joined $joins IP group(s) (ipoib show: rocev2 mcast_joins)"
stop_hosts || ci_fail "run 1: a host did not exit cleanly"

ci_step "run 2: --multicast=off, host 1 the only seed"
start_host 1 --multicast=off
wait_up 1
for i in $(seq 2 8); do start_host "$i" --multicast=off --peers "$(ul 1)"; done
wait_up $(seq 2 8)
t0=$(now_ms)
n=$(ping_pairs "$(seq 1 8)" "$(seq 1 8)") || ci_fail "run 2: some pairs did not answer within 2 s"
ci_pass "run 2: all $n ordered pairs of hosts knowing only host 1 answered within 2 s of the last start ($(($(now_ms) - t0)) ms)"
start_host 9 --multicast=off --peers "$(ul 5)"
wait_up 9
t0=$(now_ms)
n=$(ping_pairs "$(seq 1 9)" 9) || ci_fail "run 2: host 9 not reachable from all within 2 s"
m=$(ping_pairs 9 "$(seq 1 8)") || ci_fail "run 2: host 9 does not reach all within 2 s"
ci_pass "run 2: a ninth host knowing only host 5 answered all $n and reached all $m within 2 s of its start ($(($(now_ms) - t0)) ms)"
stop_hosts || ci_fail "run 2: a host did not exit cleanly"

# The MGID is the IPv6 group itself, as rxe sends it: MLD joins it.
ci_step "run 3: IPv6 underlay, three hosts, --multicast=on, no --peers"
MGID=ff12:401b:ffff::ffff:ffff
for i in 1 2 3; do ip -n "$NS$i" addr add "fd98::$i/64" dev "mcv$i" nodad; done
CAP6=$WORK/mcast6.pcap
ip netns exec "${NS}1" tshark -i mcv1 -f "ip6 and udp port 4791 and dst host $MGID" -s 0 -F pcap -w "$CAP6" -q \
	>"$WORK/tshark6.log" 2>&1 &
TSHARK_PID=$!
ci_wait_until 20 "tshark capturing" grep -q "Capture started" "$WORK/tshark6.log" || ci_fail "tshark did not start"
for i in 1 2 3; do start_host "$i" --multicast=on --bind "fd98::$i"; done
wait_up 1 2 3
t0=$(now_ms)
n=$(ping_pairs "1 2 3" "1 2 3") || ci_fail "run 3: some pairs did not answer within 2 s"
ci_pass "run 3: all $n ordered pairs over an IPv6 underlay answered within 2 s of the last start ($(($(now_ms) - t0)) ms)"
# dumpcap drops what it has not read yet when stopped: wait until the
# pings' ARPs are in the file.
ci_wait_until 10 "the ARPs in the capture" captured_arp "$CAP6" || ci_fail "no ARP to $MGID captured"
stop "$TSHARK_PID" INT 5 || true
TSHARK_PID=
fields6() { tshark -r "$CAP6" -n "$@" 2>/dev/null; }
total=$(fields6 -T fields -e frame.number | wc -l)
notud=$(fields6 -Y 'not (infiniband.bth.opcode == 100 && infiniband.bth.destqp == 0xffffff)' -T fields -e frame.number | wc -l)
arps=$(fields6 -Y 'arp' -T fields -e frame.number | wc -l)
bad=$(fields6 -Y '_ws.malformed || _ws.expert.severity >= "warning"' -T fields -e frame.number -e _ws.expert.message | head -5)
[ "$total" -gt 0 ] && [ "$notud" = 0 ] && [ "$arps" -gt 0 ] && [ -z "$bad" ] ||
	ci_fail "IPv6 capture: $total frames to $MGID, $notud not UD to QP 0xFFFFFF, $arps ARPs" "$bad"
"$ICRCCHECK" "$CAP6" >"$WORK/icrc6.log" 2>&1 || ci_fail "ICRC check (IPv6)" "$(tail -5 "$WORK/icrc6.log")"
ci_pass "tshark: $total frames to the IPv6 group $MGID, all UD SEND_ONLY to QP 0xFFFFFF, $arps ARPs, nothing malformed, every ICRC verifies"
stop_hosts || ci_fail "run 3: a host did not exit cleanly"

# A bridge as 'ip link add' makes it: snooping on, no querier. The bridge
# forwards a group only to the ports in its MDB while a querier counts as
# present, and floods it otherwise; the join reports' MDB entries expire
# after the membership interval (260 s by default, 3 s here) and nobody
# queries to renew them. Each host's ARP cache is flushed after the expiry,
# so the second round's pings need broadcast ARP (the IP group) again.
ci_step "run 4: a default bridge (no querier), IGMPv2 hosts, before and after the MDB expires"
ip link add "$BR_DEFAULT" type bridge
ip link set "$BR_DEFAULT" type bridge mcast_membership_interval 300
ip link set "$BR_DEFAULT" up
for i in 1 2 3 4; do
	ip netns exec "$NS$i" sysctl -qw net.ipv4.conf.all.force_igmp_version=2
	ip link set "mcb$i" nomaster
	ip link set "mcb$i" master "$BR_DEFAULT"
done
snoop=$(ip -j -d link show "$BR_DEFAULT" | jq -r '.[0].linkinfo.info_data | "\(.mcast_snooping) \(.mcast_querier)"')
[ "$snoop" = "1 0" ] || ci_fail "bridge $BR_DEFAULT: mcast_snooping mcast_querier = $snoop, want the defaults 1 0"
for i in 1 2 3 4; do start_host "$i" --multicast=on; done
wait_up 1 2 3 4
t0=$(now_ms)
n=$(ping_pairs "1 2 3 4" "1 2 3 4") || ci_fail "run 4: some pairs did not answer within 2 s"
ci_pass "run 4: all $n ordered pairs answered within 2 s on a default bridge ($(($(now_ms) - t0)) ms)"
expired() { ! bridge -j mdb show dev "$BR_DEFAULT" | jq -e --arg g "$GROUP" '[.[].mdb[] | select(.grp == $g)] | length > 0' >/dev/null; }
ci_wait_until 20 "the MDB entries of $GROUP to expire" expired || ci_fail "$GROUP still in the MDB of $BR_DEFAULT" "$(bridge mdb show dev "$BR_DEFAULT")"
for i in 1 2 3 4; do ip -n "$NS$i" neigh flush dev ib0; done
t0=$(now_ms)
n=$(ping_pairs "1 2 3 4" "1 2 3 4") || ci_fail "run 4: after the MDB expired, some pairs did not answer within 2 s"
ci_pass "run 4: after the MDB expired, all $n ordered pairs answered within 2 s again ($(($(now_ms) - t0)) ms)"
stop_hosts || ci_fail "run 4: a host did not exit cleanly"
DONE=1
ci_finish
