-- wrk POST script: OpenAI Responses (POST /v1/responses). See common.lua for the env.
local dir = os.getenv("BENCH_WRK_DIR") or "bench/wrk"
local c = dofile(dir .. "/common.lua")
local stream = c.stream() and "true" or "false"
c.setup_request(string.format(
  '{"model": "%s", "stream": %s, "max_output_tokens": 64, '
    .. '"instructions": "You are a terse assistant.", '
    .. '"input": [{"role": "user", "content": "Say hello in one short sentence."}]}',
  c.model(), stream))
done = c.done
