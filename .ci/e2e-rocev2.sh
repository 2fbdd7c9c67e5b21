#!/usr/bin/env bash
# End-to-end check of 'ipoib up' over RoCEv2 (issue 7): two processes in
# two network namespaces joined by a veth pair (MTU 9000, so a 4096-byte
# IB MTU fits), 1% of the UDP datagrams dropped on purpose, and:
#   - ping both ways, a 60000-byte DF ping in connected mode;
#   - a tshark capture on the veth during connection set-up and a short
#     transfer: CM REQ/REP/RTU decoded (service ID, QPNs, starting PSN,
#     private data {UD QPN, 65524}), the first RC SEND at the REP's PSN,
#     IPoIB ARP (hardware type 32, 20-byte addresses), RC SENDs, nothing
#     malformed, and every frame's ICRC verified by our own checker;
#   - iperf3 5 s in connected mode, then in datagram mode after
#     'ipoib mode datagram', each with a 64 MiB TCP file transfer whose
#     SHA-256 must match; datagram mode captured too: TSO super frames
#     leave as UD LSO work requests, and every UD packet on the wire is
#     within the IB MTU, decodes cleanly and has a valid ICRC;
#   - garbage at the UDP port counted in 'ipoib show' while pings pass;
#   - a P_Key child ib0.8001 on both ('ipoib child add', the partition in
#     --pkey-table): ping over it, tshark shows its REQ's partition and
#     BTH P_Key 0x8001; 'ipoib child del' removes the TAPs;
#   - SIGTERM: both processes exit 0 and remove their TAPs and sockets.
# Needs root, iproute2, iperf3, tshark, jq, perl (perl-base). Prints PASS/FAIL per check and
# "e2e-rocev2: ALL PASS" at the end; exits non-zero on the first failure.
set -euo pipefail

cd "$(dirname "$0")/.."
GO=${GO:-go}
command -v "$GO" >/dev/null || GO=/usr/local/go/bin/go

NS1=ipoib-r1 NS2=ipoib-r2
VETH1=vr1 VETH2=vr2
UL1=10.99.0.1 UL2=10.99.0.2 # the veth underlay the RoCEv2 packets cross
IB1=10.77.7.1 IB2=10.77.7.2 # ib0
CH1=10.77.8.1 CH2=10.77.8.2 # the P_Key child ib0.8001
LOSS=0.01
CAPTURE_PACKETS=8000

WORK=$(mktemp -d /tmp/ipoib-e2e-rocev2.XXXXXX)
CTL=$WORK/ctl
BIN=$WORK/ipoib
ICRCCHECK=$WORK/icrccheck
CAP=$WORK/setup.pcap
CAP2=$WORK/teardown.pcap
UP1_PID= UP2_PID= TSHARK_PID= IPERF_PID=
FAILED=1

step() { printf '\n== %s\n' "$*"; }
pass() { printf 'PASS %s\n' "$*"; }
fail() {
	printf 'FAIL %s\n' "$*"
	exit 1
}

# stop_pid PID SIGNAL SECONDS: signal a process we started and wait for it,
# bounded; kill it if it does not go. Returns its exit status.
stop_pid() {
	local pid=$1 sig=$2 secs=$3 i
	[ -n "$pid" ] || return 0
	kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; return $?; }
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
	local rc=0
	wait "$pid" 2>/dev/null || rc=$?
	return $rc
}

cleanup() {
	set +e
	stop_pid "$IPERF_PID" TERM 2
	stop_pid "$TSHARK_PID" INT 5
	stop_pid "$UP1_PID" TERM 10
	stop_pid "$UP2_PID" TERM 10
	ip netns del "$NS1" 2>/dev/null
	ip netns del "$NS2" 2>/dev/null
	if [ "$FAILED" = 1 ]; then
		for f in "$WORK"/up1.log "$WORK"/up2.log "$WORK"/tshark.log; do
			[ -f "$f" ] && { echo "--- tail $f"; tail -n 20 "$f"; }
		done
		echo "e2e-rocev2: FAILED (work dir kept: $WORK)"
	else
		rm -rf "$WORK"
	fi
}
trap cleanup EXIT

# wait_for FILE PATTERN SECONDS: readiness is a log line; the loop is
# bounded and polls the file a few times a second.
wait_for() {
	local file=$1 pattern=$2 secs=$3 i
	for ((i = 0; i < secs * 10; i++)); do
		grep -q -- "$pattern" "$file" 2>/dev/null && return 0
		sleep 0.1
	done
	return 1
}

