//! The load balancers under test: their configs (written to the run directory) and processes.

use crate::procs::ChildGuard;
use crate::reloader::{self, Trigger};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One target: a load balancer and its policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// gpulb, interactive requests classified by their `x-priority: interactive` header.
    Gpulb,
    /// gpulb, classes chosen from the JSON body only: the client sends no `x-priority` header
    /// and the interactive class matches `--body-match` (e.g. `stream: true`, small
    /// `max_tokens`).
    GpulbBody,
    /// gpulb as `Gpulb`, with body reading turned off (`request_body: {paths: []}`): the time
    /// to first token with the body read before routing against without.
    GpulbUnread,
    /// gpulb with `Gpulb`'s config exactly, a second process: an A/A control, so a run shows
    /// how far two turns of one config differ in one sitting.
    GpulbSame,
    NginxRr,
    NginxLc,
    HaproxyRr,
    HaproxyLc,
    /// Not a default target: HAProxy leastconn with a per-server `maxconn` (so requests queue
    /// in HAProxy, not in the worker) and `set-priority-class` for interactive requests — the
    /// closest a stock load balancer gets to gpulb's class queues.
    HaproxyPrio,
    /// gpulb with the interactive class's `placement: prefix_affinity` (the prefix workload).
    GpulbPrefix,
    /// gpulb with the interactive class's `placement: least_loaded`.
    GpulbLeastLoaded,
    /// SGLang's router (PyPI `sglang-router`) with `--policy cache_aware`.
    SglangCacheAware,
    /// Two gpulb replicas with `gpulb`'s config, the trace split between them at random.
    GpulbReplicas2,
    /// Three gpulb replicas, likewise.
    GpulbReplicas3,
    /// Two replicas with `telemetry.count_others: false`: each admits against its own
    /// requests only (the load the other sends is seen in scores, not in caps).
    GpulbReplicas2Blind,
}

/// Every target, in the order `--help` lists them.
const ALL_TARGETS: [Target; 15] = [
    Target::Gpulb,
    Target::GpulbBody,
    Target::GpulbUnread,
    Target::GpulbSame,
    Target::NginxRr,
    Target::NginxLc,
    Target::HaproxyRr,
    Target::HaproxyLc,
    Target::HaproxyPrio,
    Target::GpulbPrefix,
    Target::GpulbLeastLoaded,
    Target::SglangCacheAware,
    Target::GpulbReplicas2,
    Target::GpulbReplicas3,
    Target::GpulbReplicas2Blind,
];

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Gpulb => "gpulb",
            Target::GpulbBody => "gpulb-body",
            Target::GpulbUnread => "gpulb-unread",
            Target::GpulbSame => "gpulb-same",
            Target::NginxRr => "nginx-rr",
            Target::NginxLc => "nginx-lc",
            Target::HaproxyRr => "haproxy-rr",
            Target::HaproxyLc => "haproxy-lc",
            Target::HaproxyPrio => "haproxy-prio",
            Target::GpulbPrefix => "gpulb-prefix",
            Target::GpulbLeastLoaded => "gpulb-ll",
            Target::SglangCacheAware => "sglang-cache-aware",
            Target::GpulbReplicas2 => "gpulb-x2",
            Target::GpulbReplicas3 => "gpulb-x3",
            Target::GpulbReplicas2Blind => "gpulb-x2-blind",
        }
    }

    /// How many processes of it run side by side, the trace split between them.
    pub fn replicas(self) -> usize {
        match self {
            Target::GpulbReplicas2 | Target::GpulbReplicas2Blind => 2,
            Target::GpulbReplicas3 => 3,
            _ => 1,
        }
    }

    /// The interactive class placement this target forces over --interactive-placement.
    fn forced_placement(self) -> Option<&'static str> {
        match self {
            Target::GpulbPrefix => Some("prefix_affinity"),
            Target::GpulbLeastLoaded => Some("least_loaded"),
            _ => None,
        }
    }

    pub fn parse(s: &str) -> Result<Target, String> {
        ALL_TARGETS
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = ALL_TARGETS.iter().map(|t| t.name()).collect();
                format!("unknown target {s:?} ({})", names.join(", "))
            })
    }

    /// Whether this target is gpulb (it has an admin `/status` to sample).
    pub fn is_gpulb(self) -> bool {
        matches!(
            self,
            Target::Gpulb
                | Target::GpulbBody
                | Target::GpulbUnread
                | Target::GpulbSame
                | Target::GpulbPrefix
                | Target::GpulbLeastLoaded
                | Target::GpulbReplicas2
                | Target::GpulbReplicas3
                | Target::GpulbReplicas2Blind
        )
    }

    /// Whether the client marks interactive requests with `x-priority: interactive` (every
    /// target but gpulb-body, which must tell the classes apart from the body alone).
    pub fn priority_header(self) -> bool {
        self != Target::GpulbBody
    }
}

