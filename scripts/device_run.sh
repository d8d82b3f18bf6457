#!/usr/bin/env bash
# scripts/device_run.sh - run every device check with the self-contained
# ckptfs, under one timeout.  Builds nothing: it unpacks a bundle tarball made
# beforehand by scripts/bundle (cmake --build BUILD --target bundle) and runs
#   1. scripts/device_check_orbax.py        write a step through ckptfs, restore it with Orbax
#   2. scripts/device_check_safetensors.py  the safetensors view with torch/safetensors (on cuda)
#   3. scripts/device_check_bench.py        Orbax vs torch DCP vs ckptfs, ~2 GiB bf16, one table
#
# Usage: scripts/device_run.sh [--dry-run] [BUNDLE.tar.gz | BUNDLE_DIR]
#   default bundle: the newest build*/bundle/ckptfs-*-linux-$(uname -m).tar.gz
#   --dry-run       for a machine without GPU, JAX, Orbax or torch: each check
#                   runs its --dry-run (the ckptfs side only)
# Environment: TIMEOUT (seconds for all three, default 540), PYTHON (default
# python3: the one with orbax-checkpoint, jax and torch), WORK (disk folder
# for checkpoints, default /var/tmp), SIZE_MIB (bench model size, default 2048).
# Exit status: 0 when every check passed, 124 on the timeout, else 1.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
TIMEOUT="${TIMEOUT:-540}"
WORK="${WORK:-/var/tmp}"
FIX="$ROOT/tests/fixtures/orbax-0.12.4"

if [ "${1:-}" = "--inner" ]; then
	# the three checks; the outer call holds the timeout
	dry="$2"
	fails=0
	step() {
		local name="$1"
		shift
		echo
		echo "=== $name: $*"
		"$PYTHON" "$@"
		local rc=$?
		echo "=== $name: exit status $rc"
		[ "$rc" -eq 0 ] || fails=$((fails + 1))
	}
	dev=(--device cuda)
	extra=()
	if [ -n "$dry" ]; then
		dev=()
		extra=(--dry-run)
	fi
	size=()
	[ -n "${SIZE_MIB:-}" ] && size=(--size-mib "$SIZE_MIB")
	step orbax "$ROOT/scripts/device_check_orbax.py" --work "$WORK" "${extra[@]}"
	step safetensors "$ROOT/scripts/device_check_safetensors.py" --source "$FIX/pytree_zarr3" \
		params.safetensors "$FIX/expected" --fixture "$FIX/params.safetensors" "${dev[@]}" "${extra[@]}"
	step bench "$ROOT/scripts/device_check_bench.py" --work "$WORK" "${size[@]}" "${extra[@]}"
	echo
	echo "device_run: $fails of 3 checks failed"
	[ "$fails" -eq 0 ]
	exit
fi

dry=""
if [ "${1:-}" = "--dry-run" ]; then
	dry="--dry-run"
	shift
fi
bundle="${1:-}"
if [ -z "$bundle" ]; then
	bundle="$(ls -t "$ROOT"/build*/bundle/ckptfs-*-linux-"$(uname -m)".tar.gz 2>/dev/null | head -n 1)"
	[ -n "$bundle" ] || {
		echo "device_run: no bundle under build*/bundle (make one: cmake --build BUILD --target bundle)" >&2
		exit 1
	}
fi

tmp="$(mktemp -d "${TMPDIR:-/tmp}/ckptfs-device-run.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
if [ -d "$bundle" ]; then
	cp -a "$bundle" "$tmp/" || exit 1
else
	tar -C "$tmp" -xzf "$bundle" || {
		echo "device_run: cannot unpack $bundle" >&2
		exit 1
	}
fi
CKPTFS="$(ls "$tmp"/*/bin/ckptfs 2>/dev/null | head -n 1)"
[ -x "$CKPTFS" ] || {
	echo "device_run: $bundle holds no bin/ckptfs" >&2
	exit 1
}
# mount points and daemon logs of the checks go to $tmp/t, removed at the end
mkdir -p "$tmp/t"
export CKPTFS PYTHON WORK TMPDIR="$tmp/t"
echo "device_run: $("$CKPTFS" --version) from $bundle (unpacked in $tmp)"
[ -e /dev/fuse ] || echo "device_run: warning: /dev/fuse is missing; mounts will fail" >&2
command -v fusermount3 >/dev/null || [ "$(id -u)" -eq 0 ] ||
	echo "device_run: warning: no fusermount3 and not root; mounts will fail" >&2
echo "device_run: $("$PYTHON" --version 2>&1) ($PYTHON), timeout ${TIMEOUT}s, work $WORK"

timeout --kill-after=20 "$TIMEOUT" bash "$0" --inner "$dry"
rc=$?
# a check killed mid-run leaves its mount behind (only ours: under $tmp)
awk -v t="$tmp/" 'index($2, t) == 1 { print $2 }' /proc/mounts | while read -r m; do
	fusermount3 -u "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
done
if [ "$rc" -ne 0 ]; then
	for log in "$tmp"/t/*.log; do
		[ -s "$log" ] || continue
		echo "--- daemon log $(basename "$log") (last lines)"
		tail -n 20 "$log"
	done
fi
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
	echo "device_run: timed out after ${TIMEOUT}s" >&2
	exit 124
fi
exit "$rc"