step "preflight"
[ "$(id -u)" = 0 ] || fail "needs root"
for t in ip iperf3 tshark jq sha256sum perl; do
	command -v "$t" >/dev/null || fail "$t not in PATH"
done
pass "root and tools present"

step "build"
"$GO" build -o "$BIN" ./cmd/ipoib
"$GO" build -o "$ICRCCHECK" ./hca/rocev2/cmd/icrccheck
pass "built ipoib and icrccheck"

step "namespaces and veth (MTU 9000)"
for ns in "$NS1" "$NS2"; do
	# Names reserved for this script: a crashed run's leftovers go.
	ip netns del "$ns" 2>/dev/null || true
	ip netns add "$ns"
	ip -n "$ns" link set lo up
done
ip link add "$VETH1" netns "$NS1" mtu 9000 type veth peer name "$VETH2" netns "$NS2" mtu 9000
ip -n "$NS1" addr add "$UL1/24" dev "$VETH1"
ip -n "$NS2" addr add "$UL2/24" dev "$VETH2"
ip -n "$NS1" link set "$VETH1" up
ip -n "$NS2" link set "$VETH2" up
ip netns exec "$NS1" ping -c 1 -W 2 "$UL2" >/dev/null || fail "underlay ping"
pass "underlay $UL1 <-> $UL2"

step "capture on $VETH1 (first $CAPTURE_PACKETS RoCEv2 packets)"
ip netns exec "$NS1" tshark -i "$VETH1" -f "udp port 4791" -s 0 -F pcap -w "$CAP" -c "$CAPTURE_PACKETS" -q \
	>"$WORK/tshark.log" 2>&1 &
TSHARK_PID=$!
wait_for "$WORK/tshark.log" "Capture started" 20 || fail "tshark did not start capturing"
pass "tshark capturing"

step "ipoib up in $NS1 and $NS2 (loss $LOSS)"
mkdir -p "$CTL"
ip netns exec "$NS1" "$BIN" up --dev ib0 --addr "$IB1/24" --hca rocev2 --bind "$UL1" --peers "$UL2" \
	--loss "$LOSS" --seed 1 --control-dir "$CTL" --host r1 --pkey-table 0x8001 >"$WORK/up1.log" 2>&1 &
UP1_PID=$!
ip netns exec "$NS2" "$BIN" up --dev ib0 --addr "$IB2/24" --hca rocev2 --bind "$UL2" --peers "$UL1" \
	--loss "$LOSS" --seed 2 --control-dir "$CTL" --host r2 --pkey-table 0x8001 >"$WORK/up2.log" 2>&1 &
UP2_PID=$!
wait_for "$WORK/up1.log" 'msg="up; stop with Ctrl-C"' 20 || fail "r1 not up"
wait_for "$WORK/up2.log" 'msg="up; stop with Ctrl-C"' 20 || fail "r2 not up"
for ns in "$NS1" "$NS2"; do
	mtu=$(ip -n "$ns" -j link show ib0 | jq '.[0].mtu')
	[ "$mtu" = 65520 ] || fail "$ns ib0 mtu $mtu, want 65520"
done
pass "both up, ib0 mtu 65520"

show() { "$BIN" show --json --control-dir "$CTL" --host "$1"; }
[ "$(show r1 | jq -r '.[0].interface.mode')" = connected ] || fail "r1 mode"
pass "ipoib show answers for both"

step "ping"
# -c N -w 20: N replies within 20 s. The 1% loss also hits CM MADs, and a
# lost REQ/REP waits out the CM response timeout (about 4 s) before the
# retry, so a fixed per-ping wait would fail by chance.
ip netns exec "$NS1" ping -c 3 -w 20 "$IB2" >/dev/null || fail "ping r1 -> r2"
ip netns exec "$NS2" ping -c 3 -w 20 "$IB1" >/dev/null || fail "ping r2 -> r1"
ip netns exec "$NS1" ping -c 2 -w 20 -M do -s 60000 "$IB2" >/dev/null || fail "60000-byte DF ping"
pass "ping both ways, 60000-byte DF ping"

step "IPv6 link-local from the port GUID, ND"
# addrconf_ifid_infiniband: fe80:: + the GID's interface ID with the U/L
# bit set. The RoCEv2 GID is ::ffff:<underlay IPv4>.
gid_ll() {
	local a b c d
	IFS=. read -r a b c d <<<"$1"
	printf 'fe80::200:ffff:%x:%x' $((a * 256 + b)) $((c * 256 + d))
}
LL1=$(gid_ll "$UL1") LL2=$(gid_ll "$UL2")
for pair in "$NS1 $LL1" "$NS2 $LL2"; do
	set -- $pair
	got=$(ip -n "$1" -6 -j addr show dev ib0 | jq -r '[.[0].addr_info[] | select(.scope == "link") | .local] | join(" ")')
	[ "$got" = "$2" ] || fail "$1 ib0 link-local '$got', want only $2 (from the GID, not the MAC)"
