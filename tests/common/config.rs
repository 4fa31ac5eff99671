//! A small typed builder for the config the tests serve: backends, pools and classes, written
//! as YAML flow maps. Odd YAML tested on purpose is passed to [`Proxy`](super::Proxy) as a
//! string instead.

use gpulb::tools::sim::SimWorker;
use std::fmt::{self, Display};

/// Ordered `key: value` pairs written as a YAML flow map; values are YAML as given.
#[derive(Clone, Debug, Default)]
struct Map(Vec<(String, String)>);

impl Map {
    /// A map whose first key is `name`.
    fn named(name: &str) -> Map {
        let mut map = Map::default();
        map.set("name", name);
        map
    }

    /// Sets `key` (replacing it where already set).
    fn set(&mut self, key: &str, value: impl Display) {
        let value = value.to_string();
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value,
            None => self.0.push((key.into(), value)),
        }
    }
}

impl Display for Map {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pairs: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        write!(f, "{{{}}}", pairs.join(", "))
    }
}

/// A whole config body (everything but `listen` and `admin`, which [`Proxy`](super::Proxy)
/// adds).
#[derive(Clone, Debug, Default)]
pub struct Config {
    top: Map,
    backends: Vec<Backend>,
    pools: Vec<Pool>,
    classes: Vec<Class>,
}

impl Config {
    /// An empty config.
    pub fn new() -> Config {
        Config::default()
    }

    /// Every worker as a backend named after it.
    pub fn fleet(workers: &[SimWorker]) -> Config {
        workers
            .iter()
            .fold(Config::new(), |c, w| c.backend(Backend::of(w)))
    }

    /// Like [`Config::fleet`], each worker read for GPU telemetry (its dcgm page) and vLLM
    /// `/metrics` every 100 ms, with fast health checks (100 ms, one failure marks it unhealthy).
    pub fn telemetry_fleet(workers: &[SimWorker]) -> Config {
        Config::fleet(workers)
            .set("health_check", "{interval: 100ms, timeout: 200ms, fall: 1}")
            .each_backend(|b| {
                let url = b.url.clone();
                b.dcgm(&url).vllm()
            })
    }

    /// A top-level key with its YAML value as written (`health_check`, `{interval: 100ms}`).
    pub fn set(mut self, key: &str, value: impl Display) -> Config {
        self.top.set(key, value);
        self
    }

    /// Adds a backend.
    pub fn backend(mut self, backend: Backend) -> Config {
        self.backends.push(backend);
        self
    }

    /// Reshapes every backend added so far; `f` gets each with its position.
    pub fn each_backend_at(mut self, f: impl Fn(usize, Backend) -> Backend) -> Config {
        self.backends = self
            .backends
            .into_iter()
            .enumerate()
            .map(|(i, b)| f(i, b))
            .collect();
        self
    }

    /// Reshapes every backend added so far.
    pub fn each_backend(self, f: impl Fn(Backend) -> Backend) -> Config {
        self.each_backend_at(|_, b| f(b))
    }

    /// Adds a pool.
    pub fn pool(mut self, pool: Pool) -> Config {
        self.pools.push(pool);
        self
    }

    /// Adds a class.
    pub fn class(mut self, class: Class) -> Config {
        self.classes.push(class);
        self
    }

    /// The class of requests no class matches.
    pub fn default_class(self, name: &str) -> Config {
        self.set("default_class", name)
    }
}

impl Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (key, value) in &self.top.0 {
            writeln!(f, "{key}: {value}")?;
        }
        let lists: [(&str, Vec<&Map>); 3] = [
            ("backends", self.backends.iter().map(|b| &b.keys).collect()),
            ("pools", self.pools.iter().map(|p| &p.0).collect()),
            ("classes", self.classes.iter().map(|c| &c.keys).collect()),
        ];
        for (name, items) in lists.iter().filter(|(_, items)| !items.is_empty()) {
            writeln!(f, "{name}:")?;
            for item in items {
                writeln!(f, "  - {item}")?;
            }
        }
        Ok(())
    }
}

/// One entry of `backends:`.
#[derive(Clone, Debug)]
pub struct Backend {
    url: String,
    keys: Map,
    telemetry: Vec<String>,
}

impl Backend {
    /// Backend `name` at `url`.
    pub fn at(name: &str, url: &str) -> Backend {
        let mut keys = Map::named(name);
        keys.set("url", format!("\"{url}\""));
        Backend {
            url: url.into(),
            keys,
            telemetry: Vec::new(),
        }
    }

    /// A simulated worker, named as it is.
    pub fn of(worker: &SimWorker) -> Backend {
        Backend::at(worker.name(), &worker.url())
    }

    /// Any key, its YAML value as written.
    pub fn set(mut self, key: &str, value: impl Display) -> Backend {
        self.keys.set(key, value);
        self
    }

