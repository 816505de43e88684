-- wrk script for make bench: POST /v1/acquire:batch with BATCH (default 100) fresh keys per
-- request. Env: IDEMGATE_API_KEY (bearer), BATCH.
local counter = 0
local nthreads = 0
local nonce = os.time() % 65536
local token = os.getenv("IDEMGATE_API_KEY") or ""
local size = tonumber(os.getenv("BATCH") or "100")

function setup(thread)
  thread:set("tid", nthreads)
  nthreads = nthreads + 1
end

function request()
  local items = {}
  for i = 1, size do
    counter = counter + 1
    items[i] = string.format('{"key":"b-%04x-%04x-%08x","ttl_seconds":3600}', nonce, tid, counter)
  end
  return wrk.format("POST", "/v1/acquire:batch",
    { ["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. token },
    '{"items":[' .. table.concat(items, ",") .. ']}')
end