/// What every config needs to know.
pub struct Setup<'a> {
    pub dir: &'a Path,
    pub listen_port: u16,
    pub admin_port: u16,
    /// `127.0.0.1:PORT` of each worker.
    pub workers: &'a [String],
    /// Worker threads / processes of every proxy.
    pub threads: usize,
    /// gpulb knobs (used by the generated gpulb config only).
    pub gpulb: &'a GpulbKnobs,
    /// HAProxy `maxconn` per server for haproxy-prio.
    pub prio_maxconn: usize,
    /// Per-worker weights given to every target alike (`None`: all equal, no weight written).
    pub weights: Option<&'a [u32]>,
    /// The SGLang router's command (program and leading arguments).
    pub sglang_router: &'a [String],
    /// The run reloads targets (`--reload-every`): gpulb gets an admin token for
    /// `POST /reload`, HAProxy runs in master-worker mode (`-W`, listeners handed over).
    pub reloads: bool,
}

impl Setup<'_> {
    fn weight(&self, i: usize) -> Option<u32> {
        self.weights.and_then(|w| w.get(i).copied())
    }
}

/// Knobs of the generated gpulb config.
#[derive(Clone, Debug)]
pub struct GpulbKnobs {
    pub max_outstanding: usize,
    pub bulk_share: f64,
    /// Bulk class `placement`.
    pub bulk_placement: String,
    /// Interactive class `placement`.
    pub interactive_placement: String,
    pub interactive_max_wait: String,
    pub bulk_max_wait: String,
    pub telemetry_interval: String,
    /// `guards.max_server_queue` on the pool; negative = no guard.
    pub max_server_queue: f64,
    /// Interactive class `guards.max_server_queue`; negative = none (then the pool's applies).
    pub interactive_guard_queue: f64,
    /// Interactive class `guards.max_kv_cache` (with the queue guard); negative = none.
    pub interactive_guard_kv: f64,
    /// Bulk class `guards.max_kv_cache`; negative = none (then the pool's applies).
    pub bulk_guard_kv: f64,
    /// Access log on (it records each request's queue wait; off for parity by default).
    pub access_log: bool,
    /// The interactive class's `match` for gpulb-body (a YAML flow mapping of body rules).
    pub body_match: String,
    /// A user-supplied template instead of the generated config.
    pub template: Option<PathBuf>,
    /// `telemetry.count_others`: admission counts other replicas' requests on each backend.
    pub count_others: bool,
    /// `telemetry.waiting_interval`.
    pub waiting_interval: String,
}

/// How a generated gpulb config tells interactive requests from bulk ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Classify {
    /// By the `x-priority: interactive` header.
    Header,
    /// By the JSON body only (`GpulbKnobs::body_match`).
    Body,
    /// By the header, with gpulb reading no request body at all.
    HeaderUnread,
}

