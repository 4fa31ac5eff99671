-- wrk script for examples/bench_overhead.sh: POST a small OpenAI-style completion request and,
-- when the run ends, print one machine-readable line with the exact figures (microseconds).
wrk.method = "POST"
wrk.body = '{"model":"bench","prompt":"Say ok.","max_tokens":1,"stream":false}'
wrk.headers["Content-Type"] = "application/json"

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "BENCH_RESULT requests=%d duration_us=%d p50_us=%d p99_us=%d mean_us=%.1f " ..
    "err_connect=%d err_read=%d err_write=%d err_status=%d err_timeout=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    latency.mean, e.connect, e.read, e.write, e.status, e.timeout))
end
