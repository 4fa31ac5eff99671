//! Logging setup keeps disabled levels cheap: the global level hint is what the filters allow,
//! so pingora's `debug!`/`trace!` records are skipped at the call site.

use tracing::level_filters::LevelFilter;

#[test]
fn level_hint_follows_the_filters_with_the_access_log_on() {
    std::env::remove_var("RUST_LOG");
    gpulb::access_log::init(Some(gpulb::access_log::AccessLogFormat::Json));
    assert_eq!(LevelFilter::current(), LevelFilter::INFO);
    assert!(!tracing::enabled!(tracing::Level::DEBUG));
}
