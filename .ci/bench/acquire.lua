-- wrk script for .ci/bench/compare.sh: POST /v1/acquire in idemgate's request shape, sent alike to
-- idemgate and to the floor server. By default every request is a new key (spread over the key
-- space the way random UUIDs are). Env:
--   IDEMGATE_API_KEY  bearer token (the floor uses it only as the scope)
--   DUP_EVERY=N       N requests in a row share a key: one admission, N-1 duplicates
--   HOT_KEYS=N        every request is one of N fixed keys (a retry storm; 1 = one hot key)
local sent = 0
local threads = 0
local run = os.time() % 65536
local token = os.getenv("IDEMGATE_API_KEY") or "floor"
local dup = tonumber(os.getenv("DUP_EVERY") or "0")
local hot = tonumber(os.getenv("HOT_KEYS") or "0")

function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end

function request()
  sent = sent + 1
  local n = sent
  if dup > 0 then n = sent - (sent % dup) end
  -- Knuth's multiplicative hash scatters consecutive numbers over the B-tree, as random keys do.
  local spread = (n * 2654435761) % 4294967296
  local key = string.format("%08x-%04x-4000-8000-%04x%08x", spread, tid, run, n)
  if hot > 0 then key = "hot-" .. (sent % hot) end
  return wrk.format("POST", "/v1/acquire",
    { ["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. token },
    '{"key":"' .. key .. '","ttl_seconds":3600}')
end
