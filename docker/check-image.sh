#!/usr/bin/env bash
# Builds the gpulb image with podman and checks it the way `docker run` would use it: it holds the
# system root store; the default command (the demo) answers on the proxy and admin ports, runs as
# uid 10001, keeps its HEALTHCHECK and passes it, finishes an SSE stream across `stop` (SIGTERM)
# with `[DONE]`, exits 0 and logs without colour codes; `gpulb sim` runs as a subcommand. Prints
# one line per check and exits non-zero on the first that fails. From the repository root, as
# root, on a machine with podman:
#   bash docker/check-image.sh
# STAND_IN=1 first makes local stand-ins for the two base images, for machines that reach
# Debian's mirror and crates.io but not docker.io: debian:bookworm-slim from debootstrap
# (minbase), rust:1-bookworm from the same plus gcc and this machine's own Rust toolchain. Both
# are tagged with the names the Dockerfile asks for, so the Dockerfile is built unchanged.
# The checks bind 127.0.0.1:8080, :8081 and :18000 (host network); they must be free.
set -euo pipefail

IMAGE=${IMAGE:-localhost/gpulb:check}
NAME=gpulb-check-$$
WORK=$(mktemp -d)
# podman's defaults raise rlimits a sandboxed root may not raise; runc with explicit limits
# works where crun refuses (cgroups v1 hybrid hosts).
RUNTIME=()
if command -v runc >/dev/null 2>&1; then RUNTIME=(--runtime "$(command -v runc)"); fi
LIMITS=(--ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit nproc=4096:4096)
pm() { podman "${RUNTIME[@]}" "$@"; }

cleanup() {
  pm rm -f "$NAME" "$NAME-sim" >/dev/null 2>&1 || true
  # The rust stand-in's /proc, if a failure or a signal came while it was mounted.
  if mountpoint -q "$WORK/rust/proc" 2>/dev/null; then umount "$WORK/rust/proc"; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

fail() { echo "FAIL: $*" >&2; exit 1; }
# Fails naming `what`, with the end of `log` (the work folder, logs included, is removed on exit).
fail_with_log() { tail -n 20 "$2" >&2; fail "$1"; }
ok() { echo "ok: $*"; }

stand_in_bases() {
  command -v debootstrap >/dev/null || fail "STAND_IN=1 needs debootstrap"
  local slim=$WORK/slim rust=$WORK/rust toolchain
  debootstrap --variant=minbase bookworm "$slim" http://deb.debian.org/debian >"$WORK/debootstrap.log" 2>&1 \
    || fail_with_log "debootstrap of bookworm" "$WORK/debootstrap.log"
  tar -C "$slim" -c . | podman import - docker.io/library/debian:bookworm-slim >/dev/null 2>&1
  cp -a "$slim" "$rust"
  # A sandbox that intercepts TLS has its own CA: the build stage's cargo must trust it (the
  # runtime stand-in does not get it; its apt-get fetches over http, as Debian's images do).
  mkdir -p "$rust/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$rust/usr/local/share/ca-certificates/" 2>/dev/null || true
  cp /etc/resolv.conf "$rust/etc/resolv.conf"
  mount -t proc proc "$rust/proc"
  chroot "$rust" bash -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends gcc g++ libc6-dev make ca-certificates pkg-config && update-ca-certificates" \
    >"$WORK/rust-base.log" 2>&1 || fail_with_log "the rust stand-in's packages" "$WORK/rust-base.log"
  umount "$rust/proc"
  toolchain=$(rustc --print sysroot)
  mkdir -p "$rust/usr/local/rust"
  cp -a "$toolchain/." "$rust/usr/local/rust/"
  rm -rf "$rust/usr/local/rust/share/doc"
  tar -C "$rust" -c . | podman import \
    --change 'ENV PATH=/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV CARGO_HOME=/usr/local/cargo' - docker.io/library/rust:1-bookworm >/dev/null 2>&1
  ok "stand-in base images: debian:bookworm-slim (debootstrap minbase), rust:1-bookworm ($(rustc --version))"
}

wait_http() { # url, what
  for _ in $(seq 1 60); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 0.5
  done
  fail "$2: $1 did not answer within 30 s"
}

# Something else answering on these ports would pass the checks in the container's place.
for port in 8080 8081 18000; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    fail "127.0.0.1:$port is already in use; stop what listens there first"
  fi
done

[ "${STAND_IN:-0}" = 1 ] && stand_in_bases

start=$(date +%s)
# --format docker keeps HEALTHCHECK (the OCI image format has no field for it).
podman build --format docker --isolation chroot --network host "${LIMITS[@]}" \
  -f docker/Dockerfile -t "$IMAGE" . >"$WORK/build.log" 2>&1 \
  || fail_with_log "podman build" "$WORK/build.log"
ok "built $IMAGE in $(($(date +%s) - start)) s, $(podman image inspect "$IMAGE" --format '{{.Size}}') bytes"

user=$(podman image inspect "$IMAGE" --format '{{.Config.User}}')
[ "$user" = 10001:10001 ] || fail "image user is '$user', not 10001:10001"
health=$(podman image inspect "$IMAGE" --format '{{json .Config.Healthcheck}}')
case $health in *'"gpulb","probe"'*livez*) ;; *) fail "no HEALTHCHECK on /livez: $health" ;; esac
ok "runs as $user; HEALTHCHECK $health"
roots=$(pm run --rm "${LIMITS[@]}" --entrypoint /bin/sh "$IMAGE" -c \
  'grep -c "BEGIN CERTIFICATE" /etc/ssl/certs/ca-certificates.crt' 2>>"$WORK/podman.log") \
  || fail "no system root store (/etc/ssl/certs/ca-certificates.crt) for https backends"