    /// Relative capacity.
    pub fn weight(self, weight: u32) -> Backend {
        self.set("weight", weight)
    }

    /// In-flight cap.
    pub fn max_outstanding(self, cap: u32) -> Backend {
        self.set("max_outstanding", cap)
    }

    /// No active health checks: always counted healthy unless ejected.
    pub fn unchecked(self) -> Backend {
        self.set("health_check", "{enabled: false}")
    }

    /// Reads its GPUs from the dcgm page of the simulated worker at `base_url`, every 100 ms.
    pub fn dcgm(mut self, base_url: &str) -> Backend {
        self.telemetry.push(format!(
            "{{kind: dcgm, url: \"{base_url}/dcgm/metrics\", interval: 100ms}}"
        ));
        self.with_telemetry()
    }

    /// Reads its own vLLM `/metrics` every 100 ms.
    pub fn vllm(mut self) -> Backend {
        self.telemetry
            .push("{kind: model_server, server: vllm, interval: 100ms}".into());
        self.with_telemetry()
    }

    fn with_telemetry(mut self) -> Backend {
        let list = format!("[{}]", self.telemetry.join(", "));
        self.keys.set("telemetry", list);
        self
    }
}

/// One entry of `pools:`.
#[derive(Clone, Debug)]
pub struct Pool(Map);

impl Pool {
    /// Pool `name` of these backends.
    pub fn new(name: &str, backends: &[&str]) -> Pool {
        let mut keys = Map::named(name);
        keys.set("backends", format!("[{}]", backends.join(", ")));
        Pool(keys)
    }

    /// A key with its YAML value as written (`auth`, `{token_file: /k}`).
    pub fn set(mut self, key: &str, value: impl Display) -> Pool {
        self.0.set(key, value);
        self
    }

    /// Guard: a backend whose GPU memory use is above `fraction` takes no new requests.
    pub fn max_gpu_memory(mut self, fraction: f64) -> Pool {
        self.0
            .set("guards", format!("{{max_gpu_memory: {fraction}}}"));
        self
    }
}

/// One entry of `classes:`.
#[derive(Clone, Debug)]
pub struct Class {
    keys: Map,
    queue: Map,
    matcher: Map,
}

impl Class {
    /// Class `name` served by pool `pool` (`default` is every backend).
    pub fn new(name: &str, pool: &str) -> Class {
        let mut keys = Map::named(name);
        keys.set("pool", pool);
        Class {
            keys,
            queue: Map::default(),
            matcher: Map::default(),
        }
    }

    /// Any key, its YAML value as written.
    pub fn set(mut self, key: &str, value: impl Display) -> Class {
        self.keys.set(key, value);
        self
    }

    /// In-flight cap of the class.
    pub fn max_outstanding(self, cap: u32) -> Class {
        self.set("max_outstanding", cap)
    }

    /// In-flight cap per tenant.
    pub fn tenant_max_outstanding(self, cap: u32) -> Class {
        self.set("tenant_max_outstanding", cap)
    }

    /// Share of each backend's slots the class may take.
    pub fn backend_share(self, share: f64) -> Class {
        self.set("backend_share", share)
    }

    /// Pool it spills onto when its own is full.
    pub fn fallback_pool(self, pool: &str) -> Class {
        self.set("fallback_pool", pool)
    }

    /// How it places requests (`least_loaded`, `speed_weighted`, `earliest_finish`).
    pub fn placement(self, placement: &str) -> Class {
        self.set("placement", placement)
    }

    /// Fairness between tenants, as YAML (`{policy: equal_share}`).
    pub fn fairness(self, fairness: &str) -> Class {
        self.set("fairness", fairness)
    }

    /// Longest queue; 0 sheds at once when full.
    pub fn max_depth(mut self, depth: u32) -> Class {
        self.queue.set("max_depth", depth);
        let queue = self.queue.clone();
        self.set("queue", queue)
    }

    /// Longest wait in the queue (`300ms`).
    pub fn max_wait(mut self, wait: &str) -> Class {
        self.queue.set("max_wait", wait);
        let queue = self.queue.clone();
        self.set("queue", queue)
    }

    /// Matches paths starting with `prefix`.
    pub fn match_path(self, prefix: &str) -> Class {
        self.matching("path_prefix", prefix)
    }

    /// Matches requests with header `name: value`.
    pub fn match_header(self, name: &str, value: &str) -> Class {
        self.matching("headers", format!("{{{name}: {value}}}"))
    }

    /// Matches bodies of at least `bytes`.
    pub fn match_min_content_length(self, bytes: u64) -> Class {
        self.matching("min_content_length", bytes)
    }

    /// Matches on any `match` key, its YAML value as written (`stream`, `true`).
    pub fn matching(mut self, key: &str, value: impl Display) -> Class {
        self.matcher.set(key, value);
        let matcher = self.matcher.clone();
        self.set("match", matcher)
    }
}
