# shellcheck shell=bash
# lib.sh: helpers shared by the .ci scripts: step banners, PASS/FAIL lines,
# bounded waits. Source it after 'set -euo pipefail'.
#
# CI_KEEP_GOING=1 makes ci_fail record the failure and return instead of
# exiting, so one run shows every failing check; the script must still end
# with ci_finish, which exits 1 if anything failed.

ci_t0=$SECONDS
ci_failures=0
ci_passes=0
ci_current_step=""
# ci_on_fail, if set by the script, names a function that prints context
# (log tails) before a failure exits.
ci_on_fail=""

# ci_step prints a banner for the next step; the elapsed time lets a slow
# step be spotted in the CI log.
ci_step() {
	ci_current_step="$*"
	printf '\n==> [%3ds] %s\n' "$((SECONDS - ci_t0))" "$*"
}

ci_info() { printf '    %s\n' "$*"; }

ci_pass() {
	ci_passes=$((ci_passes + 1))
	printf 'PASS: %s\n' "$*"
}

# ci_fail prints a FAIL line (and any further arguments as evidence lines)
# and exits 1, unless CI_KEEP_GOING=1.
ci_fail() {
	ci_failures=$((ci_failures + 1))
	printf "FAIL: %s%s\n" "$1" "${ci_current_step:+ [step: $ci_current_step]}"
	shift
	local line
	for line in "$@"; do
		printf '      %s\n' "$line"
	done
	if [[ "${CI_KEEP_GOING:-0}" != 1 ]]; then
		if [[ -n "$ci_on_fail" ]]; then
			"$ci_on_fail" || true
		fi
		exit 1
	fi
	return 0
}

# ci_check DESCRIPTION COMMAND...: PASS if the command succeeds, else FAIL
# with its output as evidence.
ci_check() {
	local what=$1 out
	shift
	if out=$("$@" 2>&1); then
		ci_pass "$what"
	else
		ci_fail "$what" "command: $*" "${out:-<no output>}"
	fi
}

# ci_wait_until SECONDS DESCRIPTION COMMAND...: runs COMMAND until it
# succeeds or SECONDS have passed. This is the shell's substitute for an
# event: the things waited for (a control socket answering, a log line)
# have no notification a script can block on, so it polls every 100 ms
# and is bounded by the deadline. Returns 1 on timeout.
ci_wait_until() {
	local limit=$1 what=$2
	shift 2
	local deadline=$((SECONDS + limit))
	while ! "$@" >/dev/null 2>&1; do
		if ((SECONDS >= deadline)); then
			printf '    timed out after %ds waiting for %s\n' "$limit" "$what"
			return 1
		fi
		sleep 0.1
	done
	return 0
}

# ci_require_cmd NAME [HINT]: fails if NAME is not in PATH.
ci_require_cmd() {
	if ! command -v "$1" >/dev/null 2>&1; then
		ci_fail "$1 not in PATH${2:+: $2}"
	fi
}

# ci_finish prints the summary and exits non-zero if any check failed.
ci_finish() {
	printf '\n==> [%3ds] done: %d passed, %d failed\n' "$((SECONDS - ci_t0))" "$ci_passes" "$ci_failures"
	if ((ci_failures > 0)); then
		if [[ -n "$ci_on_fail" ]]; then
			"$ci_on_fail" || true
		fi
		exit 1
	fi
	exit 0
}