done
ip netns exec "$NS1" ping -6 -c 3 -w 20 "$LL2%ib0" >/dev/null || fail "ping6 $LL2 (link-local, ND) r1 -> r2"
ip netns exec "$NS2" ping -6 -c 3 -w 20 "$LL1%ib0" >/dev/null || fail "ping6 $LL1 r2 -> r1"
nd=$(ip -n "$NS1" -6 -j neigh show dev ib0 | jq -r --arg a "$LL2" '.[] | select(.dst == $a) | .state | join(",")')
case $nd in *REACHABLE* | *STALE* | *DELAY* | *PROBE*) ;; *) fail "r1 has no ND entry for $LL2 (state '$nd')" ;; esac
pass "ib0 link-locals $LL1 and $LL2 from the GIDs, ping6 both ways, ND entry $nd"

# iperf_check NS_CLIENT SERVER_ADDR SECONDS LABEL: iperf3 TCP test; fails on
# an iperf3 error or zero throughput, prints Gbit/s.
iperf_check() {
	local cns=$1 sns=$2 addr=$3 secs=$4 label=$5 out=$WORK/iperf-$5.json
	ip netns exec "$sns" iperf3 -s -1 -B "$addr" >"$WORK/iperf-server-$label.log" 2>&1 &
	IPERF_PID=$!
	local i
	for ((i = 0; i < 50; i++)); do
		ip netns exec "$sns" ss -ltn | grep -q ":5201 " && break
		sleep 0.1
	done
	ip netns exec "$cns" iperf3 -c "$addr" -t "$secs" -J >"$out" || true
	wait "$IPERF_PID" 2>/dev/null || true
	IPERF_PID=
	jq -e '(.error // "") == "" and .end.sum_received.bits_per_second > 0' "$out" >/dev/null ||
		fail "iperf3 $label: $(jq -r '.error // "no result"' "$out" 2>/dev/null)"
	printf 'PASS iperf3 %s: %.2f Gbit/s, %s retransmits\n' "$label" \
		"$(jq '.end.sum_received.bits_per_second / 1e9' "$out")" "$(jq '.end.sum_sent.retransmits' "$out")"
}

# file_check LABEL BYTES: a file sent over TCP through ib0 arrives
# byte-identical. iperf3 -F cannot be used for this: its server skips and
# reorders blocks on short reads. The receiver is perl (perl-base is
# essential on Debian), the sender bash's /dev/tcp.
file_check() {
	local label=$1 bytes=$2
	head -c "$bytes" /dev/urandom >"$WORK/in.bin"
	rm -f "$WORK/out.bin"
	ip netns exec "$NS2" perl -MIO::Socket::INET -e '
		my $l = IO::Socket::INET->new(LocalAddr => $ARGV[0], LocalPort => 5202, Listen => 1, ReuseAddr => 1) or die "listen: $!";
		my $c = $l->accept or die "accept: $!";
		open(my $f, ">", $ARGV[1]) or die "open: $!";
		binmode $c; binmode $f;
		my $b;
		while (my $n = sysread($c, $b, 1 << 20)) { print $f $b or die "write: $!" }
		close $f or die "close: $!";' "$IB2" "$WORK/out.bin" &
	IPERF_PID=$!
	local i
	for ((i = 0; i < 50; i++)); do
		ip netns exec "$NS2" ss -ltn | grep -q ":5202 " && break
		sleep 0.1
	done
	ip netns exec "$NS1" timeout 120 bash -c "cat '$WORK/in.bin' >/dev/tcp/$IB2/5202" || fail "file transfer $label: send failed"
	local rc=0
	wait "$IPERF_PID" || rc=$?
	IPERF_PID=
	[ "$rc" = 0 ] || fail "file transfer $label: receiver exit status $rc"
	[ "$(sha256sum <"$WORK/in.bin")" = "$(sha256sum <"$WORK/out.bin")" ] ||
		fail "file transfer $label: $(stat -c %s "$WORK/out.bin") of $bytes bytes arrived, content differs"
	pass "file transfer $label: $bytes bytes, SHA-256 identical"
}

step "short transfer inside the capture"
iperf_check "$NS1" "$NS2" "$IB2" 3 capture
# tshark stops by itself after -c packets; on a loaded machine it lags
# behind the wire, and an early SIGINT would lose what the kernel still
# buffers for it, so give it time to write them.
for ((i = 0; i < 300; i++)); do
	kill -0 "$TSHARK_PID" 2>/dev/null || break
	sleep 0.1
