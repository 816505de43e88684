-- wrk script for make bench's proxy rows: POST /charges/bench with a fresh Idempotency-Key per
-- request, or, with REPLAY=1, one key per wrk thread sent again and again (after its first
-- request every one is a replay). Sent the same to the upstream alone and through
-- `idemgate proxy`, so the two rates compare.
local counter = 0
local nthreads = 0
local nonce = os.time() % 65536
local replay = os.getenv("REPLAY") == "1"

function setup(thread)
  thread:set("tid", nthreads)
  nthreads = nthreads + 1
end

function request()
  counter = counter + 1
  local key = string.format("p-%04x-%04x-%08x", nonce, tid, counter)
  if replay then key = string.format("r-%04x-%04x", nonce, tid) end
  return wrk.format("POST", "/charges/bench",
    { ["Content-Type"] = "application/json", ["Idempotency-Key"] = key },
    '{"amount":1200}')
end
