-- Shared by chat.lua and responses.lua (loaded with dofile; run wrk from the repo root or set
-- BENCH_WRK_DIR). Environment:
--   BENCH_MODEL   model name sent upstream ("m", "combo/bench", ...)
--   BENCH_STREAM  "1" for "stream": true
--   BENCH_KEY     bearer token (optional)
-- done() prints one line `BENCHJSON {...}` with the latency percentiles (microseconds),
-- request/error counts and the non-2xx count, parsed by bench/run.py.
local M = {}

function M.setup_request(body)
  wrk.method = "POST"
  wrk.body = body
  wrk.headers["Content-Type"] = "application/json"
  local key = os.getenv("BENCH_KEY")
  if key and key ~= "" then
    wrk.headers["Authorization"] = "Bearer " .. key
  end
end

function M.model()
  return os.getenv("BENCH_MODEL") or "m"
end

function M.stream()
  return os.getenv("BENCH_STREAM") == "1"
end

function M.done(summary, latency, requests)
  local p = {}
  for _, q in ipairs({50, 90, 99, 99.9}) do
    p[#p + 1] = string.format('"p%s": %d', tostring(q), latency:percentile(q))
  end
  local e = summary.errors
  io.write(string.format(
    'BENCHJSON {"requests": %d, "duration_us": %d, "bytes": %d, %s, "mean": %.1f, "max": %d, '
      .. '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}}\n',
    summary.requests, summary.duration, summary.bytes, table.concat(p, ", "),
    latency.mean, latency.max, e.connect, e.read, e.write, e.status, e.timeout))
end

return M
