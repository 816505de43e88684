-- wrk script for make bench: POST /v1/acquire, a fresh key per request, or one of HOT_KEYS
-- fixed keys. Env: IDEMGATE_API_KEY (bearer), HOT_KEYS.
local counter = 0
local nthreads = 0
local nonce = os.time() % 65536
local token = os.getenv("IDEMGATE_API_KEY") or ""
local hot = tonumber(os.getenv("HOT_KEYS") or "0")

function setup(thread)
  thread:set("tid", nthreads)
  nthreads = nthreads + 1
end

function request()
  counter = counter + 1
  local key = string.format("s-%04x-%04x-%08x", nonce, tid, counter)
  if hot > 0 then key = "hot-" .. (counter % hot) end
  return wrk.format("POST", "/v1/acquire",
    { ["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. token },
    '{"key":"' .. key .. '","ttl_seconds":3600}')
end