/// The gpulb config for this run (generated, or the template with placeholders filled in; a
/// template is used as written whatever `classify` says).
pub fn gpulb_config(s: &Setup, classify: Classify) -> Result<String, String> {
    if let Some(path) = &s.gpulb.template {
        return filled_template(s, path);
    }
    let mut y = String::new();
    globals(&mut y, s);
    if classify == Classify::HeaderUnread {
        let _ = writeln!(y, "request_body: {{paths: []}}");
    }
    backends(&mut y, s);
    pool(&mut y, s);
    let _ = writeln!(y, "classes:");
    interactive_class(&mut y, s.gpulb, classify);
    bulk_class(&mut y, s.gpulb);
    let _ = writeln!(y, "default_class: bulk");
    Ok(y)
}

/// The user's gpulb config with {LISTEN} {ADMIN} {THREADS} {URL0}.. replaced.
fn filled_template(s: &Setup, path: &Path) -> Result<String, String> {
    let mut text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    text = text
        .replace("{LISTEN}", &format!("127.0.0.1:{}", s.listen_port))
        .replace("{ADMIN}", &format!("127.0.0.1:{}", s.admin_port))
        .replace("{THREADS}", &s.threads.to_string());
    for (i, w) in s.workers.iter().enumerate() {
        text = text.replace(&format!("{{URL{i}}}"), &format!("http://{w}"));
    }
    Ok(text)
}

/// Listeners, threads, logging, timeouts, health checks and telemetry staleness.
fn globals(y: &mut String, s: &Setup) {
    let _ = writeln!(
        y,
        "# gpulb config generated by examples/bench_routing (ports are per run)."
    );
    let _ = writeln!(y, "listen: 127.0.0.1:{}", s.listen_port);
    let _ = writeln!(y, "threads: {}", s.threads);
    if s.reloads {
        let _ = writeln!(
            y,
            "# The token for POST /reload (--reload-every) is set by the harness in {}.",
            reloader::TOKEN_ENV
        );
        let _ = writeln!(
            y,
            "admin: {{listen: 127.0.0.1:{}, token_env: {}}}",
            s.admin_port,
            reloader::TOKEN_ENV
        );
    } else {
        let _ = writeln!(y, "admin: {{listen: 127.0.0.1:{}}}", s.admin_port);
    }
    let _ = writeln!(y, "reload: {{watch: false}}");
    let _ = writeln!(y, "shutdown_timeout: 1s");
    let _ = writeln!(
        y,
        "# Off, as nginx and HAProxy run with logging off (--gpulb-access-log: on)."
    );
    let _ = writeln!(y, "access_log: {{enabled: {}}}", s.gpulb.access_log);
    let _ = writeln!(y, "timeouts: {{read: 300s}}");
    let _ = writeln!(y, "health_check: {{interval: 1s, rise: 1}}");
    let _ = writeln!(
        y,
        "telemetry: {{stale_after: 2s, count_others: {}, waiting_interval: {}}}",
        s.gpulb.count_others, s.gpulb.waiting_interval
    );
}

/// One backend per worker, with a slot per sequence it can run and model-server telemetry.
fn backends(y: &mut String, s: &Setup) {
    let k = s.gpulb;
    let _ = writeln!(
        y,
        "# One slot per sequence the worker can run (its max_running): requests beyond"
    );
    let _ = writeln!(
        y,
        "# that wait in gpulb's class queues, where interactive goes first, instead of"
    );
    let _ = writeln!(y, "# in the worker's FIFO behind long bulk jobs.");
    let _ = writeln!(y, "backends:");
    for (i, w) in s.workers.iter().enumerate() {
        let _ = writeln!(y, "  - name: gpu{i}");
        let _ = writeln!(y, "    url: http://{w}");
        let _ = writeln!(y, "    max_outstanding: {}", k.max_outstanding);
        if let Some(w) = s.weight(i) {
            let _ = writeln!(y, "    weight: {w}");
        }
        let _ = writeln!(
            y,
            "    telemetry: [{{kind: model_server, server: vllm, interval: {}, timeout: 200ms}}]",
            k.telemetry_interval
        );
    }
}