done
stop_pid "$TSHARK_PID" INT 10 || true
TSHARK_PID=
pass "capture: $(stat -c %s "$CAP") bytes"

step "tshark decode of the capture"
fields() { tshark -r "$CAP" -n "$@" 2>/dev/null; }
REQS=$(fields -Y 'infiniband.mad.attributeid == 0x0010' -T fields -E separator='|' \
	-e infiniband.cm.req.serviceid -e infiniband.cm.req.localqpn -e infiniband.cm.req.startpsn -e infiniband.cm.req.private)
REPS=$(fields -Y 'infiniband.mad.attributeid == 0x0013' -T fields -E separator='|' \
	-e infiniband.cm.rep.localqpn -e infiniband.cm.rep.startpsn -e infiniband.cm.rep.private)
RTUS=$(fields -Y 'infiniband.mad.attributeid == 0x0014' -T fields -e frame.number | wc -l)
[ -n "$REQS" ] && [ -n "$REPS" ] && [ "$RTUS" -ge 1 ] || fail "CM exchange not captured: REQ '$REQS' REP '$REPS' RTU $RTUS"
echo "REQ serviceid|localqpn|startpsn|private: $(echo "$REQS" | cut -c1-80 | tr '\n' ' ')"
echo "REP localqpn|startpsn|private: $(echo "$REPS" | cut -c1-70 | tr '\n' ' ')"
# Private data: {UD QPN (24 bits, high byte reserved), receive MTU 65524}.
privqpn() { tr -d ':' | cut -c1-16 | sed -n 's/^00\([0-9a-f]\{6\}\)0000fff4$/\1/p'; }
REP_UDQPNS=""
while IFS='|' read -r lqpn spsn priv; do
	q=$(echo "$priv" | privqpn)
	[ -n "$q" ] || fail "REP private data $priv is not {UD QPN, 65524}"
	REP_UDQPNS="$REP_UDQPNS $((16#$q))"
	# The first RC SEND to the passive QP carries the REP's starting PSN.
	first=$(fields -Y "infiniband.bth.destqp == $lqpn && infiniband.bth.opcode <= 4" -T fields -e infiniband.bth.psn | awk 'NR == 1')
	[ -n "$first" ] || fail "no RC SEND to REP QPN $lqpn"
	[ "$((first))" = "$((spsn))" ] || fail "first RC SEND to $lqpn has PSN $first, REP starting PSN $spsn"
done <<<"$REPS"
while IFS='|' read -r sid lqpn spsn priv; do
	[ -n "$(echo "$priv" | privqpn)" ] || fail "REQ private data $priv is not {UD QPN, 65524}"
	[ "$(((sid >> 24) & 0xffffffffff))" = "$((0x1000000000))" ] || fail "REQ service ID $sid is not 0x1000000000000000|QPN"
	case " $REP_UDQPNS " in *" $((sid & 0xffffff)) "*) ;; *) fail "REQ service ID $sid names no REP's UD QPN ($REP_UDQPNS)" ;; esac
	[ "$((lqpn))" -gt 0 ] || fail "REQ local QPN $lqpn"
done <<<"$REQS"
pass "CM: $(echo "$REQS" | wc -l) REQ, $(echo "$REPS" | wc -l) REP, $RTUS RTU; service IDs, QPNs, private data and starting PSN check out"

# check_fields LABEL FILTER NAME=WANT...: every frame tshark matches with
# FILTER carries each field NAME (infiniband.cm.NAME) with value WANT
# (numbers compared as numbers, booleans as 0/1); prints what it checked.
check_fields() {
	local label=$1 filter=$2 args=() names=() wants=() kv line i got want
	shift 2
	for kv in "$@"; do
		names+=("${kv%%=*}")
		wants+=("${kv#*=}")
		args+=(-e "infiniband.cm.${kv%%=*}")
	done
	local rows
	rows=$(fields -Y "$filter" -T fields -E separator='|' "${args[@]}")
	[ -n "$rows" ] || fail "$label: no frame matches $filter"
	while IFS='|' read -r -a line; do
		for i in "${!names[@]}"; do
			got=${line[$i]:-missing}
			case $got in True) got=1 ;; False) got=0 ;; esac
			want=${wants[$i]}
			[ "$got" != missing ] && [ "$((got))" = "$((want))" ] ||
				fail "$label ${names[$i]} = $got, want $want"
		done
	done <<<"$rows"
	printf '%s (%d frames):' "$label" "$(echo "$rows" | wc -l)"
	for i in "${!names[@]}"; do printf ' %s=%s' "${names[$i]#*.}" "${wants[$i]}"; done
	echo
}

