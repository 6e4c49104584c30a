-- wrk POST script: Chat Completions (POST /v1/chat/completions). See common.lua for the env.
local dir = os.getenv("BENCH_WRK_DIR") or "bench/wrk"
local c = dofile(dir .. "/common.lua")
local stream = c.stream() and "true" or "false"
c.setup_request(string.format(
  '{"model": "%s", "stream": %s, "max_tokens": 64, "messages": ['
    .. '{"role": "system", "content": "You are a terse assistant."}, '
    .. '{"role": "user", "content": "Say hello in one short sentence."}]}',
  c.model(), stream))
done = c.done