/// The one pool of every backend, with its guard when --max-server-queue is set.
fn pool(y: &mut String, s: &Setup) {
    let names: Vec<String> = (0..s.workers.len()).map(|i| format!("gpu{i}")).collect();
    let _ = writeln!(y, "pools:");
    let _ = writeln!(y, "  - name: fleet");
    let _ = writeln!(y, "    backends: [{}]", names.join(", "));
    if s.gpulb.max_server_queue >= 0.0 {
        let _ = writeln!(
            y,
            "    # A worker with requests queued inside it gets no new ones."
        );
        let _ = writeln!(
            y,
            "    guards: {{max_server_queue: {}}}",
            s.gpulb.max_server_queue
        );
    }
}

/// The interactive class: matched by header or by body, fair between tenants, kept off busy
/// workers.
fn interactive_class(y: &mut String, k: &GpulbKnobs, classify: Classify) {
    let _ = writeln!(y, "  - name: interactive");
    match classify {
        Classify::Header | Classify::HeaderUnread => {
            let _ = writeln!(y, "    match: {{headers: {{x-priority: interactive}}}}");
        }
        Classify::Body => {
            comment(
                y,
                &[
                    "Chosen from the JSON body only: the client sends no x-priority header.",
                    "Interactive requests are streaming chats with a small max_tokens; bulk",
                    "ones are non-streaming completions with a large one (the default class).",
                ],
            );
            let _ = writeln!(y, "    match: {}", k.body_match);
        }
    }
    let _ = writeln!(y, "    pool: fleet");
    let _ = writeln!(
        y,
        "    queue: {{max_depth: 1024, max_wait: {}}}",
        k.interactive_max_wait
    );
    let _ = writeln!(y, "    fairness: {{policy: equal_share}}");
    placement(
        y,
        &k.interactive_placement,
        "speed_weighted",
        &[
            "Weights divided by measured slowness: the half-speed worker gets fewer",
            "streams, which there hold a slot twice as long.",
        ],
    );
    if k.interactive_guard_queue >= 0.0 {
        comment(
            y,
            &[
                "Skip a worker whose own queue holds more than this (a request counts as",
                "waiting until the worker's next step, so 0 would trip on healthy workers)",
                "or, when given, whose KV cache is fuller than max_kv_cache (a request that",
                "does not fit waits in the worker's FIFO).",
            ],
        );
        let kv = if k.interactive_guard_kv >= 0.0 {
            format!(", max_kv_cache: {}", k.interactive_guard_kv)
        } else {
            String::new()
        };
        let _ = writeln!(
            y,
            "    guards: {{max_server_queue: {}{kv}}}",
            k.interactive_guard_queue
        );
    }
}

/// The bulk class (the default): a share of each backend's slots, kept off full KV caches.
fn bulk_class(y: &mut String, k: &GpulbKnobs) {
    let _ = writeln!(y, "  - name: bulk");
    let _ = writeln!(y, "    pool: fleet");
    comment(
        y,
        &[
            "Bulk is placed on a worker only while fewer than this share of its",
            "max_outstanding slots are taken (by any class): the rest is kept for",
            "interactive. Classes are dispatched in order, so freed slots go to the",
            "interactive queue first.",
        ],
    );
    let _ = writeln!(y, "    backend_share: {}", k.bulk_share);
    placement(
        y,
        &k.bulk_placement,
        "earliest_finish",
        &[
            "The fastest worker with a free slot, by measured service time; a long",
            "job waits for a fast worker rather than start on the half-speed one when",
            "the fast ones are expected to free a slot sooner than it would finish.",
        ],
    );
    if k.bulk_guard_kv >= 0.0 {
        comment(
            y,
            &[
                "No new bulk job on a worker whose KV cache is fuller than this: a long job",
                "that does not fit waits at the head of the worker's FIFO and blocks",
                "everything behind it (the half-KV gpu2 otherwise).",
            ],
        );
        let _ = writeln!(y, "    guards: {{max_kv_cache: {}}}", k.bulk_guard_kv);
    }
    let _ = writeln!(
        y,
        "    queue: {{max_depth: 1024, max_wait: {}}}",
        k.bulk_max_wait
    );
}

