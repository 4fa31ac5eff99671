# Sourced by the bench_routing-based scripts (bench_routing.sh, bench_abuse.sh, bench_reload.sh):
# the checks and the build every one of them starts with.

# Exits unless the peers the harness starts (nginx and HAProxy) are installed.
require_peers() {
    for tool in nginx haproxy; do
        command -v "$tool" >/dev/null || {
            echo "$tool is missing: apt-get install -y nginx-light haproxy" >&2
            exit 1
        }
    done
}

# Builds gpulb and the example harnesses in release mode, unless SKIP_BUILD is set.
build_release() {
    if [[ -z ${SKIP_BUILD:-} ]]; then
        cargo build --release --bin gpulb --examples >&2
    fi
}
