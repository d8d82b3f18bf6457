#!/bin/sh
# Start s3rver (repo-local node_modules, see package.json) on 127.0.0.1 with
# bucket "ckpt", print "PORT PID", and leave it running; stop it with
# kill PID.  Usage: tests/s3/start_s3rver.sh DATA_DIR
set -eu
repo=$(cd "$(dirname "$0")/../.." && pwd)
data=${1:?usage: $0 DATA_DIR}
mkdir -p "$data"
[ -f "$repo/node_modules/s3rver/bin/s3rver.js" ] || (cd "$repo" && npm install --no-audit --no-fund >/dev/null)
log="$data.log"
NODE_OPTIONS=--openssl-legacy-provider nohup node "$repo/node_modules/s3rver/bin/s3rver.js" \
	-d "$data" -a 127.0.0.1 -p 0 -s --configure-bucket ckpt >"$log" 2>&1 &
pid=$!
i=0
while [ $i -lt 200 ]; do
	port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" | head -1)
	if [ -n "$port" ] && curl -s -o /dev/null "http://127.0.0.1:$port/"; then
		echo "$port $pid"
		exit 0
	fi
	i=$((i + 1))
	sleep 0.05
done
kill "$pid" 2>/dev/null || true
echo "s3rver did not start; see $log" >&2
exit 1