/// A class's `placement` (none written for the default, least_loaded), explained by `why`
/// when it is the class's `explained` choice.
fn placement(y: &mut String, placement: &str, explained: &str, why: &[&str]) {
    if placement == explained {
        comment(y, why);
    }
    if placement != "least_loaded" {
        let _ = writeln!(y, "    placement: {placement}");
    }
}

/// Writes `lines` as YAML comments at class-key indentation.
fn comment(y: &mut String, lines: &[&str]) {
    for line in lines {
        let _ = writeln!(y, "    # {line}");
    }
}

/// nginx's temporary directories, each kept inside the run directory.
const NGINX_TEMP_DIRS: [&str; 5] = ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"];

fn nginx_config(s: &Setup, least_conn: bool) -> String {
    let d = s.dir.display();
    let mut c = String::new();
    let _ = writeln!(
        c,
        "# nginx config generated by examples/bench_routing; run as"
    );
    let _ = writeln!(c, "#   nginx -p DIR -c DIR/nginx-*.conf -g 'daemon off;'");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let _ = writeln!(c, "user root;");
    }
    let _ = writeln!(c, "worker_processes {};", s.threads);
    let _ = writeln!(c, "pid {d}/nginx.pid;");
    let _ = writeln!(c, "error_log {d}/nginx-error.log warn;");
    let _ = writeln!(c, "events {{ worker_connections 8192; }}");
    let _ = writeln!(c, "http {{");
    let _ = writeln!(c, "    access_log off;");
    for t in NGINX_TEMP_DIRS {
        let _ = writeln!(c, "    {t}_temp_path {d}/{t}_temp;");
    }
    let _ = writeln!(c, "    upstream fleet {{");
    if least_conn {
        let _ = writeln!(c, "        least_conn;");
    }
    for (i, w) in s.workers.iter().enumerate() {
        let weight = s
            .weight(i)
            .map_or(String::new(), |v| format!(" weight={v}"));
        let _ = writeln!(c, "        server {w}{weight};");
    }
    let _ = writeln!(c, "        keepalive 64;");
    let _ = writeln!(c, "    }}");
    let _ = writeln!(c, "    server {{");
    let _ = writeln!(c, "        listen 127.0.0.1:{};", s.listen_port);
    let _ = writeln!(c, "        client_max_body_size 1m;");
    let _ = writeln!(c, "        location / {{");
    let _ = writeln!(c, "            proxy_pass http://fleet;");
    let _ = writeln!(c, "            proxy_http_version 1.1;");
    let _ = writeln!(c, "            proxy_set_header Connection \"\";");
    let _ = writeln!(c, "            proxy_buffering off;");
    let _ = writeln!(c, "            proxy_request_buffering off;");
    let _ = writeln!(c, "            proxy_read_timeout 300s;");
    let _ = writeln!(c, "            proxy_send_timeout 300s;");
    let _ = writeln!(c, "        }}");
    let _ = writeln!(c, "    }}");
    let _ = writeln!(c, "}}");
    c
}