step "CM field values as Linux sets them (cm.c, ipoib_cm.c; --rc-retry 6 by decision)"
check_fields REQ 'infiniband.mad.attributeid == 0x0010' \
	req.responderres=4 req.initdepth=0 req.remoteresptout=20 req.localresptout=20 \
	req.transpsvctype=0 req.e2eflowctrl=0 req.startpsn=0 req.retrcount=6 req.rnrretrcount=0 \
	req.maxcmretr=15 req.srq=1 req.pkey=0xffff req.pppmtu=5 \
	req.prim_locallid=0xffff req.prim_remotelid=0xffff req.prim_hoplim=64 req.prim_subnetlocal=0 \
	req.prim_localacktout=17 req.prim_flowlabel=0 req.prim_tfcclass=0 req.prim_sl=0
check_fields REP 'infiniband.mad.attributeid == 0x0013' \
	rep.respres=0 rep.initdepth=0 rep.tgtackdelay=15 rep.failoveracc=0 rep.e2eflowctrl=0 \
	rep.rnrretrcount=0 rep.srq=1
pass "REQ and REP fields as Linux's IPoIB-CM sends them"

# Per-QP UDP source ports: every RC packet of a QP pair leaves from
# rdma_get_udp_sport(REQ QPN, REP QPN), receive stays on 4791, and the QP
# pairs differ. REQ and REP are paired by transaction ID.
sport() { # rdma_calc_flow_label folded by rdma_flow_label_to_udp_sport
	local v=$(($1 * $2)) fl
	v=$((v ^ (v >> 20)))
	v=$((v ^ (v >> 40)))
	fl=$((v & 0xFFFFF))
	echo $((((fl & 0x3FFF) ^ ((fl & 0xFC000) >> 14)) | 0xC000))
}
PAIRS=$(fields -Y 'infiniband.mad.attributeid == 0x0010 || infiniband.mad.attributeid == 0x0013' -T fields -E separator='|' \
	-e infiniband.mad.transactionid -e infiniband.mad.attributeid -e infiniband.cm.req.localqpn -e infiniband.cm.rep.localqpn |
	awk -F'|' '$2 == "0x0010" { req[$1] = $3 } $2 == "0x0013" { rep[$1] = $4 }
		END { for (t in req) if (t in rep) print req[t] "|" rep[t] }' | sort -u)
[ -n "$PAIRS" ] || fail "no REQ/REP pair by transaction ID"
PORTS=""
while IFS='|' read -r aq pq; do
	want=$(sport "$((aq))" "$((pq))")
	got=$(fields -Y "udp.dstport == 4791 && (infiniband.bth.destqp == $pq || infiniband.bth.destqp == $aq) && infiniband.bth.opcode <= 0x11" \
		-T fields -e udp.srcport | sort -u | tr '\n' ' ')
	[ "$got" = "$want " ] || fail "QP pair $aq/$pq sends from UDP ports '$got', want only rdma_get_udp_sport $want"
	echo "QP pair $((aq))/$((pq)): every RC packet from UDP port $want to 4791"
	PORTS="$PORTS $want"
done <<<"$PAIRS"
[ "$(echo $PORTS | tr ' ' '\n' | sort -u | wc -l)" -ge 2 ] || fail "QP pairs share source ports: $PORTS"
pass "RC QP pairs send from distinct per-QP source ports ($PORTS), all to 4791"

ARPS=$(fields -Y 'arp' -T fields -E separator='|' -e arp.hw.type -e arp.hw.size -e arp.src.hw -e arp.opcode)
[ -n "$ARPS" ] || fail "no IPoIB ARP decoded"
while IFS='|' read -r ht hs src op; do
	[ "$ht" = 32 ] && [ "$hs" = 20 ] || fail "ARP hardware type $ht size $hs"
	[ "$(echo "$src" | tr -d ':' | wc -c)" = 41 ] || fail "ARP source address $src is not 20 bytes"
done <<<"$ARPS"
pass "IPoIB ARP: $(echo "$ARPS" | wc -l) frames, hardware type 32, 20-byte addresses"

OPS=$(fields -T fields -e infiniband.bth.opcode | sort | uniq -c | tr -s ' ' | tr '\n' ',')
echo "opcodes (count opcode): $OPS"
SENDS=$(fields -Y 'infiniband.bth.opcode <= 4' -T fields -e frame.number | wc -l)
FIRSTS=$(fields -Y 'infiniband.bth.opcode == 0' -T fields -e frame.number | wc -l)
ACKS=$(fields -Y 'infiniband.bth.opcode == 0x11' -T fields -e frame.number | wc -l)
[ "$SENDS" -gt 0 ] && [ "$FIRSTS" -gt 0 ] && [ "$ACKS" -gt 0 ] || fail "RC SENDs $SENDS (FIRST $FIRSTS), ACKs $ACKS"
pass "RC: $SENDS SENDs ($FIRSTS SEND_FIRST), $ACKS ACKs decoded"

BAD=$(fields --disable-heuristic eth_over_ib -Y '_ws.malformed || _ws.expert.severity >= "error"' -T fields -e frame.number | wc -l)
[ "$BAD" = 0 ] || fail "$BAD malformed or error frames without the IPoIB heuristic"
BAD=$(fields -Y '(_ws.malformed || _ws.expert.severity >= "error") && !(infiniband.bth.opcode == 0)' -T fields -e frame.number | wc -l)
[ "$BAD" = 0 ] || fail "$BAD malformed or error frames besides the SEND_FIRST artefact"
# Warnings from the carried TCP's own analysis (retransmissions after the
# 1% loss, D-SACKs, segments the capture missed) are about the payload, not the
# RoCEv2 decode.
WARN=$(fields -Y '_ws.expert.severity >= "warning" && !tcp.analysis.flags && !tcp.options.sack.dsack && !(infiniband.bth.opcode == 0)' -T fields -e frame.number -e _ws.expert.message | sort -u -k2 | head -5)
[ -z "$WARN" ] || fail "expert warnings: $WARN"
pass "nothing malformed, no expert warnings but the carried TCP's (SEND_FIRST artefact aside)"

"$ICRCCHECK" "$CAP" || fail "ICRC check"
pass "every captured RoCEv2 frame's ICRC verifies"

step "connected mode under $LOSS loss"
iperf_check "$NS1" "$NS2" "$IB2" 5 connected
file_check connected $((64 << 20))
dropped=$(show r1 | jq '.[0].stats.rocev2.fault_dropped')
[ "$dropped" -gt 0 ] || fail "no datagram dropped by --loss"
pass "r1 dropped $dropped datagrams on purpose"

step "garbage at the UDP port"
before=$(show r2 | jq '.[0].stats.rocev2.rx_drops.garbage')
for _ in 1 2 3; do ip netns exec "$NS1" bash -c "echo junk >/dev/udp/$UL2/4791"; done
ip netns exec "$NS1" ping -c 2 -w 20 "$IB2" >/dev/null || fail "ping after garbage"
after=$(show r2 | jq '.[0].stats.rocev2.rx_drops.garbage')
[ "$after" -ge $((before + 3)) ] || fail "garbage drops $before -> $after: $(show r2 | jq -c '.[0].stats.rocev2')"
"$BIN" show --control-dir "$CTL" --host r2 | grep -q "rocev2.rx_drops.garbage: $after" || fail "ipoib show text lacks the garbage counter"
pass "3 garbage datagrams counted (rocev2.rx_drops.garbage $before -> $after), ping still passes"

step "datagram mode"
# The switch tears the connections down: capture their DREQ and DREP.
ip netns exec "$NS1" tshark -i "$VETH1" -f "udp port 4791" -s 0 -F pcap -w "$CAP2" -q >"$WORK/tshark2.log" 2>&1 &
TSHARK_PID=$!
# "Capturing on" comes before the capture is open; "Capture started" after.
wait_for "$WORK/tshark2.log" "Capture started" 20 || fail "tshark did not start capturing the teardown"
"$BIN" mode datagram --control-dir "$CTL" --host r1 >/dev/null || fail "mode r1"
"$BIN" mode datagram --control-dir "$CTL" --host r2 >/dev/null || fail "mode r2"
for h in r1 r2; do
	[ "$(show $h | jq -r '.[0].interface.mode')" = datagram ] || fail "$h not in datagram mode"
done
for ns in "$NS1" "$NS2"; do
	mtu=$(ip -n "$ns" -j link show ib0 | jq '.[0].mtu')
	[ "$mtu" = 4092 ] || fail "$ns ib0 mtu $mtu in datagram mode, want 4092"
done
ip netns exec "$NS1" ping -c 3 -w 20 "$IB2" >/dev/null || fail "ping in datagram mode"
pass "datagram mode, mtu 4092, ping"
for ((i = 0; i < 100; i++)); do
	[ "$(tshark -r "$CAP2" -n -Y 'infiniband.mad.attributeid == 0x0016' 2>/dev/null | wc -l)" -ge 1 ] && break
	sleep 0.2
done
stop_pid "$TSHARK_PID" INT 10 || true
TSHARK_PID=
CAP_MAIN=$CAP
CAP=$CAP2
DREQS=$(fields -Y 'infiniband.mad.attributeid == 0x0015' -T fields -E separator='|' -e infiniband.cm.dreq.localcommid -e infiniband.cm.dreq.remotecommid -e infiniband.cm.dreq.private)
DREPS=$(fields -Y 'infiniband.mad.attributeid == 0x0016' -T fields -e frame.number | wc -l)
[ -n "$DREQS" ] && [ "$DREPS" -ge 1 ] || fail "teardown: DREQ '$DREQS', $DREPS DREP"
while IFS='|' read -r l r priv; do
	[ "$((l))" != 0 ] && [ "$((r))" != 0 ] || fail "DREQ comm IDs $l/$r"
	[ -z "$(echo "$priv" | tr -d ':0')" ] || fail "DREQ private data $priv, want none (ib_send_cm_dreq(NULL, 0))"
done <<<"$DREQS"
echo "teardown: $(echo "$DREQS" | wc -l) DREQ (comm IDs set, no private data), $DREPS DREP"
BAD=$(fields -Y '_ws.malformed || (_ws.expert.severity >= "warning" && !tcp.analysis.flags && !tcp.options.sack.dsack)' -T fields -e frame.number | wc -l)
[ "$BAD" = 0 ] || fail "$BAD malformed frames or expert warnings in the teardown capture"
CAP=$CAP_MAIN
pass "teardown: DREQ and DREP decoded, no expert warnings"

# Datagram mode with offloads (ipoib up's default): the host's TSO super
# frames leave r1 as UD LSO work requests, which the RoCEv2 backend cuts
# into UD packets. On the wire each must fit the IB MTU (UDP length = 8 +
# BTH 12 + DETH 8 + payload <= 4096 + ICRC 4), decode cleanly and carry a
# valid ICRC.
CAP3=$WORK/datagram.pcap
lso_before=$(show r1 | jq '.[0].stats.offloads.tx_lso_wrs')
ip netns exec "$NS1" tshark -i "$VETH1" -f "udp port 4791" -s 0 -F pcap -w "$CAP3" -c 20000 -q >"$WORK/tshark3.log" 2>&1 &
TSHARK_PID=$!
wait_for "$WORK/tshark3.log" "Capture started" 20 || fail "tshark did not start capturing datagram mode"
iperf_check "$NS1" "$NS2" "$IB2" 5 datagram
for ((i = 0; i < 300; i++)); do
	kill -0 "$TSHARK_PID" 2>/dev/null || break
	sleep 0.1
done
stop_pid "$TSHARK_PID" INT 10 || true
TSHARK_PID=
lso=$(($(show r1 | jq '.[0].stats.offloads.tx_lso_wrs') - lso_before))
[ "$lso" -gt 0 ] || fail "datagram mode: no UD LSO work request posted: $(show r1 | jq -c '.[0].stats.offloads')"
CAP=$CAP3
UDLENS=$(fields -Y 'infiniband.bth.opcode == 0x64' -T fields -e udp.length | sort -n)
UDS=$(echo "$UDLENS" | grep -c . || true)
UDMAX=$(echo "$UDLENS" | tail -1)
[ "$UDS" -gt 1000 ] || fail "datagram capture: only $UDS UD SENDs"
[ "$UDMAX" -le 4128 ] || fail "a UD packet of UDP length $UDMAX: larger than the 4096-byte IB MTU"
[ "$UDMAX" -ge 4000 ] || fail "largest UD packet UDP length $UDMAX: the LSO segments are not MTU-sized"
# iperf3's payload is random bytes, which tshark's heuristics (Thrift)
# sometimes take for a protocol and call malformed: decode it as data.
BAD=$(fields -d tcp.port==5201,data -Y '_ws.malformed || _ws.expert.severity >= "error"' -T fields -e frame.number | wc -l)
[ "$BAD" = 0 ] || fail "$BAD malformed or error frames in the datagram-mode capture"
"$ICRCCHECK" "$CAP3" || fail "ICRC check (datagram mode)"
CAP=$CAP_MAIN
pass "datagram mode: $lso LSO work requests; $UDS UD SENDs captured, largest UDP length $UDMAX (<= 4128), nothing malformed, every ICRC valid"
file_check datagram $((64 << 20))

step "the receive side counted nothing bad"
for h in r1 r2; do
	s=$(show $h)
	icrc=$(echo "$s" | jq '.[0].stats.rocev2.rx_drops.bad_icrc')
	[ "$icrc" = 0 ] || fail "$h bad_icrc $icrc"
done
pass "no ICRC failures on either side"

step "P_Key child ib0.8001 on both (ipoib child add): BTH P_Key, REQ partition, ping, child del"
CAP3=$WORK/child.pcap
ip netns exec "$NS1" tshark -i "$VETH1" -f "udp port 4791" -s 0 -F pcap -w "$CAP3" -q >"$WORK/tshark3.log" 2>&1 &
TSHARK_PID=$!
wait_for "$WORK/tshark3.log" "Capture started" 20 || fail "tshark did not start capturing the child"
"$BIN" child add --control-dir "$CTL" --host r1 --addr "$CH1/24" 0x8001 >"$WORK/child1.log" 2>&1 || fail "child add r1: $(cat "$WORK/child1.log")"
"$BIN" child add --control-dir "$CTL" --host r2 --addr "$CH2/24" 0x8001 >"$WORK/child2.log" 2>&1 || fail "child add r2: $(cat "$WORK/child2.log")"
grep -qx "r1: ib0.8001: pkey 0x8001 membership full parent ib0 added" "$WORK/child1.log" || fail "child add r1 said: $(cat "$WORK/child1.log")"
ip netns exec "$NS1" ping -c 3 -w 20 "$CH2" >/dev/null || fail "ping r1 -> r2 over ib0.8001"
[ "$(show r1 | jq -r '[.[] | select(.interface.name == "ib0.8001" and .interface.pkey == "0x8001" and .interface.parent == "ib0" and .stats.counters.tx_packets > 0)] | length')" = 1 ] ||
	fail "show r1 lacks a moving ib0.8001: $(show r1 | jq -c '[.[] | .interface]')"
for ((i = 0; i < 100; i++)); do
	[ "$(tshark -r "$CAP3" -n -Y 'infiniband.cm.req.pkey == 0x8001' 2>/dev/null | wc -l)" -ge 1 ] && break
	sleep 0.2
done
stop_pid "$TSHARK_PID" INT 10 || true
TSHARK_PID=
CAP_MAIN=$CAP
CAP=$CAP3
REQ8001=$(fields -Y 'infiniband.cm.req.pkey == 0x8001' -T fields -e frame.number | wc -l)
BTH8001=$(fields -Y 'infiniband.bth.p_key == 0x8001 && infiniband.bth.opcode <= 4' -T fields -e frame.number | wc -l)
UD8001=$(fields -Y 'infiniband.bth.p_key == 0x8001 && infiniband.bth.opcode == 100' -T fields -e frame.number | wc -l)
[ "$REQ8001" -ge 1 ] && [ "$BTH8001" -ge 1 ] && [ "$UD8001" -ge 1 ] || fail "child capture: $REQ8001 REQs, $BTH8001 RC SENDs, $UD8001 UD sends in 0x8001"
BAD=$(fields -Y '_ws.malformed || (_ws.expert.severity >= "error" && !(infiniband.bth.opcode == 0))' -T fields -e frame.number | wc -l)
[ "$BAD" = 0 ] || fail "$BAD malformed frames in the child capture"
CAP=$CAP_MAIN
pass "child: $REQ8001 REQ with partition 0x8001, $BTH8001 RC SENDs and $UD8001 UD sends with BTH P_Key 0x8001, nothing malformed; ping over ib0.8001"
for h in r1 r2; do
	"$BIN" child del --control-dir "$CTL" --host "$h" ib0.8001 >/dev/null || fail "child del $h"
done
for ns in "$NS1" "$NS2"; do
	if ip -n "$ns" link show ib0.8001 >/dev/null 2>&1; then fail "$ns ib0.8001 left after child del"; fi
done
pass "child del: both ib0.8001 TAPs gone"

step "SIGTERM"
rc=0
stop_pid "$UP1_PID" TERM 15 || rc=$?
UP1_PID=
[ "$rc" = 0 ] || fail "r1 exit status $rc"
rc=0
stop_pid "$UP2_PID" TERM 15 || rc=$?
UP2_PID=
[ "$rc" = 0 ] || fail "r2 exit status $rc"
for ns in "$NS1" "$NS2"; do
	if ip -n "$ns" link show ib0 >/dev/null 2>&1; then fail "$ns ib0 left behind"; fi
done
[ -z "$(ls -A "$CTL")" ] || fail "control sockets left: $(ls "$CTL")"
pass "both exited 0, TAPs and control sockets gone"

FAILED=0
echo
echo "e2e-rocev2: ALL PASS"