ok "system root store: $roots certificates"

# podman's healthcheck timers need systemd, which a sandbox may lack: its complaints go to a log.
pm run -d --name "$NAME" --network host "${LIMITS[@]}" "$IMAGE" >/dev/null 2>>"$WORK/podman.log"
wait_http http://127.0.0.1:8081/livez "the default command's admin listener"
curl -fsS http://127.0.0.1:8081/readyz | grep -q '"ready"' || fail "/readyz is not ready"
models=$(curl -fsS http://127.0.0.1:8080/v1/models)
case $models in *llama-3.1-8b*qwen2.5-32b*) ;; *) fail "/v1/models: $models" ;; esac
answer=$(curl -fsS http://127.0.0.1:8080/v1/chat/completions -H 'content-type: application/json' \
  -d '{"model":"llama-3.1-8b","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}')
case $answer in *'"completion_tokens":8'*) ;; *) fail "chat completion: $answer" ;; esac
[ "$(pm exec "$NAME" id -u)" = 10001 ] || fail "the process does not run as uid 10001"
pm exec "$NAME" gpulb probe http://127.0.0.1:8081/livez >/dev/null || fail "the HEALTHCHECK command fails"
ok "default command (demo): /livez, /readyz, /v1/models, a chat completion, uid 10001, HEALTHCHECK passes"

curl -sN http://127.0.0.1:8080/v1/chat/completions -H 'content-type: application/json' \
  -d '{"model":"qwen2.5-32b","stream":true,"max_tokens":200,"messages":[{"role":"user","content":"hi"}]}' \
  >"$WORK/stream" &
streaming=$!
sleep 0.5
before=$(grep -c '^data: {' "$WORK/stream" || true)
[ "$before" -lt 200 ] || fail "the stream was over before stop; nothing was drained"
stop_start=$(date +%s.%N)
pm stop -t 60 "$NAME" >/dev/null 2>>"$WORK/podman.log"
stop_end=$(date +%s.%N)
wait "$streaming" || fail "the stream's client failed across stop"
tokens=$(grep -c '^data: {' "$WORK/stream" || true)
tail -n 2 "$WORK/stream" | grep -q '^data: \[DONE\]' || fail "the stream ended without [DONE] after $tokens events"
code=$(podman inspect "$NAME" --format '{{.State.ExitCode}}')
[ "$code" = 0 ] || fail "exit code $code after stop"
ok "stop (SIGTERM) at event $before of a 200-token stream: $tokens events then [DONE], exit 0, $(awk "BEGIN {printf \"%.1f\", $stop_end - $stop_start}") s"
if pm logs "$NAME" 2>&1 | grep -q $'\e\['; then fail "the container log has terminal colour codes"; fi
ok "the container log is plain text"

pm run -d --name "$NAME-sim" --network host "${LIMITS[@]}" "$IMAGE" sim --listen 127.0.0.1:18000 \
  >/dev/null 2>>"$WORK/podman.log"
wait_http http://127.0.0.1:18000/v1/models "gpulb sim"
curl -fsS http://127.0.0.1:18000/metrics | grep -q '^vllm:num_requests_running' || fail "sim /metrics"
ok "gpulb sim as the command: /v1/models and vLLM-style /metrics"
echo "image check passed: $IMAGE"