fn haproxy_config(s: &Setup, target: Target) -> String {
    let mut c = String::new();
    let _ = writeln!(
        c,
        "# HAProxy config generated by examples/bench_routing; run as haproxy -db -f FILE"
    );
    let _ = writeln!(c, "# No \"log\" line: logging is off.");
    let _ = writeln!(c, "global");
    let _ = writeln!(c, "    nbthread {}", s.threads);
    let _ = writeln!(c, "    maxconn 8192");
    if s.reloads {
        let _ = writeln!(
            c,
            "    # Seamless reload: the new worker takes the listening sockets from the old one."
        );
        let _ = writeln!(
            c,
            "    stats socket {}/haproxy.sock mode 600 level admin expose-fd listeners",
            s.dir.display()
        );
    }
    let _ = writeln!(c, "defaults");
    let _ = writeln!(c, "    mode http");
    let _ = writeln!(c, "    option http-keep-alive");
    let _ = writeln!(c, "    option http-no-delay");
    let _ = writeln!(c, "    timeout connect 2s");
    let _ = writeln!(c, "    timeout client 300s");
    let _ = writeln!(c, "    timeout server 300s");
    let _ = writeln!(c, "    timeout queue 300s");
    let _ = writeln!(c, "    timeout http-keep-alive 60s");
    let _ = writeln!(c, "frontend bench");
    let _ = writeln!(c, "    bind 127.0.0.1:{}", s.listen_port);
    if target == Target::HaproxyPrio {
        let _ = writeln!(
            c,
            "    http-request set-priority-class int(-10) if {{ req.hdr(x-priority) -m str interactive }}"
        );
    }
    let _ = writeln!(c, "    default_backend fleet");
    let _ = writeln!(c, "backend fleet");
    let balance = if target == Target::HaproxyRr {
        "roundrobin"
    } else {
        "leastconn"
    };
    let _ = writeln!(c, "    balance {balance}");
    let _ = writeln!(c, "    option httpchk GET /health");
    let maxconn = if target == Target::HaproxyPrio {
        format!(" maxconn {}", s.prio_maxconn)
    } else {
        String::new()
    };
    for (i, w) in s.workers.iter().enumerate() {
        let weight = s
            .weight(i)
            .map_or(String::new(), |v| format!(" weight {v}"));
        let _ = writeln!(c, "    server gpu{i} {w} check inter 1s{weight}{maxconn}");
    }
    c
}

/// Writes the target's config into the run directory and starts it.
pub fn start(
    target: Target,
    s: &Setup,
    gpulb_bin: &Path,
    replica: usize,
) -> Result<(ChildGuard, PathBuf), String> {
    let name = match target.replicas() {
        1 => target.name().to_string(),
        _ => format!("{}-{replica}", target.name()),
    };
    let log = s.dir.join(format!("{name}.log"));
    let (cmd, config_path) = match target {
        Target::Gpulb
        | Target::GpulbBody
        | Target::GpulbUnread
        | Target::GpulbSame
        | Target::GpulbPrefix
        | Target::GpulbLeastLoaded
        | Target::GpulbReplicas2
        | Target::GpulbReplicas3
        | Target::GpulbReplicas2Blind => {
            let classify = match target {
                Target::GpulbBody => Classify::Body,
                Target::GpulbUnread => Classify::HeaderUnread,
                _ => Classify::Header,
            };
            let path = s.dir.join(format!("{name}.yaml"));
            let mut knobs = s.gpulb.clone();
            if let Some(p) = target.forced_placement() {
                knobs.interactive_placement = p.to_string();
            }
            knobs.count_others &= target != Target::GpulbReplicas2Blind;
            let setup = Setup {
                gpulb: &knobs,
                ..*s
            };
            write(&path, &gpulb_config(&setup, classify)?)?;
            let mut cmd = Command::new(gpulb_bin);
            cmd.arg("serve").arg("--config").arg(&path);
            cmd.env(reloader::TOKEN_ENV, reloader::TOKEN);
            cmd.env(
                "RUST_LOG",
                std::env::var("GPULB_LOG").unwrap_or_else(|_| "warn".into()),
            );
            (cmd, path)
        }
        Target::NginxRr | Target::NginxLc => {
            let path = s.dir.join(format!("{name}.conf"));
            write(&path, &nginx_config(s, target == Target::NginxLc))?;
            for t in NGINX_TEMP_DIRS {
                let _ = std::fs::create_dir_all(s.dir.join(format!("{t}_temp")));
            }
            let mut cmd = Command::new("nginx");
            cmd.arg("-p")
                .arg(s.dir)
                .arg("-c")
                .arg(&path)
                .arg("-g")
                .arg("daemon off;");
            (cmd, path)
        }
        Target::HaproxyRr | Target::HaproxyLc | Target::HaproxyPrio => {
            let path = s.dir.join(format!("{name}.cfg"));
            write(&path, &haproxy_config(s, target))?;
            let mut cmd = Command::new("haproxy");
            if s.reloads {
                // Master-worker: SIGUSR2 to the master re-reads the file and starts new
                // workers; the old ones finish their connections. -S: the master CLI.
                cmd.arg("-W")
                    .arg("-S")
                    .arg(s.dir.join(format!("{name}-master.sock")));
            }
            cmd.arg("-db").arg("-f").arg(&path);
            (cmd, path)
        }
        Target::SglangCacheAware => sglang_command(s)?,
    };
    let child = ChildGuard::spawn(&name, cmd, &log)
        .map_err(|e| format!("cannot start {name}: {e} (is it installed?)"))?;
    Ok((child, config_path))
}

/// How `--reload-every` reloads `target` started as process group `pid` (admin listener on
/// `admin_port` for gpulb): the config line it switches back and forth (a real change) and
/// the trigger. `None`: the target cannot be reloaded by this harness.
pub fn reload_how(
    target: Target,
    pid: i32,
    admin_port: u16,
) -> Option<((&'static str, &'static str), Trigger)> {
    if target.replicas() != 1 {
        return None;
    }
    match target {
        _ if target.is_gpulb() => Some((
            // Both class queues' depth: a class change, so a new snapshot is built.
            ("max_depth: 1024", "max_depth: 1023"),
            Trigger::Admin(([127, 0, 0, 1], admin_port).into()),
        )),
        // What `nginx -s reload` does: SIGHUP to the master (pid from nginx.pid).
        Target::NginxRr | Target::NginxLc => Some((
            ("keepalive 64;", "keepalive 63;"),
            Trigger::Signal {
                pid,
                signal: libc::SIGHUP,
            },
        )),
        Target::HaproxyRr | Target::HaproxyLc | Target::HaproxyPrio => Some((
            ("timeout http-keep-alive 60s", "timeout http-keep-alive 59s"),
            Trigger::Signal {
                pid,
                signal: libc::SIGUSR2,
            },
        )),
        _ => None,
    }
}

/// The SGLang router on the listen port (its Prometheus exporter on the admin port), cache-aware
/// policy, every worker; the command line is written to the run directory as its "config".
fn sglang_command(s: &Setup) -> Result<(Command, PathBuf), String> {
    let (program, lead) = s
        .sglang_router
        .split_first()
        .ok_or("--sglang-router is empty")?;
    let mut args: Vec<String> = lead.to_vec();
    args.extend(
        [
            "--host",
            "127.0.0.1",
            "--port",
            &s.listen_port.to_string(),
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            &s.admin_port.to_string(),
            "--policy",
            "cache_aware",
            "--worker-urls",
        ]
        .map(String::from),
    );
    args.extend(s.workers.iter().map(|w| format!("http://{w}")));
    let path = s.dir.join("sglang-cache-aware.cmd");
    write(&path, &format!("{program} {}\n", args.join(" ")))?;
    let mut cmd = Command::new(program);
    cmd.args(&args);
    Ok((cmd, path))
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpulb::config::Config;

    fn knobs() -> GpulbKnobs {
        GpulbKnobs {
            max_outstanding: 8,
            bulk_share: 0.75,
            bulk_placement: "earliest_finish".into(),
            interactive_placement: "speed_weighted".into(),
            interactive_max_wait: "10s".into(),
            bulk_max_wait: "120s".into(),
            telemetry_interval: "200ms".into(),
            max_server_queue: -1.0,
            interactive_guard_queue: 1.0,
            interactive_guard_kv: 0.9,
            bulk_guard_kv: 0.75,
            access_log: false,
            body_match: "{stream: true, max_tokens: {max: 100}}".into(),
            template: None,
            count_others: true,
            waiting_interval: "50ms".into(),
        }
    }

    /// A run's setup over `workers`, with or without reloads.
    fn setup<'a>(k: &'a GpulbKnobs, workers: &'a [String], reloads: bool) -> Setup<'a> {
        Setup {
            dir: Path::new("/tmp"),
            listen_port: 8080,
            admin_port: 8081,
            workers,
            threads: 1,
            gpulb: k,
            prio_maxconn: 8,
            weights: None,
            sglang_router: &[],
            reloads,
        }
    }

    /// The generated config for `classify`, loaded by gpulb's own parser and validator.
    fn loaded(classify: Classify) -> Config {
        let k = knobs();
        let workers = ["127.0.0.1:9001".to_string(), "127.0.0.1:9002".to_string()];
        let s = setup(&k, &workers, false);
        let text = gpulb_config(&s, classify).unwrap();
        Config::from_yaml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    #[test]
    fn header_config_matches_interactive_by_header_only() {
        let c = loaded(Classify::Header);
        let m = &c.classes[0].matcher;
        assert_eq!(c.classes[0].name, "interactive");
        assert_eq!(m.headers.get("x-priority").unwrap(), "interactive");
        assert_eq!((m.stream, m.max_tokens), (None, None));
    }

    #[test]
    fn body_config_matches_interactive_by_body_only() {
        let c = loaded(Classify::Body);
        let m = &c.classes[0].matcher;
        assert_eq!(c.classes[0].name, "interactive");
        assert!(m.headers.is_empty());
        assert_eq!(m.stream, Some(true));
        let max_tokens = m.max_tokens.unwrap();
        // The trace's interactive sizes (16-64) are in, its bulk ones (128-384) out.
        assert!(max_tokens.contains(64) && !max_tokens.contains(128));
    }

    #[test]
    fn unread_config_turns_body_reading_off_and_keeps_the_header_rule() {
        let c = loaded(Classify::HeaderUnread);
        assert!(c.request_body.paths.is_empty());
        assert_eq!(
            c.classes[0].matcher.headers.get("x-priority").unwrap(),
            "interactive"
        );
        assert!(!loaded(Classify::Header).request_body.paths.is_empty());
    }

    #[test]
    fn every_reloadable_config_holds_the_setting_its_reload_switches() {
        let k = knobs();
        let workers = ["127.0.0.1:9001".to_string()];
        let s = setup(&k, &workers, true);
        for (name, text) in [
            ("gpulb", gpulb_config(&s, Classify::Header).unwrap()),
            ("nginx-lc", nginx_config(&s, true)),
            ("haproxy-lc", haproxy_config(&s, Target::HaproxyLc)),
        ] {
            let target = Target::parse(name).unwrap();
            let ((from, to), _) = reload_how(target, 1, 8081).unwrap();
            assert!(text.contains(from), "{name}: no {from:?}");
            assert_ne!(from, to);
        }
        assert!(haproxy_config(&s, Target::HaproxyLc).contains("expose-fd listeners"));
        assert!(gpulb_config(&s, Classify::Header)
            .unwrap()
            .contains(reloader::TOKEN_ENV));
        // The switched gpulb config still loads (without the token, whose variable only the
        // started gpulb has).
        let text = gpulb_config(
            &Setup {
                reloads: false,
                ..s
            },
            Classify::Header,
        )
        .unwrap();
        let ((from, to), _) = reload_how(Target::Gpulb, 1, 8081).unwrap();
        Config::from_yaml(&text.replace(from, to)).unwrap();
        assert!(reload_how(Target::GpulbReplicas2, 1, 8081).is_none());
        assert!(reload_how(Target::SglangCacheAware, 1, 8081).is_none());
    }

    #[test]
    fn only_gpulb_body_drops_the_priority_header() {
        for t in ["gpulb", "gpulb-body", "nginx-lc", "haproxy-prio"] {
            let t = Target::parse(t).unwrap();
            assert_eq!(t.priority_header(), t != Target::GpulbBody, "{t:?}");
        }
        assert!(Target::parse("gpulb-body").unwrap().is_gpulb());
        assert!(!Target::parse("haproxy-lc").unwrap().is_gpulb());
    }
}
